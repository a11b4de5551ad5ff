"""Opponent populations: declared in ``params/population/<game>.yaml``, seeded into a manifest.

The **population manifest** is the first artifact of the lifecycle: every opponent (id,
game, rule and parameters, split, share, description) with its ceilings per seat. It is
plain JSON with sorted keys, written atomically, so DVC can version it and equal inputs
give equal bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from mage import __version__, ceilings, io
from mage.games import Game, checked_game, make_game
from mage.opponents import Opponent, make

SPLITS = ("train", "held_out")
MANIFEST_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class PopulationEntry:
    """One counterpart of a population: an opponent rule (or, for Sokoban, a level setting)."""

    id: str
    game: str
    opponent: str
    split: str
    share: float = 0.0
    params: Mapping[str, Any] = field(default_factory=dict)
    game_params: Mapping[str, Any] = field(default_factory=dict)

    def make_opponent(self) -> Opponent | None:
        return make(self.game, self.opponent, **self.params)

    def make_game(self, base_params: Mapping[str, Any] | None = None) -> Game:
        """The game with the population's base parameters and this entry's overrides."""
        return make_game(self.game, **{**(base_params or {}), **self.game_params})


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value


def population_entries(cfg: DictConfig | Mapping[str, Any]) -> list[PopulationEntry]:
    """Read and check the entries of ``cfg.population`` for ``cfg.game``.

    Raises a ValueError naming the offending key: unknown fields, train shares that are
    not positive or do not sum to 1, ids used twice, unknown opponents or parameters.
    """
    game_name = cfg["game"]["name"]
    base_params = _plain(cfg["game"].get("params")) or {}
    population = cfg["population"]
    entries, seen = [], set()
    for split in SPLITS:
        for entry_id, raw in (_plain(population.get(split)) or {}).items():
            where = f"population.{split}.{entry_id}"
            unknown = set(raw) - {"opponent", "share", "params", "game_params"}
            if unknown:
                raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: opponent, share, params, game_params")
            if "opponent" not in raw:
                raise ValueError(f"{where}: missing 'opponent'")
            if entry_id in seen:
                raise ValueError(f"{where}: id {entry_id!r} is used twice")
            seen.add(entry_id)
            share = float(raw.get("share", 0.0))
            if split == "train" and share <= 0:
                raise ValueError(f"{where}.share must be > 0, got {share}")
            entry = PopulationEntry(
                id=entry_id,
                game=game_name,
                opponent=raw["opponent"],
                split=split,
                share=share,
                params=dict(raw.get("params") or {}),
                game_params=dict(raw.get("game_params") or {}),
            )
            try:
                entry.make_opponent()
            except ValueError as error:
                raise ValueError(f"{where}: {error}") from None
            if entry.game_params:
                # a level setting that cannot be right (Sokoban's num_boxes, levels) is named
                # here, before work, not when the first rollout builds the entry's game
                checked_game(game_name, {**base_params, **entry.game_params}, f"{where}.game_params")
            entries.append(entry)
    train = [e for e in entries if e.split == "train"]
    if not train:
        raise ValueError("population.train is empty: training needs at least one opponent")
    total = sum(e.share for e in train)
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"population.train shares sum to {total:g}, they must sum to 1")
    return entries


def _seat_ceilings(entry: PopulationEntry, game: Game, seat: int, n_games: int, seed: int) -> dict[str, Any]:
    if game.num_players == 1:
        success = ceilings.single_player_ceiling(game, n_games, seed)
        best = ceilings.single_player_return_ceiling(game, success, n_games, seed)
        return {"max_win_probability": success.to_dict(), "best_response_return": best.to_dict()}
    opponent = entry.make_opponent()
    figures = ceilings.opponent_ceilings(game.openspiel_game, opponent, seat, n_games=n_games, seed=seed)
    payoff = figures["best_response_payoff"]
    return {
        "best_response_payoff": payoff.to_dict(),
        "best_response_return": payoff.scaled(game.payoff_scale).to_dict(),
        "max_win_probability": figures["max_win_probability"].to_dict(),
    }


def seating(cfg: DictConfig | Mapping[str, Any]) -> tuple[float, int]:
    """``(seat_split, num_seats)`` for planning meta-episodes on ``cfg.game``.

    The number of seats is the game's number of players (Sokoban has one, so every
    meta-episode takes seat 0); ``population.seat_split`` is the share played from seat 1.
    """
    game = make_game(cfg["game"]["name"], **(_plain(cfg["game"].get("params")) or {}))
    return float(cfg["population"]["seat_split"]), int(game.num_players)


def seed_population(cfg: DictConfig, progress: bool = True) -> dict[str, Any]:
    """Build the population manifest: every entry with its ceilings per seat."""
    entries = population_entries(cfg)
    base_params = _plain(cfg["game"]["params"]) or {}
    population = cfg["population"]
    seat_split = float(population["seat_split"])
    n_games = int(population["ceilings"]["n_games"])
    seed = int(population["ceilings"]["seed"])
    records = []
    for entry in tqdm(entries, desc="ceilings", unit="opponent", disable=not progress):
        game = entry.make_game(base_params)
        seats = range(game.num_players)
        per_seat = {f"seat_{s}": _seat_ceilings(entry, game, s, n_games, seed) for s in seats}
        opponent = entry.make_opponent()
        record = asdict(entry) | {
            "description": opponent.description if opponent else f"level setting {dict(entry.game_params)}",
            "deterministic": opponent.deterministic if opponent else True,
            "explicit_policy": opponent.explicit if opponent else True,
            "ceilings": per_seat | {"mean": _seat_mean(per_seat, seat_split)},
        }
        records.append(record)
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "mage_version": __version__,
        "game": cfg["game"]["name"],
        "game_params": base_params,
        "seat_split": seat_split if len(seats) > 1 else 0.0,
        "opponents": records,
    }


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


def manifest_entries(manifest: Mapping[str, Any], split: str | None = None) -> Iterable[Mapping[str, Any]]:
    return [o for o in manifest["opponents"] if split is None or o["split"] == split]


def main(argv: list[str] | None = None) -> Path:
    """``python -m mage.population [hydra overrides]``: seed and write the manifest."""
    import sys

    from mage.config import compose

    cfg = compose(sys.argv[1:] if argv is None else argv)
    path = write_manifest(seed_population(cfg), cfg.paths.population_manifest)
    print(f"population manifest: {path}")
    return path


if __name__ == "__main__":
    main()
