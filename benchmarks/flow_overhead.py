"""The cost of Prefect: one training iteration as the ``train`` flow against the same ``mage``
functions called directly, side by side, and the time of a fully cached re-run.

Both paths start from the base model (loading it is part of each) and run one iteration of
the tiny preset (rollout, returns and advantages, PPO update, checkpoint) into a fresh
artifacts folder, alternating ``direct, flow, direct, flow, ...`` so drift on a shared
machine hits both alike. The flow runs against a temporary Prefect server and database
(Prefect's test harness: its start-up is not counted, a real server runs all the time);
its time includes creating the flow and task runs, cache keys, result persistence and
file references. The cached re-run repeats the last flow run with the same arguments.

    python benchmarks/flow_overhead.py                    # 3 repetitions, tiny preset
    python benchmarks/flow_overhead.py --repeats 5 --override engine.groups=4

Prints a Markdown table (paste it into BENCHMARKS.md with the machine line).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="mage-bench-prefect-"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model-path", default=None, help="an existing tiny preset (default: build it under artifacts/)")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override for both paths")
    args = parser.parse_args()

    import torch
    from prefect.logging import disable_run_logger  # noqa: F401  (Prefect imported before the harness)
    from prefect.testing.utilities import prefect_test_harness

    from flows.training import train as train_flow
    from mage.run import train
    from mage.settings import load_settings
    from mage.warmstart import prepare_model
    from tasks import worker

    torch.set_num_threads(args.threads)
    base = list(args.override) + ["train.iterations=1"]
    model_path = args.model_path or prepare_model(load_settings(base))
    base.append(f"model.path={Path(model_path).resolve()}")
    work = Path(tempfile.mkdtemp(prefix="mage-bench-flow-"))

    def direct(index: int) -> float:
        started = time.perf_counter()  # both paths start from overrides: composing the config counts
        settings = load_settings([*base, f"paths.artifacts={work / f'direct-{index}'}", f"paths.results={work / f'direct-{index}' / 'results'}"])
        train(settings, progress=False)
        return time.perf_counter() - started

    def flowed(index: int) -> tuple[float, list[str]]:
        overrides = [*base, f"paths.artifacts={work / f'flow-{index}'}", f"paths.results={work / f'flow-{index}' / 'results'}"]
        worker.forget()  # the flow loads the model in its task, like the direct path
        started = time.perf_counter()
        train_flow(overrides)
        return time.perf_counter() - started, overrides

    times: dict[str, list[float]] = {"direct": [], "flow": []}
    with prefect_test_harness(server_startup_timeout=120):
        direct(-1)  # warm-up: imports, kernels, the tokenizer's stop-string tables
        for index in range(args.repeats):
            times["direct"].append(direct(index))
            seconds, last = flowed(index)
            times["flow"].append(seconds)
        started = time.perf_counter()
        train_flow(last)  # every task of it is cached now
        cached = time.perf_counter() - started

    ratios = [f / d for f, d in zip(times["flow"], times["direct"])]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {args.threads} threads; "
          f"{time.strftime('%Y-%m-%d')}; tiny preset, one iteration ({' '.join(args.override) or 'defaults'}), "
          f"{args.repeats} alternating repetitions\n")
    print("| path | median seconds | runs (s) |")
    print("|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")
    print(f"| fully cached flow re-run | {cached:.2f} | {cached:.2f} |")
    print(f"\nflow / direct, per pair: {', '.join(f'{r:.3f}' for r in ratios)}; median overhead "
          f"{100 * (statistics.median(ratios) - 1):+.1f}%")


if __name__ == "__main__":
    main()
