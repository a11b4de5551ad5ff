"""Opponents: ``make(game_name, opponent_name, **params)``.

Game names are OpenSpiel's (``kuhn_poker``, ``tic_tac_toe``). Sokoban is a one-player
game: its only "opponent" is ``none``, for which ``make`` returns ``None`` (the
counterpart that varies across a Sokoban population is the level generator's setting).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pyspiel

from mage.opponents import kuhn_poker, tic_tac_toe
from mage.opponents.base import MODEL_OPPONENT, ModelSeat, Opponent
from mage.sections import PopulationEntry

REGISTRY: dict[str, dict[str, Callable[..., Opponent]]] = {
    "kuhn_poker": kuhn_poker.OPPONENTS,
    "tic_tac_toe": tic_tac_toe.OPPONENTS,
    "sokoban": {"none": lambda game: None},
}


def make(game_name: str, opponent_name: str, **params: Any) -> Opponent | None:
    """Build a fixed opponent by name; unknown names raise a ValueError listing known ones."""
    if game_name not in REGISTRY:
        raise ValueError(f"unknown game {game_name!r}; known games: {sorted(REGISTRY)}")
    factories = REGISTRY[game_name]
    if opponent_name not in factories:
        raise ValueError(
            f"unknown opponent {opponent_name!r} for {game_name}; known opponents: {sorted(factories)}"
        )
    factory = factories[opponent_name]
    accepted = [p for p in inspect.signature(factory).parameters if p != "game"]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"opponent {game_name}/{opponent_name} got unknown parameter(s) {unknown}; accepted: {accepted}"
        )
    game = pyspiel.load_game(game_name) if game_name != "sokoban" else None
    return factory(game, **params)


def opponent_for(entry: PopulationEntry) -> Opponent | ModelSeat | None:
    """A population entry's opponent (None for Sokoban's levels; a :class:`ModelSeat` for a
    league snapshot, which the rollout engine moves)."""
    if entry.opponent == MODEL_OPPONENT:
        return ModelSeat(entry.id)
    return make(entry.game, entry.opponent, **entry.params)


__all__ = ["MODEL_OPPONENT", "ModelSeat", "Opponent", "REGISTRY", "make", "opponent_for"]
