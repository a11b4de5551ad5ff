"""Prefect flows composing the tasks of ``tasks/`` into the lifecycle (see README)."""

from flows.evaluate import evaluate, nightly_evaluation, report
from flows.pipeline import pipeline
from flows.prepare_model import prepare_model
from flows.seed_population import seed_population
from flows.train import train

FLOWS = {
    "seed_population": seed_population,
    "prepare_model": prepare_model,
    "train": train,
    "evaluate": evaluate,
    "report": report,
    "pipeline": pipeline,
    "nightly_evaluation": nightly_evaluation,
}

__all__ = ["FLOWS", "evaluate", "nightly_evaluation", "pipeline", "prepare_model", "report", "seed_population", "train"]
