"""Run a flow from the command line (DVC stages and scripts use this).

    python -m flows <flow> [hydra overrides ...]          compose params/ with the overrides
    python -m flows <flow> --config params.yaml           use an already composed config
    python -m flows evaluate --checkpoint PATH --split held_out
    python -m flows evaluate --start --split all          the starting policy (warm start or base model)
    python -m flows report --evaluation-dir DIR --start-dir DIR --out-dir DIR

Flows: seed_population, prepare_model, train, evaluate, report, pipeline, nightly_evaluation.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from flows import FLOWS, load

    parser = argparse.ArgumentParser(prog="python -m flows", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("flow", choices=sorted(FLOWS))
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. algo=grpo train.iterations=20")
    parser.add_argument("--config", dest="config_file", help="a composed config file (DVC's params.yaml)")
    parser.add_argument("--checkpoint", help="evaluate: the checkpoint directory (default: the run's final one)")
    parser.add_argument("--start", action="store_true",
                        help="evaluate: the starting policy (the tiny warm start or the base model) instead")
    parser.add_argument("--split", help="evaluate: train, held_out or all (default: eval.split)")
    parser.add_argument("--out-dir", help="evaluate, report: where the tables or the report go")
    parser.add_argument("--evaluation-dir", help="report: the evaluation tables to report on")
    parser.add_argument("--start-dir", help="report: the starting policy's tables (default: paths.start_evaluation)")
    parser.add_argument("--no-report", action="store_true", help="evaluate: write the tables only")
    args = parser.parse_args(argv)
    kwargs = {"overrides": args.overrides, "config_file": args.config_file}
    if args.flow == "evaluate":
        kwargs |= {"checkpoint": args.checkpoint, "split": args.split, "out_dir": args.out_dir,
                   "report": not args.no_report, "start": args.start}
    elif args.flow == "report":
        kwargs |= {"evaluation_dir": args.evaluation_dir, "out_dir": args.out_dir, "start_dir": args.start_dir}
    elif args.checkpoint or args.split or args.out_dir or args.evaluation_dir or args.no_report or args.start \
            or args.start_dir:
        parser.error("--checkpoint, --start, --split, --out-dir, --evaluation-dir, --start-dir and --no-report "
                     "belong to evaluate or report")
    from mage.settings import SettingsError, load_settings

    try:  # a wrong key fails here, before a Prefect server or any work is started
        load_settings(args.overrides, args.config_file)
    except SettingsError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    load(args.flow)(**kwargs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
