"""Plots a person would rather look at than a table (matplotlib, written atomically as PNG)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mage import io


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    return plt


def whole_numbers(axis: Any) -> None:
    """Ticks at whole numbers only, for an axis of iterations or episodes."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def evaluation_sampling(report: Mapping[str, Any]) -> str:
    """Under an evaluation figure: its figures are at the evaluation's sampling."""
    temperature = (report.get("about", {}).get("sampling") or {}).get("temperature")
    at = "" if temperature is None else f" (temperature {temperature:g})"
    return f"Evaluation at the evaluation sampling{at}, not the training rollouts' sampling."


def plot_success_by_episode(report: Mapping[str, Any], path: str | Path) -> Path:
    """pass@k per opponent with its 95% interval, one panel per split: the evaluated policy
    solid, the starting policy dashed (when it was evaluated), and the ceiling of pass@k
    dotted, all in the opponent's colour."""
    return _save(success_by_episode_figure(report), path)


def success_by_episode_figure(report: Mapping[str, Any]) -> Any:
    plt = _pyplot()
    splits = list(report["splits"])
    fig, axes = plt.subplots(1, len(splits), figsize=(6 * len(splits), 4.4), squeeze=False)
    for ax, split in zip(axes[0], splits):
        body = report["splits"][split]
        rows = body["episodes"]
        start = body.get("start", {}).get("episodes", [])
        opponents = sorted({r["opponent"] for r in rows})
        colours = plt.get_cmap("tab10")
        for index, opponent in enumerate(opponents):
            mine = sorted((r for r in rows if r["opponent"] == opponent), key=lambda r: r["episode"])
            ks = [r["episode"] for r in mine]
            colour = colours(index % 10)
            width = 2.5 if opponent == "all" else 1.4
            low = [max(0.0, r["pass_at_k"] - r["pass_at_k_ci"][0]) for r in mine]
            high = [max(0.0, r["pass_at_k_ci"][1] - r["pass_at_k"]) for r in mine]
            ax.errorbar(ks, [r["pass_at_k"] for r in mine], yerr=[low, high], marker="o", color=colour,
                        linewidth=width, capsize=3, label=opponent)
            before = sorted((r for r in start if r["opponent"] == opponent), key=lambda r: r["episode"])
            if before:
                ax.plot([r["episode"] for r in before], [r["pass_at_k"] for r in before], linestyle="--",
                        color=colour, alpha=0.6, linewidth=1)
            ax.plot(ks, [r["pass_at_k_ceiling"] for r in mine], linestyle=":", color=colour, alpha=0.8)
        ax.set_title(f"{split}: pass@k (solid, 95% CI), at the start (dashed), ceiling (dotted)", fontsize=9)
        ax.set_xlabel("episode k")
        whole_numbers(ax.xaxis)
        ax.set_ylabel("won within the first k episodes")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    return _with_note(fig, evaluation_sampling(report))


def has_adaptation_ceilings(report: Mapping[str, Any]) -> bool:
    """Whether some split has the memoryless and adaptive ceilings (exact ones only)."""
    return any(r["opponent"] == "all" and r.get("adaptive_ceiling") is not None
               for body in report["splits"].values() for r in body["episodes"])


def plot_adaptation(report: Mapping[str, Any], path: str | Path) -> Path:
    """Success by episode k, pooled over a split's opponents, against the three ceilings: the
    evaluated policy solid with its 95% interval, the starting policy dashed, the memoryless
    and adaptive ceilings with the value of adaptation shaded between them, the known-opponent
    ceiling dotted. One panel per split that has the ceilings."""
    return _save(adaptation_figure(report), path)


