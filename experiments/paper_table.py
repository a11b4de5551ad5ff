"""The shape of the paper's Table 1 at laptop scale: MAGE against LaMer, GiGPO and GRPO on
Kuhn Poker, Tic-Tac-Toe and Sokoban (and, with ``--games rock_paper_scissors``, the known-answer
game), against the training and the held-out opponents.

For each game one warm start (the tiny preset, built or given with ``--model-path``) and,
for each method:
1. **A learning-rate sweep** (``Scale.learning_rates``) with the first seed. Each sweep run is
   scored on the *training* opponents, on initial states of their own (``SELECTION_SEED``,
   not the reported ones); the best final-episode success wins. The held-out opponents play
   no part in the choice.
2. **The other seeds** at the chosen rate. The first seed's reported run is its sweep run.
3. **Evaluation** as in the report (``mage.report.tables``): every method and the warm start on the
   same fixed initial states (``eval.seed``), N = 3 episodes, Wilson intervals, the per-k
   ceiling of exactly the states played, and the gain over the warm start paired by state;
   success by episode k per run beside the three ceilings (known opponent, memoryless,
   adaptive) where the game has them, and ``<out>/success_by_k-<game>.png``.
Single-episode methods (GiGPO, GRPO) train on one episode per meta-episode and three times
the groups: MAGE's episode budget (``params/algo/grpo.yaml``). They are evaluated like the
others, over N = 3 episodes.

Then two of the paper's ablations at MAGE's chosen rate (``--ablation-game``): groups that mix
opponents (``algo.grouping=mixed``) and a local anchor (``algo.anchor=local``).

    python experiments/paper_table.py                      # the default invocation (96 min here)
    python experiments/paper_table.py --games kuhn_poker --algos mage grpo --seeds 0
    python experiments/paper_table.py --jobs 8 --threads 2 # runs in parallel (a machine with cores)
    python experiments/paper_table.py --smoke              # CI: the smallest setting
    python experiments/paper_table.py --games rock_paper_scissors --seeds 0 1 2 --ablation-game none

A finished run's result is kept (``<out>/runs/<run>.json``): the same command again resumes
where it stopped. Prints Markdown (the tables of docs/results.md, "The paper's table at laptop
scale") and writes ``<out>/table.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from paper_table_report import final_success, print_tables

GAMES = ("kuhn_poker", "tic_tac_toe", "sokoban", "rock_paper_scissors")
PAPER_GAMES = GAMES[:3]  # the default invocation: the paper's Table 1
ALGOS = ("mage", "lamer", "gigpo", "grpo")
SINGLE_EPISODE = {"gigpo", "grpo"}
SELECTION_SEED = 4321  # initial states of the learning-rate choice: never the reported ones (eval.seed)
ABLATIONS = {"mixed groups": ["algo.grouping=mixed"], "local anchor": ["algo.anchor=local"]}


@dataclass(frozen=True)
class Scale:
    """One game's run size: what fits the 2-hour budget on 2 cores (BENCHMARKS.md, "The paper's
    table: its budget")."""

    iterations: int
    groups: int  # MAGE's groups per iteration (single-episode methods: three times as many)
    group_size: int
    mini_batch_size: int
    eval_meta_episodes: int  # per split, the reported evaluation
    selection_meta_episodes: int  # the training split, for the learning-rate choice
    learning_rates: tuple[float, ...]


# The default invocation took 96 min in one call on 2 cores (BENCHMARKS.md, "The paper's table: its
# budget"): the 40 runs 83 min, the three builds and the rest 13 min. Cut from the lifecycle
# defaults: iterations (Kuhn 20 -> 10, Tic-Tac-Toe 5 -> 3), groups (16 -> 6 on the two long games)
# and evaluated meta-episodes.
SCALES = {
    "kuhn_poker": Scale(10, 16, 4, 32, 256, 128, (2e-4, 4e-4)),
    "tic_tac_toe": Scale(3, 6, 4, 32, 64, 32, (2e-4, 4e-4)),
    "sokoban": Scale(2, 6, 4, 48, 48, 24, (2e-4, 4e-4)),
    # the known-answer game (docs/results.md, "Rock-paper-scissors"): the main command's batch and
    # iterations, the rates of the fair Kuhn Poker comparison's range
    "rock_paper_scissors": Scale(20, 16, 4, 32, 384, 128, (1e-4, 2e-4, 4e-4)),
}
# --smoke: every step of the script at the smallest size (it checks the script, not MAGE): short
# replies, few ceiling games, and (when no warm start is given) a build of a few steps
SMOKE = Scale(1, 2, 2, 8, 4, 2, (2e-4, 4e-4))
SMOKE_ALGOS, DEFAULT_SEEDS = ["mage", "grpo"], [0, 1]
SMOKE_RUNS = ["engine.sampling.max_new_tokens=8", "population.ceilings.n_games=4",
              "eval.episodes=2"]
