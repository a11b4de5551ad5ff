"""Faults, probed as an adversarial user would probe the pipeline (issue 18), with the goal
"nothing lost, nothing silent, nothing left behind". Every probe runs the real command line
(``python -m flows ...``, ``dvc repro``) in a scratch clone of this working tree:

- kills: random SIGKILLs of the ``train`` flow and of ``dvc repro``, each followed by a
  restart, until the run finishes; the final weights are compared bitwise with an
  uninterrupted run, every process the killed one started must end, and no temporary may
  remain. Iterations computed twice (beyond the one a kill interrupted) are counted.
- corruptions: damaged checkpoint tensors, ``final.json``, the population manifest, and
  truncated, empty, non-YAML and missing ``--config`` files.
- configs: bad values (the test suite's catalogue, plus the probe's own list), each of which
  must stop the command line with one ``config error:`` line naming the key, before a flow.
- server: a Prefect API that is down, one that accepts connections and never answers, two
  first starts sharing a new Prefect home, and a second writer of a run.

    python benchmarks/faults.py                       # everything (about 25 minutes on 2 cores)
    python benchmarks/faults.py --only configs,server
    python benchmarks/faults.py --kills 10 --seed 1

Prints one table per class and a summary; ``--json FILE`` keeps every probe's record.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.fault_probes import (
    KILLS_PER_CAMPAIGN,
    clone_working_tree,
    debris,
    kill_campaign,
    one_line_error,
    run_command,
    weights_digest,
)

#: A run small enough to kill many times: the test suite's tiny lifecycle, four iterations.
SMALL = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=512",
    "model.tiny.corpus_meta_episodes=8", "model.tiny.bc_meta_episodes=32", "model.tiny.bc_steps=2", "model.tiny.bc_short_steps=2",
    "train.iterations=4", "engine.groups=2", "engine.group_size=2", "engine.episodes=2",
    "engine.sampling.max_new_tokens=8", "eval.meta_episodes=4", "eval.episodes=2", "eval.sampling.max_new_tokens=8",
]


def paths(root: Path) -> list[str]:
    """Everything a command run from this checkout writes goes under ``root``."""
    return [f"paths.artifacts={root}/artifacts", f"paths.results={root}/results"]


def probe_kills(work: Path, kills: int, rng: random.Random) -> list[dict]:
    """Reference run, then kill campaigns of the train flow and of `dvc repro`. The train flow's
    campaigns share one prepared warm start (building it would take most of each attempt, and
    most kills would land there); `dvc repro` builds its own, as a user's would."""
    reference = work / "reference"
    model = [f"model.path={work / 'model'}"]
    run_command([sys.executable, "-m", "flows", "prepare_model", *SMALL, *model, *paths(reference)],
                REPO, reference / "home", check=True)
    started = time.monotonic()
    run_command([sys.executable, "-m", "flows", "train", *SMALL, *model, *paths(reference)],
                REPO, reference / "home", check=True)
    duration = time.monotonic() - started
    expected = weights_digest(reference / "artifacts")
    print(f"reference run: {duration:.0f} s, final weights {expected[:12]}", flush=True)
    records = []
    flow_kills, dvc_kills = (kills + 1) // 2, kills // 2
    campaign = 0
    while sum(r["kills"] for r in records if r["target"] == "train flow") < flow_kills:
        campaign += 1
        root = work / f"flow-{campaign}"
        command = [sys.executable, "-m", "flows", "train", *SMALL, *model, *paths(root)]
        done = sum(r["kills"] for r in records if r["target"] == "train flow")
        record = kill_campaign("train flow", command, REPO, root / "home", root / "artifacts", duration, rng,
                               min(KILLS_PER_CAMPAIGN, flow_kills - done))
        record["bitwise"] = weights_digest(root / "artifacts") == expected
        records.append(record)
        print(json.dumps({k: v for k, v in record.items() if k != "attempts"}), flush=True)
    while sum(r["kills"] for r in records if r["target"] == "dvc repro") < dvc_kills:
        campaign += 1
        root = work / f"dvc-{campaign}"
        clone_working_tree(REPO, root)
        subprocess.run([sys.executable, "-m", "mage", "config", "--output", "params.yaml", *SMALL], cwd=root, check=True)
        done = sum(r["kills"] for r in records if r["target"] == "dvc repro")
        record = kill_campaign("dvc repro", [sys.executable, "-m", "dvc", "repro"], root, work / f"dvc-{campaign}-home",
                               root / "artifacts", duration * 4, rng, min(KILLS_PER_CAMPAIGN, dvc_kills - done))
        record["bitwise"] = weights_digest(root / "artifacts") == expected
        status = run_command([sys.executable, "-m", "dvc", "status"], root, work / f"dvc-{campaign}-home")
        record["dvc_status_clean"] = "up to date" in status["output"]
        records.append(record)
        print(json.dumps({k: v for k, v in record.items() if k != "attempts"}), flush=True)
    return records