def adaptation_figure(report: Mapping[str, Any]) -> Any:
    plt = _pyplot()
    splits = [split for split, body in report["splits"].items()
              if any(r["opponent"] == "all" and r.get("adaptive_ceiling") is not None for r in body["episodes"])]
    fig, axes = plt.subplots(1, len(splits), figsize=(6 * len(splits), 4.4), squeeze=False)
    for ax, split in zip(axes[0], splits):
        body = report["splits"][split]
        rows = sorted((r for r in body["episodes"] if r["opponent"] == "all"), key=lambda r: r["episode"])
        ks = [r["episode"] for r in rows]
        memoryless, adaptive = [r["memoryless_ceiling"] for r in rows], [r["adaptive_ceiling"] for r in rows]
        ax.fill_between(ks, memoryless, adaptive, color="tab:green", alpha=0.15, label="value of adaptation")
        ax.plot(ks, memoryless, color="tab:gray", linestyle="-.", label="memoryless ceiling")
        ax.plot(ks, adaptive, color="tab:green", linestyle="-.", label="adaptive ceiling")
        ax.plot(ks, [r["pass_at_k_ceiling"] for r in rows], color="black", linestyle=":", label="known-opponent ceiling")
        low = [max(0.0, r["pass_at_k"] - r["pass_at_k_ci"][0]) for r in rows]
        high = [max(0.0, r["pass_at_k_ci"][1] - r["pass_at_k"]) for r in rows]
        ax.errorbar(ks, [r["pass_at_k"] for r in rows], yerr=[low, high], marker="o", color="tab:blue", linewidth=2.5,
                    capsize=3, label="evaluated (95% CI)")
        start = sorted((r for r in body.get("start", {}).get("episodes", []) if r["opponent"] == "all"),
                       key=lambda r: r["episode"])
        if start:
            ax.plot([r["episode"] for r in start], [r["pass_at_k"] for r in start], color="tab:blue", linestyle="--",
                    alpha=0.6, label="start")
        ax.set_title(f"{split}: success by episode k (all opponents) against the three ceilings", fontsize=9)
        ax.set_xlabel("episode k")
        whole_numbers(ax.xaxis)
        ax.set_ylabel("won within the first k episodes")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    return _with_note(fig, evaluation_sampling(report))


def plot_gains(report: Mapping[str, Any], path: str | Path) -> Path:
    """Did it learn? Per opponent, the final-episode win rate (and win-or-draw rate where
    draws happen) at the start and now, with the 95% interval of the paired gain."""
    return _save(gains_figure(report), path)


def gains_figure(report: Mapping[str, Any]) -> Any:
    plt = _pyplot()
    splits = [s for s, body in report["splits"].items() if "gains" in body]
    fig, axes = plt.subplots(1, len(splits), figsize=(6.5 * len(splits), 4.4), squeeze=False)
    for ax, split in zip(axes[0], splits):
        rows = report["splits"][split]["gains"]
        names = [r["opponent"] for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["final_win_rate_start"] for r in rows], width=0.4, color="tab:gray",
               label="start: final-episode win rate")
        now = [r["final_win_rate"] for r in rows]
        gain_ci = [r["final_win_rate_gain_ci"] for r in rows]
        # the interval of the gain, drawn around the evaluated policy's bar
        low = [max(0.0, r["final_win_rate_gain"] - ci[0]) for r, ci in zip(rows, gain_ci)]
        high = [max(0.0, ci[1] - r["final_win_rate_gain"]) for r, ci in zip(rows, gain_ci)]
        ax.bar([i + 0.2 for i in x], now, width=0.4, color="tab:blue", yerr=[low, high], capsize=3,
               label="evaluated (error bar: 95% CI of the gain)")
        if any(r["final_win_or_draw_rate"] != r["final_win_rate"] for r in rows):
            ax.scatter([i + 0.2 for i in x], [r["final_win_or_draw_rate"] for r in rows], marker="_", s=300,
                       color="tab:green", label="evaluated: win or draw", zorder=3)
            ax.scatter([i - 0.2 for i in x], [r["final_win_or_draw_rate_start"] for r in rows], marker="_", s=300,
                       color="darkgreen", label="start: win or draw", zorder=3)
        ax.set_xticks(list(x))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{split}: final-episode success, start vs evaluated", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7, loc="best")
    return _with_note(fig, evaluation_sampling(report))


def plot_learning_curves(history: Sequence[Mapping[str, Any]], path: str | Path,
                         training: Mapping[str, Any] | None = None) -> Path:
    """Per-iteration training curves: final-episode win rate per opponent, mean return,
    invalid rate, and the update's KL and loss (on Kuhn Poker also the exploitability and the
    league's ratings); under them ``training``'s sentence
    (:func:`mage.report.tables.training_summary`: the training rollouts' invalid replies and KL, at
    the training sampling)."""
    return _save(learning_curves_figure(history, training), path)


