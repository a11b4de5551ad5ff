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
import os
import sys

#: Seconds the command has, after its first stop signal, to record the flow's final state and
#: stop the temporary server; past them it exits at once (the kernel releases the run's lock
#: and ends the server, and the next start removes the temporaries).
STOP_GRACE_SECONDS = 30.0


class Stopped(SystemExit):
    """A stop signal (SIGTERM, SIGINT) received: an ordinary exit with status 128 + signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def die_with_parent() -> None:
    """End this process when the process that started it dies (Linux), and turn SIGTERM and
    SIGINT into an ordinary exit (:class:`Stopped`) so that context managers run (the run's
    lock, temporaries, the flow's final state, then the temporary Prefect server). A `dvc
    repro` that is killed then does not leave its stage running on its own. A further signal
    while that exit runs is ignored (a second exception inside Prefect's crash handling would
    leave the run's state unrecorded); the exit is bounded by :data:`STOP_GRACE_SECONDS`."""
    import signal
    import threading

    stopping: list[int] = []

    def stop(signum, frame):
        if stopping:
            return
        stopping.append(signum)
        watchdog = threading.Timer(STOP_GRACE_SECONDS, os._exit, (128 + signum,))
        watchdog.daemon = True
        watchdog.start()
        raise Stopped(signum)

    from flows.server import end_with_parent

    parent = os.getppid()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    end_with_parent()
    if os.getppid() != parent:  # the parent died before prctl: no signal would come
        raise SystemExit(128 + signal.SIGTERM)


def quiet_tracebacks_of(errors: tuple[type[BaseException], ...]) -> None:
    """Prefect logs a failed flow or task run with its traceback. For ``errors`` (what the
    user fixes, not a bug) its line stays and the traceback goes: the command ends with one
    ``error:`` line instead (``--debug`` keeps everything)."""
    import logging

    class OneLine(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.exc_info and isinstance(record.exc_info[1], errors):
                record.exc_info, record.exc_text = None, None
            return True

    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        logger.filters = [f for f in logger.filters if type(f).__name__ != "OneLine"]  # once, however often main runs
        logger.addFilter(OneLine())


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
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of a config error, a damaged file, a refused write or a run in use "
                             "(default: one line)")
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
    from flows.common import TRAINING_FLOWS
    from mage.io import CorruptFileError, IncompatibleFilesError, RunLockedError, StorageError
    from mage.preflight.memory_plan import check_fits
    from mage.preflight.paths import check_paths
    from mage.settings import SettingsError, load_settings

    try:  # a wrong key, a path that cannot be used, or a plan that cannot fit the GPU fails here, before a
        # Prefect server or any work
        settings = load_settings(args.overrides, args.config_file)
        check_paths(settings)
        if args.flow in TRAINING_FLOWS:
            check_fits(settings)
    except SettingsError as error:
        if args.debug:
            raise
        print(f"config error: {error}", file=sys.stderr)
        return 2
    from flows.server import PrefectAPIError, prefect_api
    from mage.stopping import StopRequested

    # a shard asked to stop by a stop signal is no error to explain: its line says so, always
    quiet_tracebacks_of((StopRequested,) if args.debug else
                        (StopRequested, CorruptFileError, IncompatibleFilesError, RunLockedError, StorageError))
    try:
        with prefect_api(settings.flow.api_timeout_seconds, settings.flow.server_start_timeout_seconds):
            load(args.flow)(**kwargs)
    # what the user fixes, not a bug: one line
    except (CorruptFileError, IncompatibleFilesError, RunLockedError, StorageError, PrefectAPIError) as error:
        if args.debug:
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    try:
        die_with_parent()
        status = main()
    except Stopped as stopped:  # everything has ended by now: the flow, its lock, the server
        import signal

        print(f"stopped by {signal.Signals(stopped.signum).name}", file=sys.stderr)
        status = stopped.code
    sys.exit(status)
