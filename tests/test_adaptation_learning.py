"""Learning across episodes, at smoke size, with the control that shows this test can fail
(docs/results.md, "Rock-paper-scissors").

One warm start of rock-paper-scissors (the tiny preset, built as ``SMOKE`` says) trains twice
with MAGE at fixed seeds, and each checkpoint plays the training opponents over two episodes:

* as configured, success at k = 2 rises above the memoryless ceiling (2/3: no policy that
  ignores what episode 1 showed wins more), its 95% Wilson interval entirely above it;
* with ``engine.context_mode=none`` (no prompt shows an earlier episode, in training and in
  evaluation) the same assertion fails: its interval reaches down to the ceiling or below.

The ceiling is the manifest's (:mod:`mage.population.ceilings.across_episodes`), checked by hand in
tests/test_ceilings_across_episodes.py. Both runs are deterministic on one machine: fixed seeds,
one thread.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import built_once

from mage.evaluation.play import evaluate_checkpoint
from mage.models import checkpoint as ckpt
from mage.population.manifest import seed_population, write_manifest
from mage.report.intervals import wilson
from mage.report.tables import per_episode
from mage.rollout.metrics import ALL
from mage.run import RunLayout, train
from mage.settings import load_settings

pytestmark = pytest.mark.e2e

#: The smoke size: the game's tiny preset and MAGE's settings (params/model_game/tiny/
#: rock_paper_scissors.yaml) with fewer iterations and a smaller evaluation. Sized to the 2-core
#: machine (BENCHMARKS.md, "The test suite").
SMOKE = ["game=rock_paper_scissors", "algo=mage", "seed=0", "train.iterations=12", "eval.episodes=2",
         "eval.meta_episodes=192", "train.keep_checkpoints=1"]
K = 2


def run_settings(root: Path, model: Path, context_mode: str):
    return load_settings([*SMOKE, f"paths.artifacts={root}", f"paths.results={root}/results", "paths.live=null",
                          f"model.path={model}", f"engine.context_mode={context_mode}"])


@pytest.fixture(scope="module")
def warm_start(tmp_path_factory, worker_id) -> Path:
    """The tiny preset of rock-paper-scissors, built once for every worker of the run."""
    from mage.warmstart import prepare_model

    def build(directory: Path) -> None:
        settings = load_settings([*SMOKE, f"paths.artifacts={directory}", f"model.path={directory / 'model'}"])
        write_manifest(seed_population(settings, progress=False), settings.paths.population_manifest)
        prepare_model(settings, progress=False)

    return built_once(tmp_path_factory, worker_id, "rock-paper-scissors-warm-start", build)


def success_at_k(root: Path, warm: Path, context_mode: str) -> tuple[float, tuple[float, float], float, int]:
    """Train MAGE from ``warm`` with ``context_mode``; its checkpoint's pass@k on the training
    opponents, the 95% Wilson interval, the memoryless ceiling of the states played, n."""
    from mage.population.manifest import load_manifest

    settings = run_settings(root, warm / "model", context_mode)
    train(settings, progress=False)
    latest = ckpt.latest_checkpoint(RunLayout.of(settings).checkpoints)
    assert latest is not None and latest.iteration == settings.train.iterations
    table = evaluate_checkpoint(settings, latest, ("train",))["train"]
    manifest = load_manifest(warm / "population" / "rock_paper_scissors.json")
    row = next(r for r in per_episode(table, manifest) if r["opponent"] == ALL and r["episode"] == K)
    wins = round(row["pass_at_k"] * row["meta_episodes"])
    return row["pass_at_k"], wilson(wins, row["meta_episodes"]), row["memoryless_ceiling"], row["meta_episodes"]


@pytest.mark.parametrize(("context_mode", "adapts"), [("reflection_only", True), ("none", False)])
def test_mage_learns_to_use_what_episode_one_showed_and_without_it_cannot(warm_start, tmp_path, context_mode, adapts):
    rate, (low, high), memoryless, n = success_at_k(tmp_path, warm_start, context_mode)
    assert memoryless == pytest.approx(2 / 3)  # one initial state: the manifest's figure, by hand
    assert n == 192
    figures = f"{context_mode}: pass@{K} {rate:.3f} [{low:.3f}, {high:.3f}], memoryless ceiling {memoryless:.3f}"
    print(figures)  # pytest -rP shows it
    assert (low > memoryless) == adapts, figures
