"""The tables of ``paper_table.py``: each run's report (``mage.report.tables``, the warm start on the
same initial states beside it), the means over seeds, the targets, the ablations."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any

import polars as pl

ALL = "all"
METHOD_NAMES = {"mage": "MAGE", "lamer": "LaMer", "gigpo": "GiGPO", "grpo": "GRPO"}
SPLIT_NAMES = {"train": "training opponents", "held_out": "held-out opponents"}
TARGET_RATIO = 0.9  # MAGE's final-episode success against its per-k ceiling (Kuhn Poker, Tic-Tac-Toe)
HELD_OUT_GAP = 0.1


def final_success(path: str) -> float:
    """The pooled final-episode success rate of an evaluation table."""
    from mage.rollout import read_trajectories
    from mage.rollout.metrics import final_episode_metrics

    metrics = final_episode_metrics(read_trajectories(path))
    return float(metrics.filter(pl.col("opponent") == ALL)["final_win_rate"][0])


def read_tables(tables: dict[str, str]) -> dict[str, pl.DataFrame]:
    """The evaluation tables of the reported splits (not the selection's)."""
    from mage.rollout import read_trajectories

    return {split: read_trajectories(path) for split, path in tables.items() if split != "selection"}


def figures(tables: dict[str, str], manifest: dict[str, Any], episodes: int,
            start: dict[str, pl.DataFrame] | None) -> dict[str, Any]:
    """Per split: the pooled row of the report (and its gains over the ``start`` tables),
    per-opponent final success."""
    from mage.report.tables import build_report

    report = build_report(read_tables(tables), manifest, {}, episodes, True, start_tables=start or None)
    out: dict[str, Any] = {}
    for split, body in report["splits"].items():
        pooled = next(r for r in body["opponents"] if r["opponent"] == ALL)
        keep = ("meta_episodes", "final_win_rate", "final_win_rate_ci", "win_ceiling_final", "final_win_vs_ceiling",
                "final_win_vs_ceiling_ci", "first_win_rate", "win_rate_gain", "win_rate_gain_ci", "invalid_rate")
        out[split] = {k: pooled[k] for k in keep}
        out[split]["per_opponent"] = {r["opponent"]: r["final_win_rate"] for r in body["opponents"] if r["opponent"] != ALL}
        out[split]["by_k"] = [{"k": r["episode"], "pass_at_k": r["pass_at_k"], "pass_at_k_ci": r["pass_at_k_ci"],
                               "memoryless": r.get("memoryless_ceiling"), "adaptive": r.get("adaptive_ceiling"),
                               "known_opponent": r["pass_at_k_ceiling"]}
                              for r in sorted(body["episodes"], key=lambda r: r["episode"]) if r["opponent"] == ALL]
        gains = next((r for r in body.get("gains", []) if r["opponent"] == ALL), None)
        if gains:
            out[split] |= {"gain_over_start": gains["final_win_rate_gain"],
                           "gain_over_start_ci": gains["final_win_rate_gain_ci"]}
    return out


def pooled_rate(rows: list[dict[str, Any]]) -> tuple[float, list[float] | None]:
    """Final success pooled over runs (seeds): the rate and its 95% Wilson interval."""
    from mage.report.intervals import wilson

    wins = sum(round(r["final_win_rate"] * r["meta_episodes"]) for r in rows)
    trials = sum(r["meta_episodes"] for r in rows)
    interval = wilson(wins, trials)
    return wins / trials, list(interval) if interval else None


def across_seeds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over seeds, the seeds' spread (max - min) and pooled intervals."""
    out: dict[str, Any] = {"seeds": [r["spec"]["seed"] for r in runs]}
    for split in ("train", "held_out"):
        rows = [r["figures"][split] for r in runs]
        finals = [row["final_win_rate"] for row in rows]
        rate, interval = pooled_rate(rows)
        ceiling = rows[0]["win_ceiling_final"]
        out[split] = {
            "final": statistics.mean(finals), "final_pooled": rate, "final_pooled_ci": interval,
            "final_per_seed": finals, "spread": max(finals) - min(finals), "ceiling": ceiling,
            "vs_ceiling": statistics.mean(finals) / ceiling if ceiling else None,
            "first": statistics.mean(row["first_win_rate"] for row in rows),
            "first_to_final": statistics.mean(row["win_rate_gain"] for row in rows),
            "invalid_rate": statistics.mean(row["invalid_rate"] for row in rows),
            "gain_over_start": statistics.mean(row["gain_over_start"] for row in rows),
            "gain_over_start_per_seed": [row["gain_over_start"] for row in rows],
        }
    return out


def cell(value: float | None, interval: list[float] | None = None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" + (f" [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]" if interval else "")


def targets(game: str, table: dict[str, dict[str, Any]]) -> list[tuple[str, bool | None, str]]:
    """The issue's targets for one game: (what, met, the figures). None: cannot be judged here."""
    if "mage" not in table:
        return []
    mage, found = table["mage"], []
    train, held = mage["train"], mage["held_out"]
    if game in ("kuhn_poker", "tic_tac_toe"):
        ratio = train["vs_ceiling"]
        found.append((f"final success >= {TARGET_RATIO} of the per-k ceiling (training opponents)",
                      None if ratio is None else ratio >= TARGET_RATIO,
                      f"{train['final']:.3f} / {train['ceiling']:.3f} = {cell(ratio)}"))
    for algo, other in table.items():
        if algo == "mage":
            continue
        margin = train["final"] - other["train"]["final"]
        spread = max(train["spread"], other["train"]["spread"])
        found.append((f"ahead of {METHOD_NAMES[algo]} by more than the seeds' spread", margin > spread,
                      f"{margin:+.3f} against a spread of {spread:.3f}"))
    gap = held["final"] - train["final"]
    found.append((f"held-out success within {HELD_OUT_GAP} of training", abs(gap) <= HELD_OUT_GAP,
                  f"{held['final']:.3f} against {train['final']:.3f} ({gap:+.3f})"))
    single = {a: t["train"]["first_to_final"] for a, t in table.items() if a in ("gigpo", "grpo")}
    gain = train["first_to_final"]
    found.append(("first-to-final gain positive and above the single-episode methods'",
                  gain > 0 and all(gain > g for g in single.values()),
                  f"MAGE {gain:+.3f}" + "".join(f", {METHOD_NAMES[a]} {g:+.3f}" for a, g in single.items())))
    return found


def print_by_k(game: str, warm: dict[str, Any], runs: list[dict[str, Any]], algos: list[str]) -> dict[str, Any]:
    """Success by episode k (pooled over a split's opponents, 95% Wilson interval) of the warm
    start and of every run, beside the three ceilings of the states played, per split; where the
    game has no memoryless and adaptive ceilings, nothing."""
    ceilings = warm["train"]["by_k"]
    if not ceilings or ceilings[0]["adaptive"] is None:
        return {}
    ks = [row["k"] for row in ceilings]
    print(f"\nSuccess by episode k on {game} (pass@k, all opponents of the split, 95% Wilson interval), beside the "
          "three ceilings of the states played:\n")
    print("| policy | seed | " + " | ".join(f"{SPLIT_NAMES[s].split()[0]} k={k}" for s in SPLIT_NAMES for k in ks) + " |")
    print("|---|---|" + "---|" * (len(ks) * len(SPLIT_NAMES)))
    rows = [("memoryless ceiling", "", {s: [r["memoryless"] for r in warm[s]["by_k"]] for s in SPLIT_NAMES}),
            ("adaptive ceiling", "", {s: [r["adaptive"] for r in warm[s]["by_k"]] for s in SPLIT_NAMES}),
            ("known-opponent ceiling", "", {s: [r["known_opponent"] for r in warm[s]["by_k"]] for s in SPLIT_NAMES})]
    for name, seed, values in rows:
        print(f"| {name} | {seed} | " + " | ".join(cell(v) for s in SPLIT_NAMES for v in values[s]) + " |")
    out: dict[str, Any] = {"ks": ks, "ceilings": {name: values for name, _, values in rows}, "policies": []}
    policies = [("warm start", "-", warm)] + [
        (METHOD_NAMES[r["spec"]["algo"]], str(r["spec"]["seed"]), r["figures"])
        for algo in algos for r in sorted((r for r in runs if r["spec"]["game"] == game and r["spec"]["algo"] == algo
                                           and not r["spec"]["variant"]), key=lambda r: r["spec"]["seed"])]
    for name, seed, figures_ in policies:
        by_split = {s: {row["k"]: row for row in figures_[s]["by_k"]} for s in SPLIT_NAMES}
        print(f"| {name} | {seed} | " + " | ".join(
            cell(by_split[s][k]["pass_at_k"], by_split[s][k]["pass_at_k_ci"]) if k in by_split[s] else "-"
            for s in SPLIT_NAMES for k in ks) + " |")
        out["policies"].append({"policy": name, "seed": seed, "by_k": {s: [by_split[s].get(k) for k in ks]
                                                                        for s in SPLIT_NAMES}})
    return out


def plot_by_k(path: Any, game: str, by_k: dict[str, Any]) -> None:
    """success_by_k-<game>.png: per split, each method's pass@k (mean over its seeds) and the warm
    start's, with the three ceilings and the value of adaptation shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import same_color

    from mage import io

    ks = by_k["ks"]
    fig, axes = plt.subplots(1, len(SPLIT_NAMES), figsize=(6 * len(SPLIT_NAMES), 4.4), squeeze=False)
    for ax, split in zip(axes[0], SPLIT_NAMES):
        ceilings = {name: values[split] for name, values in by_k["ceilings"].items()}
        ax.fill_between(ks, ceilings["memoryless ceiling"], ceilings["adaptive ceiling"], color="tab:green", alpha=0.15,
                        label="value of adaptation")
        ceiling_colours = {"memoryless ceiling": "tab:gray", "adaptive ceiling": "tab:green",
                           "known-opponent ceiling": "black"}
        for name, style in (("memoryless ceiling", "-."), ("adaptive ceiling", "-."), ("known-opponent ceiling", ":")):
            ax.plot(ks, ceilings[name], linestyle=style, color=ceiling_colours[name], label=name)
        names = list(dict.fromkeys(p["policy"] for p in by_k["policies"]))
        # tab10 without the ceilings' colours: no policy curve is read as a ceiling
        colours = [c for c in plt.get_cmap("tab10").colors if not any(
            same_color(c, taken) for taken in ceiling_colours.values())]
        for index, name in enumerate(names):
            mine = [p["by_k"][split] for p in by_k["policies"] if p["policy"] == name]
            mean = [statistics.mean(rows[i]["pass_at_k"] for rows in mine if rows[i]) for i in range(len(ks))]
            ax.plot(ks, mean, marker="o", linestyle="--" if name == "warm start" else "-",
                    color=colours[index % len(colours)], label=f"{name} ({len(mine)} seed{'s' * (len(mine) > 1)})")
        ax.set_title(f"{game}, {SPLIT_NAMES[split]}: pass@k, mean over seeds", fontsize=9)
        ax.set_xlabel("episode k")
        ax.set_xticks(ks)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    io.atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def print_tables(args: argparse.Namespace, warm: dict[str, Any], sweep: list[dict[str, Any]],
                 chosen: dict[tuple[str, str], float], runs: list[dict[str, Any]], ablation: str | None,
                 seconds: float) -> dict[str, Any]:
    """Print the Markdown of docs/results.md, "The paper's table at laptop scale"; the same figures
    as JSON-able data."""
    import torch

    from mage.population.manifest import load_manifest

    manifests = {game: load_manifest(w["manifest"]) for game, w in warm.items()}
    warm_tables = {game: read_tables(w["tables"]) for game, w in warm.items()}  # read once, paired with every run
    warm_figures = {game: figures(w["tables"], manifests[game], w["episodes"], None) for game, w in warm.items()}
    for run in runs:
        game = run["spec"]["game"]
        run["figures"] = figures(run["tables"], manifests[game], warm[game]["episodes"], warm_tables[game])
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{'CUDA ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}; "
          f"{time.strftime('%Y-%m-%d')}; {args.jobs} run(s) at once, {args.threads} threads each; "
          f"seeds {args.seeds}; wall time {seconds / 60:.1f} min; overrides {args.override or 'none'}\n")
    print("| game | iterations | groups (MAGE, LaMer; x3 single-episode) x size | mini-batch | evaluated per split "
          "| learning rates swept | warm start build (s) |")
    print("|---|---|---|---|---|---|---|")
    for game, scale in args.scales.items():
        print(f"| {game} | {scale.iterations} | {scale.groups} x {scale.group_size} | {scale.mini_batch_size} | "
              f"{scale.eval_meta_episodes} | {', '.join(f'{r:g}' for r in scale.learning_rates)} | "
              f"{warm[game]['build_seconds']:.0f} |")

    print("\nLearning-rate sweep (first seed; final success on the training opponents' selection states):\n")
    print("| game | method | learning rate | selection success | chosen |")
    print("|---|---|---|---|---|")
    for r in sweep:
        spec = r["spec"]
        mark = "yes" if chosen[(spec["game"], spec["algo"])] == spec["learning_rate"] else ""
        print(f"| {spec['game']} | {METHOD_NAMES[spec['algo']]} | {spec['learning_rate']:g} | "
              f"{r['selection_success']:.3f} | {mark} |")

    main_runs = [r for r in runs if not r["spec"]["variant"]]
    summary: dict[str, Any] = {"games": {}, "sweep": [{"spec": r["spec"], "selection_success": r["selection_success"]}
                                                      for r in sweep]}
    episodes = sorted({w["episodes"] for w in warm.values()})
    print(f"\nFinal-episode success (N = {', '.join(map(str, episodes))}), mean over seeds [95% Wilson interval, seeds pooled]; ratio to the per-k "
          "ceiling of the states played; first episode and first-to-final gain on the training opponents; the gain "
          "over the warm start (training opponents) per seed.\n")
    print("| game | method | lr | training: final | / ceiling | held-out: final | / ceiling | first | first to final "
          "| invalid | gain over warm start | seeds' spread |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for game in warm:
        w = warm_figures[game]
        print(f"| {game} | warm start | - | {cell(w['train']['final_win_rate'], w['train']['final_win_rate_ci'])} | "
              f"{cell(w['train']['final_win_vs_ceiling'], digits=2)} | "
              f"{cell(w['held_out']['final_win_rate'], w['held_out']['final_win_rate_ci'])} | "
              f"{cell(w['held_out']['final_win_vs_ceiling'], digits=2)} | {cell(w['train']['first_win_rate'])} | "
              f"{w['train']['win_rate_gain']:+.3f} | {cell(w['train']['invalid_rate'])} | - | - |")
        table = {}
        for algo in args.algos:
            mine = [r for r in main_runs if r["spec"]["game"] == game and r["spec"]["algo"] == algo]
            table[algo] = t = across_seeds(mine)
            train, held = t["train"], t["held_out"]
            gains = ", ".join(f"{g:+.3f}" for g in train["gain_over_start_per_seed"])
            print(f"| {game} | {METHOD_NAMES[algo]} | {chosen[(game, algo)]:g} | {cell(train['final'])} "
                  f"[{cell(train['final_pooled_ci'][0])}, {cell(train['final_pooled_ci'][1])}] | "
                  f"{cell(train['vs_ceiling'], digits=2)} | {cell(held['final'])} | {cell(held['vs_ceiling'], digits=2)} "
                  f"| {cell(train['first'])} | {train['first_to_final']:+.3f} | {cell(train['invalid_rate'])} | "
                  f"{gains} | {train['spread']:.3f} |")
        summary["games"][game] = {"warm_start": w, "methods": table, "targets": targets(game, table),
                                  "ceilings": {s: w[s]["win_ceiling_final"] for s in w}}

    for game in warm:
        by_k = print_by_k(game, warm_figures[game], main_runs, args.algos)
        if by_k:
            summary["games"][game]["by_k"] = by_k
            plot_by_k(args.out / f"success_by_k-{game}.png", game, by_k)

    print("\nTargets (MAGE):\n")
    print("| game | target | met | figures |")
    print("|---|---|---|---|")
    for game, body in summary["games"].items():
        for what, met, detail in body["targets"]:
            print(f"| {game} | {what} | {'-' if met is None else 'yes' if met else 'no'} | {detail} |")

    if ablation:
        print(f"\nAblations on {ablation} at MAGE's learning rate {chosen[(ablation, 'mage')]:g} (training opponents, "
              "final success; each seed, and the seeds pooled with the 95% Wilson interval):\n")
        print("| variant | per seed | pooled [95% interval] | against MAGE |")
        print("|---|---|---|---|")
        base = None
        summary["ablations"] = {}
        for variant in ("", "mixed groups", "local anchor"):
            mine = [r for r in runs if r["spec"]["game"] == ablation and r["spec"]["algo"] == "mage"
                    and r["spec"]["variant"] == variant]
            rate, interval = pooled_rate([r["figures"]["train"] for r in mine])
            base = rate if base is None else base
            name = variant or "MAGE (stationary groups, global anchor)"
            summary["ablations"][name] = {"pooled": rate, "interval": interval,
                                          "per_seed": [r["figures"]["train"]["final_win_rate"] for r in mine]}
            per_seed = ", ".join(f"{r['figures']['train']['final_win_rate']:.3f}" for r in mine)
            print(f"| {name} | {per_seed} | {cell(rate, interval)} | {rate - base:+.3f} |")

    print("\n| run | train (s) | evaluate (s) | last KL | last invalid rate (rollout) |")
    print("|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['name']} | {r['train_seconds']:.0f} | {r['eval_seconds']:.0f} | {cell(r['last_kl'])} | "
              f"{cell(r['last_invalid_rate'])} |")
    summary["runs"] = [{k: r[k] for k in ("name", "spec", "figures", "train_seconds", "eval_seconds")} for r in runs]
    summary["wall_seconds"] = seconds
    return summary
