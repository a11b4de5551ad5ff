"""Serve the lifecycle's deployments to a Prefect server, with the nightly evaluation on a cron schedule.

    prefect server start --host 127.0.0.1          # terminal 1: the API and the UI (http://127.0.0.1:4200)
    python -m flows.deploy [hydra overrides ...]     # terminal 2: serve the deployments

The overrides given here become the deployments' default ``overrides`` parameter; a run
started from the UI can replace them (``Run > Custom run``), e.g. ``["algo=grpo",
"train.iterations=20"]``. The nightly evaluation runs at ``flow.nightly_cron`` (02:00 by
default) in ``flow.timezone`` (default: this machine's zone). Serving runs every triggered
flow in a subprocess of this process, until it is stopped (Ctrl-C).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from flows.common import local_timezone
from flows.evaluation import evaluate, nightly_evaluation
from flows.lifecycle import pipeline
from flows.population import seed_population
from flows.training import train
from mage.settings import Settings, load_settings

TAGS = ["mage"]


def deployments(settings: Settings, overrides: Sequence[str] = ()) -> list[Any]:
    """The five deployments: the four lifecycle flows on demand, the nightly evaluation on a schedule."""
    from prefect.schedules import Cron

    parameters = {"overrides": list(overrides)}
    timezone = settings.flow.timezone or local_timezone()
    on_demand = [
        seed_population.to_deployment("seed_population", parameters=parameters, tags=TAGS,
                                      description="Write the population manifest with its ceilings."),
        train.to_deployment("train", parameters=parameters, tags=TAGS,
                            description="Train: rollout -> advantages -> update -> checkpoint, per iteration."),
        evaluate.to_deployment("evaluate", parameters=parameters, tags=TAGS,
                               description="Evaluate a checkpoint per episode and per opponent, with ceilings."),
        pipeline.to_deployment("pipeline", parameters=parameters, tags=TAGS,
                               description="The whole lifecycle: seed, train, evaluate."),
    ]
    nightly = nightly_evaluation.to_deployment(
        "nightly_evaluation", parameters=parameters, tags=[*TAGS, "nightly"],
        schedules=[Cron(settings.flow.nightly_cron, timezone=timezone)],
        description=f"The newest checkpoint against the held-out opponents (and the games of eval.games), "
                    f"{settings.flow.nightly_cron} ({timezone}).",
    )
    return [*on_demand, nightly]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.deploy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides: the deployments' default parameters")
    parser.add_argument("--limit", type=int, default=None, help="flow runs served at the same time (default: no limit)")
    args = parser.parse_args(argv)
    settings = load_settings(args.overrides)  # a bad override stops here, not at 02:00
    from prefect import serve

    serve(*deployments(settings, args.overrides), limit=args.limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
