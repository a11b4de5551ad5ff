"""The library's loop (``mage.run.train``) where a run stops, resumes, is shortened or is
named again under other settings: what it leaves must be what an uninterrupted run leaves."""

from __future__ import annotations

import json
import sys

import pytest

from mage.models import checkpoint as ckpt
from mage.run import RunLayout, train
from mage.run.layout import evaluation_dir
from mage.settings import load_settings

pytestmark = pytest.mark.e2e


def run(model_dir, root, *extra: str):
    return load_settings([
        f"model.path={model_dir}", "model.build=null", "train.iterations=4", "train.learning_rate=1e-3",
        "train.mini_batch_size=8", "engine.groups=2", "engine.group_size=2", "engine.episodes=2",
        "engine.sampling.max_new_tokens=6", "eval.meta_episodes=2", "eval.sampling.max_new_tokens=6",
        f"paths.artifacts={root}", f"paths.results={root}/results", *extra,
    ])


def records(path) -> list[str]:
    return path.read_text().splitlines()


def live_steps(settings) -> list[str]:
    from pathlib import Path

    table = Path(settings.paths.live) / "plots" / "metrics" / "train" / "kl.tsv"
    return [line.split("\t")[0] for line in table.read_text().splitlines()[1:]]


def test_a_stopped_run_resumes_to_what_an_uninterrupted_one_leaves(tiny_model_dir, tmp_path, monkeypatch):
    """Checkpointed every 2 iterations and evaluated every 2: stopped after iteration 3 (whose
    lines were written, past the newest checkpoint), then stopped again in iteration 4's
    evaluation, the run resumes twice and ends where an uninterrupted run ends: the same
    metrics.jsonl, weights and evaluation tables, each dvclive step once."""
    extra = ("train.checkpoint_every=2", "train.eval_every=2")
    whole = run(tiny_model_dir, tmp_path / "whole", *extra)
    stderr = sys.stderr
    assert train(whole, progress=False).iterations == [1, 2, 3, 4]
    assert sys.stderr is stderr  # dvclive's DVC logging replaces the process's streams: put back

    parts = run(tiny_model_dir, tmp_path / "parts", *extra)
    assert train(parts, progress=False, stop_after=3).iterations == [1, 2, 3]
    layout = RunLayout.of(parts)
    assert [c.iteration for c in ckpt.list_checkpoints(layout.checkpoints)] == [2]
    assert len(records(layout.metrics)) == 3 and not layout.final.exists()

    import mage.run.steps as steps

    real = steps.evaluate
    monkeypatch.setattr(steps, "evaluate", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt("stopped")))
    with pytest.raises(KeyboardInterrupt):
        train(parts, progress=False)  # iteration 3 again, 4, then stopped in 4's evaluation
    monkeypatch.setattr(steps, "evaluate", real)
    assert not (evaluation_dir(parts, "ckpt-00004") / "held_out-metrics.json").exists()
    resumed = train(parts, progress=False)
    assert resumed.iterations == [] and set(resumed.evaluations) == {4}  # the evaluation it was stopped in

    for name in ("metrics.jsonl", "final.json"):
        assert (layout.root / name).read_bytes() == (RunLayout.of(whole).root / name).read_bytes(), name
    for iteration in (2, 4):
        name = f"ckpt-{iteration:05d}"
        assert (layout.checkpoints / name / "model.safetensors").read_bytes() == \
            (RunLayout.of(whole).checkpoints / name / "model.safetensors").read_bytes()
        for table in ("held_out.parquet", "held_out-metrics.json"):
            a, b = (evaluation_dir(s, name) / table for s in (parts, whole))
            assert (a.read_bytes() == b.read_bytes()) if table.endswith("parquet") else \
                json.loads(a.read_text())["final"] == json.loads(b.read_text())["final"]
    assert [json.loads(r)["iteration"] for r in records(layout.performance)] == [1, 2, 3, 4]
    assert live_steps(parts) == live_steps(whole) == ["1", "2", "3", "4"]


def test_a_shortened_run_keeps_the_longer_run_s_checkpoints_and_its_own(tiny_model_dir, tmp_path):
    """Shortened below every kept checkpoint (keep_checkpoints=1, so only iteration 4's was
    left), the run starts again and keeps what it writes; the longer run's checkpoint stays."""
    longer = run(tiny_model_dir, tmp_path, "train.keep_checkpoints=1")
    train(longer, progress=False)
    layout = RunLayout.of(longer)
    assert [c.iteration for c in ckpt.list_checkpoints(layout.checkpoints)] == [4]
    shorter = run(tiny_model_dir, tmp_path, "train.keep_checkpoints=1", "train.iterations=2")
    result = train(shorter, progress=False)
    assert result.iterations == [1, 2] and result.checkpoint.iteration == 2
    assert [c.iteration for c in ckpt.list_checkpoints(layout.checkpoints)] == [2, 4]
    assert json.loads(layout.final.read_text())["checkpoint"] == "checkpoints/ckpt-00002"


def test_smaller_micro_batches_resume_a_run_and_other_settings_move_it_aside(tiny_model_dir, tmp_path, caplog):
    first = run(tiny_model_dir, tmp_path, "train.iterations=1", "train.eval_every=1")
    train(first, progress=False)
    # what sets speed and memory is not what the run is: it resumes (nothing left to run)
    faster = run(tiny_model_dir, tmp_path, "train.iterations=1", "train.eval_every=1",
                 "train.micro_batch_tokens=512", "engine.hf.batch_size=3", "model.device=cpu")
    assert train(faster, progress=False).iterations == []
    # a learning rate is: the run and its evaluations are moved aside, named, and it starts again
    caplog.clear()
    other = run(tiny_model_dir, tmp_path, "train.iterations=1", "train.eval_every=1", "train.learning_rate=2e-3")
    assert train(other, progress=False).iterations == [1]
    root, evaluations = RunLayout.of(other).root, evaluation_dir(other, "ckpt").parent
    (kept_run,) = root.parent.glob(f"{root.name}.replaced-*")
    (kept_eval,) = evaluations.parent.glob(f"{evaluations.name}.replaced-*")
    assert (kept_run / "checkpoints" / "ckpt-00001").is_dir() and (kept_eval / "ckpt-00001").is_dir()
    (warning,) = [r.getMessage() for r in caplog.records if "was made with other settings" in r.getMessage()]
    assert "train.learning_rate: 0.001 -> 0.002" in warning and str(kept_run) in warning


def test_the_loop_takes_the_settings_its_steps_run(tiny_model_dir, tmp_path):
    from mage.run import Steps

    a, b = run(tiny_model_dir, tmp_path), run(tiny_model_dir, tmp_path)
    with pytest.raises(ValueError, match="run_steps runs other settings"):
        train(a, Steps(b))