def probe_corruptions(work: Path) -> list[dict]:
    """Damage each file a run reads, then run the command that reads it. Each case trains its
    own small run first (Prefect's cached results hold absolute paths, so a copied run would
    still read the original's files)."""
    flows = [sys.executable, "-m", "flows"]
    small = [*SMALL, f"model.path={work / 'model'}", "paths.artifacts={artifacts}", "paths.results={root}/results"]
    if not (work / "model" / "config.json").is_file():  # --only corruptions: prepare the shared warm start
        run_command([*flows, "prepare_model", *SMALL, f"model.path={work / 'model'}", *paths(work / "prepare")], REPO,
                    work / "prepare" / "home", check=True)
    records = []

    def case(name: str, damage, command: list[str], expect: str, trained: bool = True) -> None:
        root = work / f"corrupt-{len(records)}"
        root.mkdir(parents=True, exist_ok=True)

        def here(parts: list[str]) -> list[str]:
            return [part.replace("{artifacts}", str(root / "artifacts")).replace("{root}", str(root)) for part in parts]
        if trained:
            run_command(here([*flows, "train", *small]), REPO, root / "home", check=True)
        target = damage(root)
        result = run_command(here(command), REPO, root / "home")
        # As designed: one line naming the file and the remedy, or the file recomputed with a
        # WARNING naming it (or its checkpoint); `expect` is the outcome the design predicts.
        warned = result["rc"] == 0 and "Traceback" not in result["output"] and any(
            "WARNING" in line and (target.name in line or target.parent.name in line)
            for line in result["output"].splitlines())
        outcome = "error" if one_line_error(result, target) else "warning" if warned else "neither"
        records.append({"case": name, "file": str(target.relative_to(root)), "expected": expect, "outcome": outcome,
                        "rc": result["rc"], "traceback": "Traceback" in result["output"],
                        "as_designed": outcome != "neither",
                        "seconds": round(result["seconds"], 1), "message": result["last_error"],
                        "warnings": [line for line in result["output"].splitlines() if "WARNING" in line][:5]})
        print(json.dumps(records[-1]), flush=True)

    def final_checkpoint(root: Path) -> Path:
        final = next((root / "artifacts" / "runs").glob("*/final.json"))
        return final.parent / json.loads(final.read_text())["checkpoint"]  # relative to the run

    def garbage(name: str):
        def damage(root: Path) -> Path:
            target = final_checkpoint(root) / name
            target.write_bytes(os.urandom(4096))
            return target
        return damage

    def garble(pattern: str, first: list[str] | None = None):
        def damage(root: Path) -> Path:
            if first:  # write the file first
                run_command([part.replace("{artifacts}", str(root / "artifacts")).replace("{root}", str(root))
                             for part in first], REPO,
                            root / "home", check=True)
            target = next((root / "artifacts").rglob(pattern))
            target.write_text("{\n" + target.read_text()[: len(target.read_text()) // 2])
            return target
        return damage

    def config_file(text: str | None):
        def damage(root: Path) -> Path:
            target = root / "params.yaml"
            subprocess.run([sys.executable, "-m", "mage", "config", "--output", str(target), *SMALL, *paths(root)],
                           cwd=REPO, check=True)
            if text is None:
                target.unlink()
            elif text == "truncated":
                cut = target.read_text()[:1500]
                target.write_text(cut[: cut.rfind("\n") + 1])
            else:
                target.write_text(text)
            return target
        return damage

    longer = [*flows, "train", *[s for s in small if not s.startswith("train.iterations")], "train.iterations=5"]
    case("garbage weights, valid manifest (evaluate)", garbage("model.safetensors"),
         [*flows, "evaluate", *small, "--no-report"], "error")
    case("garbage weights, valid manifest (resume)", garbage("model.safetensors"), longer, "warning")
    case("garbage optimizer state, valid manifest (resume)", garbage("trainer_state.safetensors"), longer, "warning")
    case("garbled final.json (evaluate)", garble("final.json"), [*flows, "evaluate", *small, "--no-report"], "warning")
    case("garbled population manifest", garble("population/*.json", [*flows, "seed_population", *small]),
         [*flows, "seed_population", *small], "warning", trained=False)
    for label, text in (("truncated params.yaml", "truncated"), ("empty config file", ""),
                        ("config file that is not YAML", "game: {name: kuhn\n  params: ["), ("missing config file", None)):
        case(label, config_file(text), [*flows, "train", "--config", "{root}/params.yaml"], "error", trained=False)
    return records


#: The probe's own bad values (the ones the first probe found slipping through), beside the
#: test suite's catalogue: each must be a `config error:` naming its key.
OWN_BAD_CONFIGS = [
    "engine.groups=abc", "engine.groups=0", "engine.groups=-2", "engine.groups=100000000", "engine.hf.batch_size=0",
    "engine.max_prompt_tokens=0", "model.device=tpu", "train.betas=[2,3]", "train.betas=[0.9]",
    "population.seat_split=1.5", "population.seat_split=-0.1", "game.params.turn_limit=0", "train.grad_clip=-1",
    "algo.kl_coef=-1", "algo.clip_ratio=-0.5", "game.invalid_penalty=-5", "train.learning_rate=1e6",
    "train.keep_checkpoints=0", "train.eval_every=-1", "flow.retry_delay_seconds=-1", "engine.scripted.invalid_rate=2",
    "run.name=", "run.name=../../..", "engine.sampling.max_new_tokens=100000000", "model.tiny.num_heads=3",
    "model.tiny.num_kv_heads=3", "population.train.intermediate.share=0.1", "game=sokoban game.params.max_moves=30",
    "game=tic_tac_toe game.params.turn_limit=2", "nonexistent.key=1", "+train.extra=1", "algo=nope", "train=",
    "seed=-1", "flow.api_timeout_seconds=0",
]


def probe_configs() -> list[dict]:
    """Each bad value through the flows' command line in-process, with the flow replaced by a
    sentinel: rejected before work, one line, naming the key."""
    import contextlib
    import io as text_io

    from hypothesis import find

    import flows
    import flows.__main__ as cli
    from tests.test_config_validation import BAD_VALUES, override

    cases = [c.split() for c in OWN_BAD_CONFIGS] + [[override(k, find(s, lambda _: True))] for k, s in sorted(BAD_VALUES.items())]
    records, real_load = [], flows.load
    for overrides in cases:
        started: list[str] = []
        flows.load = lambda name, started=started: started.append(name) or (lambda **_: None)
        err = text_io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                rc = cli.main(["train", *overrides])
            traceback = None
        except BaseException as error:  # noqa: BLE001 (a traceback is what the probe looks for)
            rc, traceback = None, f"{type(error).__name__}: {error}"
        finally:
            flows.load = real_load
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        key = overrides[-1].split("=")[0].lstrip("+")
        parts = key.split(".")
        # the key, a dotted prefix of it (a rule over a whole section: "population.train
        # shares sum to 0.7"), or its section with the leaf ("train: unknown key(s) ['extra']")
        named = bool(lines) and (any(".".join(parts[:n]) in lines[0] for n in range(len(parts), 1, -1))
                                 or (parts[0] in lines[0] and parts[-1] in lines[0]))
        records.append({"overrides": " ".join(overrides), "rc": rc, "started_a_flow": bool(started),
                        "one_line": len(lines) == 1 and lines[0].startswith("config error:"), "names_the_key": named,
                        "traceback": traceback, "message": lines[0] if lines else ""})
    return records


def probe_server(work: Path) -> list[dict]:
    from benchmarks.fault_probes import concurrent_first_starts, hung_and_down_servers, second_writer

    return [*hung_and_down_servers(work, SMALL), *concurrent_first_starts(work, trials=3),
            second_writer(work, SMALL)]


def table(title: str, header: list[str], rows: list[list]) -> None:
    print(f"\n### {title}\n\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="kills,corruptions,configs,server")
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs in all, half of them of dvc repro")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", help="scratch folder (default: a new temporary one, removed afterwards)")
    parser.add_argument("--json", help="write every probe's record here")
    args = parser.parse_args()
    os.environ |= {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DVC_NO_ANALYTICS": "1", "DO_NOT_TRACK": "1",
                   "TOKENIZERS_PARALLELISM": "false"}
    os.environ.pop("PREFECT_API_URL", None)  # every command starts its own temporary server
    work = Path(args.work or tempfile.mkdtemp(prefix="mage-faults-"))
    os.environ["PREFECT_HOME"] = str(work / "home-in-process")
    only = set(args.only.split(","))
    started, results = time.monotonic(), {}
    print(f"machine: {platform.node()}, {os.cpu_count()} cores, python {platform.python_version()}; work {work}")
    if "kills" in only:
        records = results["kills"] = probe_kills(work, args.kills, random.Random(args.seed))
        table("SIGKILLs", ["target", "kills", "where they landed", "restarts to finish", "bitwise", "computed twice",
                           "orphans", "debris left", "max seconds to die"],
              [[r["target"], r["kills"], ", ".join(f"{k} {v}" for k, v in sorted(r["landed"].items())), r["restarts"],
                r["bitwise"], r["computed_twice"], r["orphans"], r["debris"], r["max_seconds_to_die"]] for r in records])
    if "corruptions" in only:
        records = results["corruptions"] = probe_corruptions(work)
        table("Corruptions", ["case", "file", "outcome (predicted)", "rc", "traceback", "as designed", "message"],
              [[r["case"], r["file"], f"{r['outcome']} ({r['expected']})", r["rc"], r["traceback"], r["as_designed"],
                (r["message"] or next(iter(r["warnings"]), ""))[:110]] for r in records])
    if "configs" in only:
        records = results["configs"] = probe_configs()
        bad = [r for r in records if r["started_a_flow"] or not r["one_line"] or not r["names_the_key"] or r["traceback"]]
        table("Bad configurations", ["probes", "rejected before work", "one line", "names the key", "tracebacks",
                                     "started a flow"],
              [[len(records), sum(r["rc"] == 2 and not r["started_a_flow"] for r in records),
                sum(r["one_line"] for r in records), sum(r["names_the_key"] for r in records),
                sum(bool(r["traceback"]) for r in records), sum(r["started_a_flow"] for r in records)]])
        for r in bad:
            print(f"- not as designed: `{r['overrides']}`: {r['traceback'] or r['message']}")
    if "server" in only:
        records = results["server"] = probe_server(work)
        table("Server and concurrency", ["case", "rc", "seconds", "as designed", "message"],
              [[r["case"], r["rc"], r["seconds"], r["as_designed"], r["message"][:100]] for r in records])
    print(f"\ntotal wall time: {(time.monotonic() - started) / 60:.1f} min")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    leftovers = debris(work)
    print(f"temporaries left anywhere under the work folder: {len(leftovers)}" + (f" {leftovers}" if leftovers else ""))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
