"""The flows under Prefect's test harness: the library's iterations, resume, caching, stale references, retries,
config errors.

Every flow runs for real (a temporary Prefect server, the real tasks, a small random model);
task states are read back from the Prefect API.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import polars as pl
import pytest
import torch
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentTaskRunId
from prefect.client.schemas.sorting import FlowRunSort, TaskRunSort
from safetensors.torch import load_file

from flows import evaluate, nightly_evaluation, train
from mage.models import checkpoint as ckpt
from mage.run import RunLayout, steps
from mage.run import train as library_train
from mage.run.layout import evaluation_dir
from mage.settings import SettingsError, load_settings
from tasks import worker

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("prefect_harness")]


@pytest.fixture(autouse=True)
def fresh_memory():
    worker.forget()
    yield
    worker.forget()


def overrides(model_dir: Path, artifacts: Path, *extra: str) -> list[str]:
    return [
        f"model.path={model_dir}", "model.build=null", "train.iterations=2", "train.learning_rate=1e-3",
        "train.mini_batch_size=8", "engine.groups=2", "engine.group_size=2", "engine.episodes=2",
        "engine.sampling.max_new_tokens=6", "eval.meta_episodes=4", "eval.sampling.max_new_tokens=6",
        f"paths.artifacts={artifacts}", f"paths.results={artifacts}/results", "flow.retry_delay_seconds=0.05", *extra,
    ]


def task_runs(state) -> dict[str, object]:
    """Task runs of a flow run (and of its sub-flow runs), by task run name."""
    flow_run_id = state.state_details.flow_run_id
    def of(client, run_id):
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])),
                                     sort=TaskRunSort.EXPECTED_START_TIME_ASC, limit=200)

    with get_client(sync_client=True) as client:
        runs = of(client, flow_run_id)
        found = {run.name: run for run in runs}
        children = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_task_run_id=FlowRunFilterParentTaskRunId(any_=[r.id for r in runs])),
            sort=FlowRunSort.START_TIME_ASC, limit=100,
        ) if runs else []
        for child in children:
            found |= {run.name: run for run in of(client, child.id)}
    return found


def state_names(state) -> dict[str, str]:
    return {name: run.state.name for name, run in task_runs(state).items()}


def final_weights(settings) -> dict[str, torch.Tensor]:
    latest = ckpt.latest_checkpoint(RunLayout.of(settings).checkpoints)
    return load_file(latest.path / "model.safetensors")


def run_files(settings) -> dict[str, bytes]:
    """What a run leaves that must repeat bitwise: its tables, its weights, metrics.jsonl and
    final.json, and the evaluation tables made on the way (relative path -> bytes)."""
    layout = RunLayout.of(settings)
    files = {"metrics.jsonl": layout.metrics.read_bytes(), "final.json": layout.final.read_bytes()}
    for path in sorted(layout.rollouts.glob("iteration-*.parquet")):
        files[f"rollouts/{path.name}"] = path.read_bytes()
    for path in sorted(layout.checkpoints.glob("ckpt-*/model.safetensors")):
        files[str(path.relative_to(layout.root))] = path.read_bytes()
    evaluations = evaluation_dir(settings, "ckpt").parent
    for path in sorted(evaluations.glob("ckpt-*/*.parquet")):
        files[f"eval/{path.relative_to(evaluations)}"] = path.read_bytes()
    return files


def test_the_flow_and_the_library_run_the_same_iterations(tiny_model_dir, tmp_path):
    # 3 iterations, checkpointed every 2 (and at the last), evaluated every 2: run by the flow
    # (each step a task) and by the library's loop in this process, they leave the same bytes.
    extra = ("train.iterations=3", "train.checkpoint_every=2", "train.eval_every=2")
    state = train(overrides(tiny_model_dir, tmp_path / "flow", *extra), return_state=True)
    assert state.is_completed()
    result = state.result()
    assert Path(result["checkpoint"]).name == "ckpt-00003" and set(result["evaluations"]) == {2}
    names = state_names(state)
    assert {f"{step}-{i}" for step in ("score", "update") for i in (1, 2, 3)} <= set(names)
    assert set(names) & {"checkpoint-2", "checkpoint-3"} == {"checkpoint-2", "checkpoint-3"}
    assert "checkpoint-1" not in names and names["evaluate-held_out"] == "Completed"

    direct = load_settings(overrides(tiny_model_dir, tmp_path / "direct", *extra))
    library = library_train(direct, progress=False)
    assert library.iterations == [1, 2, 3] and set(library.evaluations) == {2}
    flowed = load_settings(overrides(tiny_model_dir, tmp_path / "flow", *extra))
    layout = RunLayout.of(flowed)
    assert sorted(p.name for p in layout.checkpoints.iterdir()) == ["ckpt-00002", "ckpt-00003"]
    assert {p.name for p in evaluation_dir(flowed, "ckpt").parent.iterdir()} == {"ckpt-00002"}
    a, b = run_files(flowed), run_files(direct)
    assert a.keys() == b.keys() and len([k for k in a if k.startswith("eval/")]) == 1
    assert [name for name in a if a[name] != b[name]] == []
    lines = [json.loads(line) for line in layout.metrics.read_text().splitlines()]
    assert [m["iteration"] for m in lines] == [1, 2, 3] and all("train/kl" in m for m in lines)
    assert json.loads(layout.final.read_text())["checkpoint"] == "checkpoints/ckpt-00003"
    # what is measured (time, memory) is kept apart, one line per iteration too
    performance = [json.loads(line) for line in layout.performance.read_text().splitlines()]
    assert [p["iteration"] for p in performance] == [1, 2, 3] and all("train/seconds" in p for p in performance)
    # dvclive: one step per iteration, from the same records
    live = Path(flowed.paths.live) / "plots" / "metrics" / "train" / "kl.tsv"
    assert [line.split("\t")[0] for line in live.read_text().splitlines()] == ["step", "1", "2", "3"]


def test_behind_the_update_the_flow_and_the_library_run_the_same_iterations(tiny_model_dir, tmp_path):
    # train.max_staleness=1 on two shards: the flow plays each next rollout as tasks behind the
    # update (the shards taking turns on the copy of the weights), the library on its own thread
    extra = ("train.iterations=3", "train.max_staleness=1", "flow.rollout_shards=2")
    state = train(overrides(tiny_model_dir, tmp_path / "flow", *extra), return_state=True)
    assert state.is_completed()
    names = state_names(state)
    behind = {f"rollout-{k}-shard-{s}-behind" for k in (2, 3) for s in (0, 1)}
    assert behind <= set(names) and all(names[n] == "Completed" for n in behind)
    assert "rollout-1-shard-0" in names and "rollout-2-shard-0" not in names
    direct = load_settings(overrides(tiny_model_dir, tmp_path / "direct", *extra))
    assert library_train(direct, progress=False).iterations == [1, 2, 3]
    flowed = load_settings(overrides(tiny_model_dir, tmp_path / "flow", *extra))
    a, b = run_files(flowed), run_files(direct)
    assert a.keys() == b.keys() and [name for name in a if a[name] != b[name]] == []
    from mage.rollout import read_trajectories

    layout = RunLayout.of(flowed)
    assert [set(read_trajectories(layout.rollout(k))["policy_version"]) for k in (1, 2, 3)] == [{0}, {0}, {1}]


def test_a_second_run_resumes_and_a_longer_run_runs_only_what_it_adds(tiny_model_dir, tmp_path):
    args = overrides(tiny_model_dir, tmp_path)
    first = state_names(train(args, return_state=True))
    steps = {"rollout-1-shard-0", "score-1", "update-1", "rollout-2-shard-0", "score-2", "update-2"}
    assert {first[name] for name in steps} == {"Completed"}
    assert "prepare-model" in first  # (cached already if an earlier test used the same model)
    weights = final_weights(load_settings(args))

    second = state_names(train(args, return_state=True))
    assert set(second) == {"prepare-model"}, second  # every iteration is done: nothing runs again

    longer = state_names(train([*args, "train.iterations=3"], return_state=True))
    assert set(longer) == {"prepare-model", "rollout-3-shard-0", "score-3", "update-3", "checkpoint-3"}
    assert longer["rollout-3-shard-0"] == longer["score-3"] == longer["update-3"] == "Completed"
    # a run whose final checkpoint is gone goes on from the one before, to the same weights
    layout = RunLayout.of(load_settings(args))
    shutil.rmtree(layout.checkpoints / "ckpt-00003")
    shutil.rmtree(layout.checkpoints / "ckpt-00002")
    again = state_names(train(args, return_state=True))
    assert set(again) == {"prepare-model", "rollout-2-shard-0", "score-2", "update-2", "checkpoint-2"}
    after = final_weights(load_settings(args))
    assert after.keys() == weights.keys() and all(torch.equal(after[k], weights[k]) for k in after)


def test_a_run_name_under_other_settings_starts_again_and_keeps_the_old_run(tiny_model_dir, tmp_path, caplog):
    # The rollouts depend on algo.grouping: a second run of the same name with mixed groups plays
    # mixed groups, not the stationary run's rollouts; the first run is moved aside, not lost.
    def opponents_per_group(args) -> set[int]:
        table = pl.read_parquet(RunLayout.of(load_settings(args)).rollout(1))
        return set(table.group_by("group_id").agg(pl.col("opponent").n_unique())["opponent"].to_list())

    extra = ("train.iterations=1", "engine.groups=4", "engine.group_size=4")
    stationary = overrides(tiny_model_dir, tmp_path, *extra, "algo.grouping=stationary")
    train(stationary)
    assert opponents_per_group(stationary) == {1}
    mixed = overrides(tiny_model_dir, tmp_path, *extra, "algo.grouping=mixed")
    caplog.clear()
    names = state_names(train(mixed, return_state=True))
    assert names["rollout-1-shard-0"] == "Completed"
    assert max(opponents_per_group(mixed)) > 1
    root = RunLayout.of(load_settings(mixed)).root
    (kept,) = root.parent.glob(f"{root.name}.replaced-*")
    assert (kept / "checkpoints" / "ckpt-00001").is_dir()
    assert any("algo.grouping: 'stationary' -> 'mixed'" in r.getMessage() and str(kept) in r.getMessage()
               for r in caplog.records if r.levelname == "WARNING")


def test_a_cached_result_whose_file_is_gone_is_computed_again(tiny_model_dir, tmp_path, caplog):
    args = overrides(tiny_model_dir, tmp_path, "train.iterations=1")
    train(args)
    evaluate(args, split="held_out", report=False)
    table = evaluation_dir(load_settings(args), "ckpt-00001") / "held_out.parquet"
    table.unlink()
    caplog.clear()
    again = state_names(evaluate(args, split="held_out", report=False, return_state=True))
    assert again["evaluate-held_out"] == "Completed"  # its file was gone: it ran again, and said why
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and str(table) in r.getMessage()] == [
        f"evaluate-checkpoint: {table} changed or disappeared since its cached run wrote it; computing it again"]
    assert table.is_file()
    assert state_names(evaluate(args, split="held_out", report=False, return_state=True))["evaluate-held_out"] == \
        "Cached"


def test_a_transient_failure_is_retried_and_the_flow_completes(tiny_model_dir, tmp_path, monkeypatch):
    real = steps.score
    calls = {"n": 0}

    def flaky(settings, tables, iteration):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("simulated I/O hiccup")
        return real(settings, tables, iteration)

    monkeypatch.setattr(steps, "score", flaky)
    state = train(overrides(tiny_model_dir, tmp_path, "train.iterations=1"), return_state=True)
    assert state.is_completed()
    runs = task_runs(state)
    assert runs["score-1"].run_count == 2 and runs["score-1"].state.name == "Completed"


def test_a_programming_error_is_not_retried(tiny_model_dir, tmp_path, monkeypatch):
    def broken(settings, tables, iteration):
        raise ValueError("a bug, not a hiccup")

    monkeypatch.setattr(steps, "score", broken)
    state = train(overrides(tiny_model_dir, tmp_path, "train.iterations=1"), return_state=True)
    assert state.is_failed()
    assert task_runs(state)["score-1"].run_count == 1


def test_a_wrong_key_stops_the_flow_before_any_work(tiny_model_dir, tmp_path):
    state = train(overrides(tiny_model_dir, tmp_path, "+train.learning_rat=1e-3"), return_state=True)
    assert state.is_failed()
    with pytest.raises(SettingsError, match="learning_rat.*allowed keys.*learning_rate"):
        state.result()
    assert task_runs(state) == {}
    state = train(overrides(tiny_model_dir, tmp_path, "engine.context_mode=everything"), return_state=True)
    with pytest.raises(SettingsError, match="context_mode.*reflection_only"):
        state.result()


def test_shards_fan_out_through_a_process_pool(tiny_model_dir, tmp_path):
    args = overrides(tiny_model_dir, tmp_path, "train.iterations=1", "engine.groups=4",
                     "flow.runner=process", "flow.rollout_shards=2")
    state = train(args, return_state=True)
    assert state.is_completed()
    names = state_names(state)
    assert names["rollout-1-shard-0"] == names["rollout-1-shard-1"] == "Completed"
    table = pl.read_parquet(RunLayout.of(load_settings(args)).rollout(1))
    assert sorted(table["group_id"].unique().to_list()) == [0, 1, 2, 3]  # every group, from both shards


def test_evaluate_and_nightly_evaluation_write_reports(tiny_model_dir, tmp_path, capsys):
    # trained with a league (population.league) whose first snapshot joins after iteration 1
    args = overrides(tiny_model_dir, tmp_path, "population.league.enabled=true", "population.league.snapshot_every=1")
    train(args)
    layout = RunLayout.of(load_settings(args))
    assert [len(r["members"]) for r in map(json.loads, layout.league.read_text().splitlines())] == [1, 2]
    assert "snapshot-1" in set(pl.read_parquet(layout.rollout(2))["opponent"])
    from conftest import get_json
    from prefect.settings import PREFECT_API_URL

    from tasks.artifacts import artifact_key

    # the server's own filter (the UI's): Prefect 3.8's client sends nulls its server refuses
    shown = get_json(f"{PREFECT_API_URL.value()}/artifacts/filter",
                     {"artifacts": {"key": {"any_": [artifact_key(load_settings(args).run_name, "league")]}}, "limit": 5})
    assert shown, "no league table artifact"
    rows = json.loads(shown[0]["data"]) if isinstance(shown[0]["data"], str) else shown[0]["data"]
    assert {row["player"] for row in rows} >= {"agent", "snapshot-1", "conservative"}
    result = evaluate(args, split="all")
    report = json.loads(Path(result["files"]["report"]).read_text())
    assert {row["player"] for row in report["league"]} >= {"agent", "snapshot-1"}
    assert set(report["splits"]) == {"train", "held_out"}
    assert report["about"]["checkpoint"].endswith("ckpt-00002")
    held_out = {o["opponent"] for o in report["splits"]["held_out"]["opponents"]} - {"all"}
    assert held_out == {"cfr_greedy", "cfr_sampled", "bluffer", "calling_station", "random"}
    assert Path(result["files"]["success_by_episode"]).stat().st_size > 0
    # Kuhn Poker: the checkpoint's exploitability, read from the checkpoint the evaluation loaded,
    # equals the one the trainer measured on its weights in memory after the same update
    figures = report["exploitability"]
    assert figures["policy"]["policy"]["checkpoint"].endswith("ckpt-00002") and figures["start"]["policy"]["iteration"] == 0
    history = [json.loads(line) for line in layout.metrics.read_text().splitlines()]
    assert figures["policy"]["exploitability"] == pytest.approx(history[-1]["train/exploitability"], abs=1e-6)
    headline = json.loads(Path(result["files"]["metrics"]).read_text())
    assert headline["exploitability"] == pytest.approx(figures["policy"]["exploitability"], abs=1e-6)
    assert headline["start_exploitability"] == pytest.approx(figures["start"]["exploitability"], abs=1e-6)
    assert "## Exploitability (Kuhn Poker" in Path(result["files"]["markdown"]).read_text()

    # The larger evaluation of docs/report.md ("Reporting on tables evaluated earlier"), as typed there
    # (overrides before the options): its tables, the start's too, go to a directory of their own; the
    # pipeline's start tables stay as they were.
    import flows.__main__ as cli

    settings = load_settings(args)
    pipeline_start = Path(settings.paths.start_evaluation) / "train.parquet"
    before = pipeline_start.read_bytes()
    larger = tmp_path / "eval-larger"
    assert cli.main(["evaluate", *args, "eval.meta_episodes=6", f"paths.start_evaluation={larger}/start",
                     "--split", "train", "--out-dir", str(larger)]) == 0
    assert pipeline_start.read_bytes() == before
    for table in (larger / "train.parquet", larger / "start" / "train.parquet"):
        assert pl.read_parquet(table)["meta_id"].n_unique() == 6
    assert (larger / "report.md").is_file()

    # A report made later from tables alone names the checkpoint that played them, not the run's
    # final one (ckpt-00002): its path, its content hash and its iteration, as the tables' rows say.
    # Only a report of the final checkpoint against the starting policy writes the git-tracked
    # headline numbers.
    headline = Path(settings.paths.metrics)
    headline.write_text('{"sentinel": 1}\n')
    first = RunLayout.of(settings).checkpoints / "ckpt-00001"
    earlier, earlier_report = tmp_path / "eval-ckpt1", tmp_path / "report-ckpt1"
    assert cli.main(["evaluate", *args, "--checkpoint", str(first), "--split", "all", "--no-report",
                     "--out-dir", str(earlier)]) == 0
    assert cli.main(["report", *args, "--evaluation-dir", str(earlier), "--out-dir", str(earlier_report)]) == 0
    about = json.loads((earlier_report / "report.json").read_text())["about"]
    assert about["checkpoint"] == str(first) and about["checkpoint_sha256"] == ckpt.content_hash(first)
    assert about["iteration"] == 1 == pl.read_parquet(earlier / "train.parquet")["iteration"].unique().item()
    assert "train/gain_over_start" in json.loads((earlier_report / "metrics.json").read_text())
    assert "compared_with" not in about
    # From Python, the library's calls reproduce the two flows: the same checkpoint played into
    # the same tables, and their report, byte for byte, beside the same starting tables
    import mage.run

    by_library, library_report = tmp_path / "eval-ckpt1-library", tmp_path / "report-ckpt1-library"
    played = mage.run.evaluate(settings, checkpoint=first, split="all", out_dir=by_library, report=False)
    assert played["directory"] == str(by_library)
    assert {split: Path(table).read_bytes() for split, table in played["tables"].items()} == \
        {split: (earlier / f"{split}.parquet").read_bytes() for split in ("train", "held_out")}
    mage.run.report(settings, evaluation_dir=earlier, out_dir=library_report)
    flow_files = {p.relative_to(earlier_report): p.read_bytes() for p in earlier_report.rglob("*") if p.is_file()}
    library_files = {p.relative_to(library_report): p.read_bytes() for p in library_report.rglob("*") if p.is_file()}
    assert {"report.json", "report.md", "metrics.json"} <= {str(name) for name in flow_files}
    assert sorted(library_files) == sorted(flow_files)
    assert [name for name in flow_files if library_files[name] != flow_files[name]] == []
    assert headline.read_text() == '{"sentinel": 1}\n'  # neither is the final checkpoint's report
    # the final checkpoint's tables as the start: the report says what its gains are over
    final_tables = Path(result["files"]["report"]).parent
    assert cli.main(["report", *args, "--evaluation-dir", str(earlier), "--start-dir", str(final_tables),
                     "--out-dir", str(tmp_path / "report-1-over-2")]) == 0
    about = json.loads((tmp_path / "report-1-over-2" / "report.json").read_text())["about"]
    final_checkpoint = str(RunLayout.of(settings).checkpoints / "ckpt-00002")
    assert about["compared_with"] == final_checkpoint
    assert f"(start: {final_checkpoint} -> evaluated" in (tmp_path / "report-1-over-2" / "report.md").read_text()
    # the sampling is the tables', not the configuration's at report time
    hotter = cli.main(["report", *args, "eval.sampling.temperature=1.3", "--evaluation-dir", str(earlier),
                       "--out-dir", str(tmp_path / "report-hotter")])
    assert hotter == 0
    about = json.loads((tmp_path / "report-hotter" / "report.json").read_text())["about"]
    assert about["sampling"]["temperature"] == 0.7
    assert headline.read_text() == '{"sentinel": 1}\n'
    # the final checkpoint's own tables: the headline numbers are its report's
    assert cli.main(["report", *args, "--evaluation-dir", str(final_tables), "--out-dir", str(tmp_path / "final")]) == 0
    assert json.loads(headline.read_text()) == json.loads((tmp_path / "final" / "metrics.json").read_text())

    # Refused with one error line, before any report: a start played at other sampling, a start
    # that is the same policy, and tables of two policies in one directory.
    def refused(*options: str) -> str:
        capsys.readouterr()  # what came before
        assert cli.main(["report", *args, *options, "--out-dir", str(tmp_path / "no")]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        return next(line for line in err.splitlines() if line.startswith("error: "))

    hot_start = tmp_path / "start-hot"
    assert cli.main(["evaluate", *args, "eval.sampling.temperature=1.3", "--start", "--split", "all", "--no-report",
                     "--out-dir", str(hot_start)]) == 0
    assert "was played at sampling" in refused("--evaluation-dir", str(earlier), "--start-dir", str(hot_start))
    assert "nothing to compare" in refused("--evaluation-dir", str(earlier), "--start-dir", str(earlier))
    mixed = tmp_path / "eval-mixed"
    shutil.copytree(earlier, mixed)
    shutil.copy(hot_start / "held_out-metrics.json", mixed / "held_out-metrics.json")
    assert "played by different policies" in refused("--evaluation-dir", str(mixed))
    assert not (tmp_path / "no").exists()
    # tables written before the policy was recorded: the run's final checkpoint names them, as before
    unrecorded = tmp_path / "eval-unrecorded"
    shutil.copytree(earlier, unrecorded)
    for split in ("train", "held_out"):
        metrics = json.loads((unrecorded / f"{split}-metrics.json").read_text())
        del metrics["policy"]
        (unrecorded / f"{split}-metrics.json").write_text(json.dumps(metrics))
    assert cli.main(["report", *args, "--evaluation-dir", str(unrecorded), "--out-dir", str(tmp_path / "old")]) == 0
    about = json.loads((tmp_path / "old" / "report.json").read_text())["about"]
    assert about["checkpoint"] == final_checkpoint and about["iteration"] == 2

    # A newer run of another name: the nightly evaluation still takes the configured run, or
    # the one it is given, never merely the newest checkpoint on disk.
    other = [*args, "run.name=other", "train.iterations=1"]
    train(other)
    nightly = nightly_evaluation(args)
    directory = Path(nightly["directory"])
    assert directory.name == settings.run_name and directory.parent.parent == Path(settings.paths.nightly)
    assert (directory / "report.md").is_file() and (directory / "held_out.parquet").is_file()
    about = json.loads((directory / "report.json").read_text())["about"]
    assert about["checkpoint"] == str(RunLayout.of(settings).checkpoints / "ckpt-00002")
    named = nightly_evaluation(args, run="other")
    about = json.loads((Path(named["directory"]) / "report.json").read_text())["about"]
    assert about["checkpoint"] == str(RunLayout.of(load_settings(other)).checkpoints / "ckpt-00001")
    with pytest.raises(ValueError, match="plain name"):
        nightly_evaluation(args, run="../escape")

    # A run copied elsewhere (as DVC restores an experiment run in a temporary workspace) names
    # its own final checkpoint, not the original's.
    from mage.run.evaluation import final_policy

    copied = RunLayout.of(settings).root.parent / "copied"
    shutil.copytree(RunLayout.of(settings).root, copied)
    assert Path(final_policy(settings, run="copied").path) == copied / "checkpoints" / "ckpt-00002"
    # final.json, not the newest checkpoint: a later one (a longer run's, say) does not replace it
    shutil.copytree(copied / "checkpoints" / "ckpt-00002", copied / "checkpoints" / "ckpt-00003")
    assert ckpt.latest_checkpoint(copied / "checkpoints").path.name == "ckpt-00003"
    assert Path(final_policy(settings, run="copied").path) == copied / "checkpoints" / "ckpt-00002"
    # files of before hold the path as the run was given it: absolute, or relative to the working directory
    for recorded in (str(copied / "checkpoints" / "ckpt-00002"), "copied/checkpoints/ckpt-00002"):
        (copied / "final.json").write_text(json.dumps({"checkpoint": recorded}))
        with contextlib.chdir(copied.parent):
            found = Path(final_policy(settings, run="copied").path)
        assert (copied.parent / found).resolve() == (copied / "checkpoints" / "ckpt-00002").resolve()


def test_deployments_serve_every_flow_with_a_nightly_schedule(tiny_model_dir, tmp_path):
    from flows.deploy import deployments

    args = overrides(tiny_model_dir, tmp_path, "flow.timezone=Europe/Paris")
    built = {d.name: d for d in deployments(load_settings(args), args)}
    assert set(built) == {"seed_population", "train", "evaluate", "pipeline", "nightly_evaluation"}
    assert all(d.parameters == {"overrides": args} for d in built.values())
    (schedule,) = built["nightly_evaluation"].schedules
    assert schedule.schedule.cron == "0 2 * * *" and schedule.schedule.timezone == "Europe/Paris"
    assert not built["train"].schedules


def test_a_held_out_game_is_evaluated_and_reported_alike_by_the_flows_and_the_library(tiny_model_dir, tmp_path):
    # eval.games: a checkpoint (of the small model, saved without training) of a rock-paper-scissors
    # run and its start, on Kuhn Poker held out (its exploitability too: 12 information states, where
    # Leduc's 936 would take minutes). The flows and the library write the same tables and the same
    # report, byte for byte; the nightly evaluation takes the list from the same key.
    import mage.run
    from flows import report
    from mage.models.policy import load_policy
    from mage.trainer.policy_trainer import PolicyTrainer

    args = overrides(tiny_model_dir, tmp_path, "game=rock_paper_scissors", "eval.meta_episodes=2", "eval.episodes=2",
                     "eval.sampling.max_new_tokens=8", "eval.games=[kuhn_poker]")
    settings = load_settings(args)
    policy = load_policy(str(tiny_model_dir))
    saved = ckpt.save_checkpoint(RunLayout.of(settings).checkpoints, 1, policy,
                                 PolicyTrainer(policy, settings.train, settings.algo).optimizer, config_hash="h",
                                 parent=None, metrics={})
    flowed, start, flow_report = tmp_path / "eval-flow", tmp_path / "start-flow", tmp_path / "report-flow"
    played = evaluate(args, checkpoint=str(saved.path), split="held_out", out_dir=str(flowed), report=False)
    assert played["games"] == {"kuhn_poker": {"held_out": str(flowed / "kuhn_poker" / "held_out.parquet")}}
    evaluate(args, start=True, split="held_out", out_dir=str(start), report=False)
    written = report(args, evaluation_dir=str(flowed), start_dir=str(start), out_dir=str(flow_report))
    kuhn = pl.read_parquet(flowed / "kuhn_poker" / "held_out.parquet")
    assert {json.loads(s)["game"] for s in kuhn["initial_state"]} == {"kuhn_poker"}
    assert set(kuhn["opponent"]) == {"cfr_greedy", "cfr_sampled", "bluffer", "calling_station", "random"}
    assert {"kuhn_poker/held_out/gain_over_start", "kuhn_poker/exploitability", "kuhn_poker/start_exploitability"} \
        <= set(written["metrics"])
    assert (flowed / "kuhn_poker" / "exploitability.json").is_file() and not (flowed / "exploitability.json").exists()

    by_library, library_report = tmp_path / "eval-library", tmp_path / "report-library"
    mage.run.evaluate(settings, checkpoint=saved.path, split="held_out", out_dir=by_library, report=False)
    tables = {p.relative_to(flowed): p.read_bytes() for p in flowed.rglob("*") if p.suffix in (".parquet", ".json")}
    assert sorted(map(str, tables)) == ["held_out-metrics.json", "held_out.parquet", "kuhn_poker/exploitability.json",
                                        "kuhn_poker/held_out-metrics.json", "kuhn_poker/held_out.parquet"]
    assert tables == {p.relative_to(by_library): p.read_bytes() for p in by_library.rglob("*")
                      if p.suffix in (".parquet", ".json")}
    mage.run.report(settings, evaluation_dir=flowed, start_dir=start, out_dir=library_report)
    flow_files = {p.relative_to(flow_report): p.read_bytes() for p in flow_report.rglob("*") if p.is_file()}
    library_files = {p.relative_to(library_report): p.read_bytes() for p in library_report.rglob("*") if p.is_file()}
    assert {"report.json", "report.md", "metrics.json", "success_by_episode-kuhn_poker.png"} <= set(map(str, flow_files))
    assert sorted(library_files) == sorted(flow_files)
    assert [name for name in flow_files if library_files[name] != flow_files[name]] == []
    markdown = (flow_report / "report.md").read_text()
    assert "## Held-out game: kuhn_poker" in markdown
    assert markdown.index("## Held-out game: kuhn_poker") < markdown.index("## Exploitability")

    nightly = nightly_evaluation(args)
    directory = Path(nightly["directory"])
    assert (directory / "kuhn_poker" / "held_out.parquet").is_file()
    assert json.loads((directory / "report.json").read_text())["about"]["held_out_games"] == ["kuhn_poker"]