SMOKE_BUILD = ["model.tiny.corpus_meta_episodes=8", "model.tiny.bc_meta_episodes=8", "model.tiny.bc_steps=2",
               "model.tiny.bc_short_steps=0", "model.tiny.check_meta_episodes=2",
               "model.tiny.check_sampling.max_new_tokens=8", "model.tiny.hidden_size=32",
               "model.tiny.intermediate_size=64", "model.tiny.num_layers=1", "model.tiny.vocab_size=512"]


@dataclass(frozen=True)
class RunSpec:
    """One training run and the evaluations of its last checkpoint."""

    game: str
    algo: str
    seed: int
    learning_rate: float
    variant: str  # "" or an ablation's name
    overrides: tuple[str, ...]
    selection_meta_episodes: int = 0  # a sweep run: also scored on the selection states (0: not)

    @property
    def name(self) -> str:
        variant = f"-{self.variant.replace(' ', '_')}" if self.variant else ""
        return f"{self.game}-{self.algo}{variant}-s{self.seed}-lr{self.learning_rate:g}"


def base_overrides(args: argparse.Namespace, game: str, scale: Scale) -> list[str]:
    model = [f"model.path={Path(args.model_path[game]).resolve()}"] if game in args.model_path else []
    # runs go side by side: no dvclive (one folder for all of them), and nothing in the repository's results/
    return [f"game={game}", "model=tiny", f"paths.artifacts={(args.out / game).resolve()}",
            f"paths.results={(args.out / game / 'results').resolve()}", "paths.live=null", *model,
            f"train.iterations={scale.iterations}", f"engine.group_size={scale.group_size}",
            f"train.mini_batch_size={scale.mini_batch_size}", f"eval.meta_episodes={scale.eval_meta_episodes}",
            "train.keep_checkpoints=1", *(SMOKE_RUNS if args.smoke else []),
            *(SMOKE_BUILD if args.smoke and not model else []), *args.override]


def run_spec(args: argparse.Namespace, game: str, algo: str, seed: int, lr: float, variant: str = "",
             sweep: bool = False) -> RunSpec:
    scale = args.scales[game]
    groups = scale.groups * (3 if algo in SINGLE_EPISODE else 1)  # the same episode budget as MAGE
    spec = RunSpec(game, algo, seed, lr, variant, (), scale.selection_meta_episodes if sweep else 0)
    overrides = [*base_overrides(args, game, scale), f"algo={algo}", f"seed={seed}", f"train.learning_rate={lr}",
                 f"engine.groups={groups}", f"run.name={spec.name}", *ABLATIONS.get(variant, [])]
    return replace(spec, overrides=tuple(overrides))


# -- work done in a worker (or in-process with --jobs 1) -----------------------------------
def evaluate_tables(settings: Any, checkpoint: Any, out: Path, seed: int | None = None,
                    meta_episodes: int | None = None, splits: tuple[str, ...] | None = None) -> dict[str, str]:
    """Play the policy (``checkpoint``; None: the warm start) on each split (default: both); the tables' paths."""
    from mage.config.sections import SPLITS
    from mage.evaluation.play import evaluate_checkpoint
    from mage.rollout import write_trajectories

    cfg = settings.eval
    cfg = replace(cfg, seed=cfg.seed if seed is None else seed,
                  meta_episodes=cfg.meta_episodes if meta_episodes is None else meta_episodes)
    tables = evaluate_checkpoint(settings, checkpoint, splits or SPLITS, cfg)
    return {split: str(write_trajectories(table, out / f"{split}.parquet")) for split, table in tables.items()}


