"""Opponent populations: declared in ``params/population/<game>.yaml``, seeded into a manifest.

The **population manifest** is the first artifact of the lifecycle: every opponent (id,
game, rule and parameters, split, share, description) with its ceilings per seat. It is
plain JSON with sorted keys, written atomically, so DVC can version it and equal inputs
give equal bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from mage import __version__, io
from mage.config.sections import SPLITS, PopulationEntry
from mage.games import Game, checked_game
from mage.opponents import opponent_for
from mage.population import ceilings

if TYPE_CHECKING:
    from mage.settings import Settings

MANIFEST_SCHEMA_VERSION = 1


def _seat_ceilings(entry: PopulationEntry, game: Game, seat: int, n_games: int, seed: int,
                   base_params: Mapping[str, Any]) -> dict[str, Any]:
    if game.num_players == 1:
        success = ceilings.single_player_ceiling(game, n_games, seed)
        best = ceilings.single_player_return_ceiling(game, success, n_games, seed)
        return {"max_win_probability": success.to_dict(), "best_response_return": best.to_dict()}
    opponent = opponent_for(entry, base_params)
    figures = ceilings.opponent_ceilings(game.openspiel_game, opponent, seat, n_games=n_games, seed=seed)
    payoff = figures["best_response_payoff"]
    return {
        "best_response_payoff": payoff.to_dict(),
        "best_response_return": payoff.scaled(game.payoff_scale).to_dict(),
        "max_win_probability": figures["max_win_probability"].to_dict(),
    }


def across_episodes(settings: Settings, split: str) -> dict[str, dict[str, Any]]:
    """The three ceilings per episode k (:mod:`mage.population.ceilings.across_episodes`) of every entry of
    ``split``, over that split's prior (training: the shares; held out: equal weights, as
    evaluation plays them), per seat and averaged over seats; where they cannot be computed,
    ``{"unavailable": reason}`` for each entry."""
    population = settings.population
    entries = [e for e in population.entries if e.split == split]
    if not entries:
        return {}
    game = checked_game(settings.game.name, settings.game.params, "game.params")
    if any(e.game_params for e in entries) or game.num_players == 1:
        reason = "a one-player puzzle: nothing about the counterpart is hidden" if game.num_players == 1 else \
            "entries change the game's parameters (game_params)"
        return {e.id: {"unavailable": reason} for e in entries}
    equal = split != "train"
    opponents = {e.id: (opponent_for(e, settings.game.params), 1.0 if equal else e.share) for e in entries}
    try:
        per_seat = {f"seat_{seat}": ceilings.ceilings_across_episodes(game, opponents, seat, population.ceilings.episodes)
                    for seat in range(game.num_players)}
    except ceilings.Unavailable as error:
        return {e.id: {"unavailable": str(error)} for e in entries}
    weights = {"seat_0": 1.0 - population.seat_split, "seat_1": population.seat_split}
    records = {}
    for entry in entries:
        record: dict[str, Any] = {"prior": "shares" if not equal else "equal", "episodes": population.ceilings.episodes}
        for seat, kinds in per_seat.items():
            record[seat] = {kind: figures[entry.id] for kind, figures in kinds.items()}
        record["mean"] = {kind: [sum(weights[seat] * per_seat[seat][kind][entry.id]["value"][k] for seat in per_seat)
                                 for k in range(population.ceilings.episodes)] for kind in ceilings.KINDS}
        records[entry.id] = record
    return records


def seed_population(settings: Settings, progress: bool = True) -> dict[str, Any]:
    """Build the population manifest: every entry with its ceilings per seat, and the three
    ceilings per episode k over its split (``across_episodes``, :func:`across_episodes`)."""
    population, base_params = settings.population, settings.game.params
    seat_split, n_games, seed = population.seat_split, population.ceilings.n_games, population.ceilings.seed
    per_k = {split: across_episodes(settings, split) for split in SPLITS}
    records = []
    for entry in tqdm(population.entries, desc="ceilings", unit="opponent", disable=not progress):
        game = entry.make_game(base_params)
        seats = range(game.num_players)
        per_seat = {f"seat_{s}": _seat_ceilings(entry, game, s, n_games, seed, base_params) for s in seats}
        opponent = opponent_for(entry, base_params)
        record = asdict(entry) | {
            "description": opponent.description if opponent else f"level setting {dict(entry.game_params)}",
            "deterministic": opponent.deterministic if opponent else True,
            "explicit_policy": opponent.explicit if opponent else True,
            "ceilings": per_seat | {"mean": _seat_mean(per_seat, seat_split)},
            "across_episodes": per_k[entry.split][entry.id],
        }
        records.append(record)
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "mage_version": __version__,
        "game": settings.game.name,
        "game_params": base_params,
        "seat_split": seat_split if len(seats) > 1 else 0.0,
        "opponents": records,
    }


def split_ceilings(manifest: Mapping[str, Any], split: str) -> dict[str, list[float]] | str | None:
    """The three ceilings per k of ``split`` pooled over its opponents with the split's prior
    (training: shares; held out: equal) and averaged over seats: ``{kind: [pass@1, ...]}``;
    the reason where they are unavailable; None where the split is empty."""
    records = [o for o in manifest["opponents"] if o["split"] == split]
    if not records:
        return None
    per_k = [o.get("across_episodes") or {"unavailable": "not in this manifest (seeded before they existed)"}
             for o in records]
    if "unavailable" in per_k[0]:
        return per_k[0]["unavailable"]
    weights = [o["share"] if split == "train" else 1.0 for o in records]
    total = sum(weights)
    return {kind: [sum(w * figures["mean"][kind][k] for w, figures in zip(weights, per_k)) / total
                   for k in range(len(per_k[0]["mean"][kind]))] for kind in ceilings.KINDS}


def adaptation_lines(manifest: Mapping[str, Any]) -> list[str]:
    """Per split, the three ceilings by k and the value of adaptation, in words."""
    lines = []
    for split in SPLITS:
        figures = split_ceilings(manifest, split)
        if figures is None:
            continue
        if isinstance(figures, str):
            lines.append(f"{split}: no memoryless or adaptive ceilings ({figures})")
            continue
        curve = lambda values: ", ".join(f"{v:.3f}" for v in values)  # noqa: E731
        value = [a - m for a, m in zip(figures["adaptive"], figures["memoryless"])]
        lines.append(f"{split}: pass@k for k = 1..{len(value)}: memoryless {curve(figures['memoryless'])}; adaptive "
                     f"{curve(figures['adaptive'])}; known opponent {curve(figures['known_opponent'])}; value of "
                     f"adaptation {', '.join(f'{v:+.3f}' for v in value)}")
    return lines


def _seat_mean(per_seat: Mapping[str, Mapping[str, Any]], seat_split: float) -> dict[str, float]:
    """Ceiling values averaged over seats with the population's seat split."""
    if len(per_seat) == 1:
        only = next(iter(per_seat.values()))
        return {name: figure["value"] for name, figure in only.items()}
    weights = {"seat_0": 1.0 - seat_split, "seat_1": seat_split}
    names = next(iter(per_seat.values())).keys()
    return {name: sum(weights[s] * per_seat[s][name]["value"] for s in per_seat) for name in names}


def write_manifest(manifest: Mapping[str, Any], path: str | Path) -> Path:
    return io.write_json(path, manifest)


def load_manifest(path: str | Path) -> dict[str, Any]:
    manifest = io.read_json(path)
    if manifest.get("schema_version") != MANIFEST_SCHEMA_VERSION:
        raise ValueError(
            f"{path}: manifest schema version {manifest.get('schema_version')!r}, expected {MANIFEST_SCHEMA_VERSION}"
        )
    return manifest


