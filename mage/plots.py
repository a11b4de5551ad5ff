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


def plot_success_by_episode(report: Mapping[str, Any], path: str | Path) -> Path:
    """pass@k and the win rate of episode k per opponent, one panel per split, with each
    opponent's ceiling (max win probability) as a dotted line in the same colour."""
    plt = _pyplot()
    splits = list(report["splits"])
    fig, axes = plt.subplots(1, len(splits), figsize=(6 * len(splits), 4.2), squeeze=False)
    for ax, split in zip(axes[0], splits):
        rows = report["splits"][split]["episodes"]
        opponents = sorted({r["opponent"] for r in rows})
        colours = plt.get_cmap("tab10")
        for index, opponent in enumerate(opponents):
            mine = sorted((r for r in rows if r["opponent"] == opponent), key=lambda r: r["episode"])
            ks = [r["episode"] for r in mine]
            colour = colours(index % 10)
            width = 2.5 if opponent == "all" else 1.5
            ax.plot(ks, [r["pass_at_k"] for r in mine], marker="o", color=colour, linewidth=width, label=f"{opponent} pass@k")
            ax.plot(ks, [r["win_rate"] for r in mine], marker="x", linestyle="--", color=colour, alpha=0.6)
            if mine and mine[0].get("max_win_probability") is not None:
                ax.axhline(mine[0]["max_win_probability"], color=colour, linestyle=":", alpha=0.7)
        ax.set_title(f"{split}: success by episode (solid pass@k, dashed win rate of k, dotted ceiling)", fontsize=9)
        ax.set_xlabel("episode k")
        ax.set_ylabel("rate")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return _save(fig, path)


def plot_learning_curves(history: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Per-iteration training curves: final-episode win rate per opponent, mean return,
    invalid rate, and the update's KL and loss."""
    plt = _pyplot()
    iterations = [m["iteration"] for m in history]
    opponents = sorted({k.split("/")[1] for m in history for k in m if k.startswith("rollout/") and k.endswith("/final_win_rate")})
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
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
    for ax in axes.flat:
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def moving_average(values: Sequence[float | None], window: int = 5) -> list[float | None]:
    """Trailing mean over the last ``window`` values (fewer at the start; None values skipped)."""
    out: list[float | None] = []
    for i in range(len(values)):
        recent = [v for v in values[max(0, i - window + 1) : i + 1] if v is not None]
        out.append(sum(recent) / len(recent) if recent else None)
    return out


def _save(fig: Any, path: str | Path) -> Path:
    plt = _pyplot()
    try:
        return io.atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    finally:
        plt.close(fig)