def train_and_evaluate(spec: RunSpec, threads: int, out: Path) -> dict[str, Any]:
    """Train one run (resuming a stopped one), evaluate its last checkpoint; figures and paths."""
    import torch

    from mage.models import checkpoint as ckpt
    from mage.run import RunLayout, train
    from mage.settings import load_settings

    torch.set_num_threads(threads)
    settings = load_settings(list(spec.overrides))
    started = time.perf_counter()
    result = train(settings, progress=False)
    train_seconds = time.perf_counter() - started
    latest = ckpt.latest_checkpoint(RunLayout.of(settings).checkpoints)
    if latest is None or latest.iteration != settings.train.iterations:
        raise RuntimeError(f"{spec.name}: no checkpoint of iteration {settings.train.iterations}")
    started = time.perf_counter()
    tables = evaluate_tables(settings, latest, out / spec.name)
    if spec.selection_meta_episodes:
        tables["selection"] = evaluate_tables(settings, latest, out / spec.name / "selection", SELECTION_SEED,
                                              spec.selection_meta_episodes, ("train",))["train"]
    last = result.history[-1] if result.history else {}
    return {"spec": asdict(spec), "name": spec.name, "tables": tables, "train_seconds": train_seconds,
            "eval_seconds": time.perf_counter() - started, "iterations_this_call": len(result.iterations),
            "last_kl": last.get("train/kl"), "last_invalid_rate": last.get("rollout/invalid_rate")}


# -- the driver -----------------------------------------------------------------------------
def _end_with_parent(parent: int) -> None:
    """A worker's initializer: end the worker when its parent dies, as the flows' processes do
    (``flows.server.end_with_parent``). A killed driver (SIGTERM, SIGKILL) runs no clean-up, and
    a worker would otherwise finish its run (up to an hour) with nobody to hand the result to."""
    from flows.server import end_with_parent

    end_with_parent()
    if os.getppid() != parent:  # the driver died before prctl: no signal would come
        os._exit(1)


def worker_pool(jobs: int) -> concurrent.futures.ProcessPoolExecutor:
    """``jobs`` worker processes, spawned (no forked torch or tokenizer threads), that end with
    this process. The signal comes when the thread that started a worker ends: a spawn pool
    starts its workers in ``submit``, from the driver's main thread."""
    return concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_end_with_parent, initargs=(os.getpid(),))