def learning_curves_figure(history: Sequence[Mapping[str, Any]], training: Mapping[str, Any] | None = None) -> Any:
    plt = _pyplot()
    iterations = [m["iteration"] for m in history]
    opponents = sorted({k.split("/")[1] for m in history for k in m if k.startswith("rollout/") and k.endswith("/final_win_rate")})
    kuhn = any("train/exploitability" in m for m in history)  # a game whose exploitability is measured: a third column
    fig, axes = plt.subplots(2, 3 if kuhn else 2, figsize=(16 if kuhn else 11, 7), squeeze=False)
    for opponent in opponents:
        key = f"rollout/{opponent}/final_win_rate"
        values = [m.get(key) for m in history]
        if opponent == "all":  # each iteration draws a few deals: the trend is in the moving average
            axes[0, 0].plot(iterations, values, color="black", alpha=0.3, linewidth=1)
            axes[0, 0].plot(iterations, moving_average(values), color="black", linewidth=2.5, label="all (moving average)")
        else:
            axes[0, 0].plot(iterations, values, label=opponent, linewidth=1, alpha=0.6)
    axes[0, 0].set_title("final-episode win rate (training rollouts)")
    axes[0, 0].legend(fontsize=7)
    for key, label in (("rollout/all/final_mean_return", "final episode"), ("rollout/all/first_mean_return", "first episode")):
        values = [m.get(key) for m in history]
        line, = axes[0, 1].plot(iterations, values, alpha=0.35, linewidth=1)
        axes[0, 1].plot(iterations, moving_average(values), color=line.get_color(), linewidth=2, label=f"{label} (moving average)")
    axes[0, 1].set_title("mean return (all opponents)")
    axes[0, 1].legend(fontsize=7)
    axes[1, 0].plot(iterations, [m.get("rollout/invalid_rate") for m in history], color="tab:red")
    axes[1, 0].set_title("invalid-action rate")
    axes[1, 1].plot(iterations, [m.get("train/kl") for m in history], label="KL to reference")
    axes[1, 1].plot(iterations, [m.get("train/loss") for m in history], label="loss")
    axes[1, 1].set_title("update")
    axes[1, 1].legend(fontsize=7)
    if kuhn:
        axes[0, 2].plot(iterations, [m.get("train/exploitability") for m in history], color="tab:purple")
        axes[0, 2].set_title("exploitability of the first episode's policy\n(payoff per episode, in poker chips; "
                             "an equilibrium: 0)")
        players = sorted({k.split("/")[1] for m in history for k in m if k.startswith("league/") and k.endswith("/mu")})
        for player in players:  # population.league: the openskill ratings
            axes[1, 2].plot(iterations, [m.get(f"league/{player}/mu") for m in history], label=player,
                            linewidth=2.5 if player == "agent" else 1)
        axes[1, 2].set_title("league ratings (openskill mu)" if players else "no league")
        if players:
            axes[1, 2].legend(fontsize=7)
    temperature = (training or {}).get("temperature")
    fig.suptitle("training rollouts, at the training sampling"
                 + ("" if temperature is None else f" (temperature {temperature:g})"), fontsize=10)
    for ax in axes.flat:
        ax.set_xlabel("iteration")
        whole_numbers(ax.xaxis)
        ax.grid(alpha=0.3)
    return _with_note(fig, (training or {}).get("sentence"))


def moving_average(values: Sequence[float | None], window: int = 5) -> list[float | None]:
    """Trailing mean over the last ``window`` values (fewer at the start; None values skipped)."""
    out: list[float | None] = []
    for i in range(len(values)):
        recent = [v for v in values[max(0, i - window + 1) : i + 1] if v is not None]
        out.append(sum(recent) / len(recent) if recent else None)
    return out


def _with_note(fig: Any, note: str | None) -> Any:
    """The figure laid out with ``note`` in words under its panels."""
    import textwrap

    if not note:
        fig.tight_layout()
        return fig
    lines = textwrap.wrap(note, width=int(fig.get_figwidth() * 16))
    fig.text(0.5, 0.01, "\n".join(lines), ha="center", va="bottom", fontsize=8)
    fig.tight_layout(rect=(0, 0.03 + 0.03 * len(lines), 1, 1))
    return fig


def _save(fig: Any, path: str | Path) -> Path:
    plt = _pyplot()
    try:
        return io.atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    finally:
        plt.close(fig)
