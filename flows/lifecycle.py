"""Flow ``pipeline``: the whole lifecycle, as the sub-flows it is made of.

    seed_population -> prepare_model -> train (rollout -> advantages -> update -> checkpoint)
                    -> evaluate the final checkpoint and the starting policy (training and
                       held-out opponents, the same initial states) -> report (gains, ceilings)

The DVC pipeline (``dvc.yaml``) runs the same sub-flows as its stages.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.common import logger, settings_for
from flows.evaluation import evaluate, report
from flows.model import prepare_model
from flows.population import seed_population
from flows.training import train


@flow(name="pipeline")
def pipeline(overrides: list[str] | None = None, config_file: str | None = None) -> dict[str, Any]:
    """Seed the population, prepare the model, train, evaluate the final checkpoint and the
    starting policy, and report the one beside the other."""
    settings = settings_for(overrides, config_file, trains=True)  # fail on a bad override before any work
    seed_population(overrides, config_file)
    prepare_model(overrides, config_file)
    trained = train(overrides, config_file)
    checkpoint = trained["checkpoint"]
    played = evaluate(overrides, config_file, checkpoint=checkpoint, split="all", report=False)
    start = evaluate(overrides, config_file, start=True, split="all", report=False)
    written = report(overrides, config_file, evaluation_dir=played["directory"], start_dir=start["directory"])
    logger().info(f"run {settings.run_name} done; report: {written['files']['markdown']}")
    return {"checkpoint": checkpoint, "report": written["directory"], "metrics": written["metrics"]}