class Runner:
    """Runs specs in this process or in ``jobs`` worker processes, keeping each result."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.results_dir = args, args.out / "runs"
        self.results_dir.mkdir(parents=True, exist_ok=True)
        self.pool = worker_pool(args.jobs) if args.jobs > 1 else None

    def kept(self, spec: RunSpec) -> dict[str, Any] | None:
        path = self.results_dir / f"{spec.name}.json"
        if not path.is_file():
            return None
        result = json.loads(path.read_text())
        same = result.get("spec") == json.loads(json.dumps(asdict(spec)))
        return result if same else None

    def run(self, specs: list[RunSpec]) -> list[dict[str, Any]]:
        from mage import io

        todo = [s for s in specs if self.kept(s) is None]
        print(f"# {len(specs) - len(todo)} of {len(specs)} runs kept from an earlier call; running {len(todo)}",
              file=sys.stderr, flush=True)
        out = self.args.out / "evaluations"
        if self.pool is None:
            finished = (train_and_evaluate(s, self.args.threads, out) for s in todo)
        else:
            futures = [self.pool.submit(train_and_evaluate, s, self.args.threads, out) for s in todo]
            finished = (f.result() for f in concurrent.futures.as_completed(futures))
        for result in finished:
            io.write_json(self.results_dir / f"{result['name']}.json", result)
            print(f"# {result['name']}: trained {result['train_seconds']:.0f} s, evaluated "
                  f"{result['eval_seconds']:.0f} s", file=sys.stderr, flush=True)
        return [self.kept(s) for s in specs]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def warm_start(args: argparse.Namespace, game: str) -> dict[str, Any]:
    """The game's warm start (built once if not given), its population manifest, and its
    evaluation on the reported initial states."""
    from mage import io
    from mage.population.manifest import seed_population, write_manifest
    from mage.settings import load_settings
    from mage.warmstart import prepare_model

    settings_key = base_overrides(args, game, args.scales[game])
    settings = load_settings(settings_key)
    print(f"# {game}: the warm start, its population and its evaluation", file=sys.stderr, flush=True)
    directory = args.out / "evaluations" / f"{game}-warm_start"
    kept = directory / "tables.json"  # an earlier call's evaluation, if it evaluated the same thing
    earlier = json.loads(kept.read_text()) if kept.is_file() else {}
    same = earlier.get("overrides") == settings_key
    # where the pipeline seeds it: the build's own check reads it from there instead of
    # computing the ceilings again (mage.warmstart.preset.population_manifest)
    manifest = Path(settings.paths.population_manifest)
    if not (same and manifest.is_file()):
        write_manifest(seed_population(settings, progress=False), manifest)
    started = time.perf_counter()
    model = prepare_model(settings, progress=False)
    built = time.perf_counter() - started
    tables = earlier["tables"] if same else None
    if tables is None:
        tables = evaluate_tables(settings, None, directory)
        io.write_json(kept, {"overrides": settings_key, "tables": tables})
    return {"model": model, "build_seconds": built, "manifest": str(manifest), "tables": tables,
            "episodes": settings.eval.episodes}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", nargs="+", choices=GAMES, default=list(PAPER_GAMES))
    parser.add_argument("--algos", nargs="+", choices=ALGOS, help=f"default: all ({SMOKE_ALGOS} with --smoke)")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: 0 1; the first one sweeps the learning rates")
    parser.add_argument("--ablation-game", choices=[*GAMES, "none"], default="kuhn_poker",
                        help="where the two ablations run ('none': skip them)")
    parser.add_argument("--model-path", nargs="+", default=[], metavar="GAME=DIR",
                        help="an existing tiny preset per game (default: build it under --out)")
    parser.add_argument("--iterations", type=int, help="every game's iterations (default: per game, SCALES)")
    parser.add_argument("--learning-rates", type=float, nargs="+", help="every game's sweep (default: per game)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per run")
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench/paper_table"))
    parser.add_argument("--override", action="append", default=[], help="a Hydra override for every run")
    parser.add_argument("--smoke", action="store_true", help="the smallest setting (CI): it checks the script, not MAGE")
    args = parser.parse_args(argv)
    args.algos = args.algos or (SMOKE_ALGOS if args.smoke else list(ALGOS))
    args.seeds = args.seeds or DEFAULT_SEEDS
    if malformed := [item for item in args.model_path if "=" not in item]:
        parser.error(f"--model-path: expected GAME=DIR, got {malformed}")
    args.model_path = dict(item.split("=", 1) for item in args.model_path)
    if unknown := set(args.model_path) - set(GAMES):
        parser.error(f"--model-path: unknown game {sorted(unknown)}; games are {GAMES}")
    if any(s < 0 for s in args.seeds) or len(set(args.seeds)) != len(args.seeds):
        parser.error("--seeds: distinct non-negative integers")
    args.scales = {}
    for game in args.games:
        scale = SMOKE if args.smoke else SCALES[game]
        scale = replace(scale, iterations=args.iterations or scale.iterations,
                        learning_rates=tuple(args.learning_rates or scale.learning_rates))
        args.scales[game] = scale

    started = time.perf_counter()
    runner = Runner(args)
    try:
        warm = {}
        for game in args.games:
            warm[game] = warm_start(args, game)
            if args.smoke:  # one smoke build serves every game (its tokenizer knows all three)
                args.model_path = {g: warm[game]["model"] for g in GAMES} | args.model_path
        first, rest = args.seeds[0], args.seeds[1:]
        sweep = runner.run([run_spec(args, g, a, first, lr, sweep=True) for g in args.games for a in args.algos
                            for lr in args.scales[g].learning_rates])
        chosen = choose_rates(sweep)
        runs = [r for r in sweep if r["spec"]["learning_rate"] == chosen[(r["spec"]["game"], r["spec"]["algo"])]]
        specs = [run_spec(args, g, a, seed, chosen[(g, a)]) for g in args.games for a in args.algos for seed in rest]
        ablation = args.ablation_game if args.ablation_game in args.games and "mage" in args.algos else None
        if ablation:
            specs += [run_spec(args, ablation, "mage", seed, chosen[(ablation, "mage")], variant)
                      for variant in ABLATIONS for seed in args.seeds]
        runs += runner.run(specs)
    finally:
        runner.close()
    summary = print_tables(args, warm, sweep, chosen, runs, ablation, time.perf_counter() - started)
    from mage import io

    io.write_json(args.out / "table.json", summary)


def choose_rates(sweep: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """Per (game, method) the rate whose run did best on the selection states (training
    opponents, final-episode success; ties go to the smaller rate)."""
    best: dict[tuple[str, str], tuple[float, float]] = {}
    for result in sweep:
        spec = result["spec"]
        key, rate = (spec["game"], spec["algo"]), spec["learning_rate"]
        result["selection_success"] = score = final_success(result["tables"]["selection"])
        if key not in best or (score, -rate) > (best[key][1], -best[key][0]):
            best[key] = (rate, score)
    return {key: rate for key, (rate, _) in best.items()}


if __name__ == "__main__":
    main()
