"""The population's entries as the config states them (``population.<split>.<id>``), read and
checked against the game and the opponents before any work: the settings call
:func:`population_entries` while they load."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from pydantic import ValidationError

from mage.config.sections import SPLITS, PopulationEntry
from mage.games import checked_game
from mage.opponents import MODEL_OPPONENT, opponent_for

#: The keys a population entry (``population.<split>.<id>``) may set.
ENTRY_KEYS = ("opponent", "share", "params", "game_params")


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
            if not isinstance(raw, Mapping):
                raise ValueError(f"{where}: must be a mapping with an opponent (and share, params, game_params), "
                                 f"got {raw!r}")
            unknown = set(raw) - set(ENTRY_KEYS)
            if unknown:
                raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {', '.join(ENTRY_KEYS)}")
            if "opponent" not in raw:
                raise ValueError(f"{where}: missing 'opponent'")
            if raw["opponent"] == MODEL_OPPONENT:
                raise ValueError(f"{where}.opponent: {MODEL_OPPONENT!r} is a league snapshot's, added while training "
                                 "runs (population.league); name a scripted opponent")
            if entry_id in seen:
                raise ValueError(f"{where}: id {entry_id!r} is used twice")
            seen.add(entry_id)
            share = raw.get("share", 0.0)
            if split == "train" and not (isinstance(share, (int, float)) and not isinstance(share, bool)):
                raise ValueError(f"{where}.share must be a number > 0, got {share!r}")
            if split == "train" and share <= 0:
                raise ValueError(f"{where}.share must be > 0, got {share}")
            try:
                entry = PopulationEntry(id=entry_id, game=game_name, opponent=raw["opponent"], split=split, share=share,
                                        params=dict(raw.get("params") or {}),
                                        game_params=dict(raw.get("game_params") or {}))
                opponent_for(entry, base_params)
            except ValidationError as error:
                first = error.errors()[0]
                raise ValueError(f"{where}.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
            except (TypeError, ValueError) as error:
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
