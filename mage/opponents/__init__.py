"""Opponents: ``make(game_name, opponent_name, **params)``.

Game names are the project's (:data:`mage.games.GAMES`); each opponent is a policy of the game's
OpenSpiel game (``Game.openspiel_game``). Sokoban is a one-player
game: its only "opponent" is ``none``, for which ``make`` returns ``None`` (the
counterpart that varies across a Sokoban population is the level generator's setting).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import Any

import pyspiel

from mage.config.sections import PopulationEntry
from mage.opponents import kuhn_poker, rock_paper_scissors, tic_tac_toe
from mage.opponents.base import MODEL_OPPONENT, ModelSeat, Opponent

REGISTRY: dict[str, dict[str, Callable[..., Opponent]]] = {
    "kuhn_poker": kuhn_poker.OPPONENTS,
    "tic_tac_toe": tic_tac_toe.OPPONENTS,
    "rock_paper_scissors": rock_paper_scissors.OPPONENTS,
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
    return factory(_openspiel_game(game_name), **params)


@cache
def _openspiel_game(game_name: str) -> pyspiel.Game | None:
    from mage.games import make_game

    return getattr(make_game(game_name), "openspiel_game", None)


def opponent_for(entry: PopulationEntry) -> Opponent | ModelSeat | None:
    """A population entry's opponent (None for Sokoban's levels; a :class:`ModelSeat` for a
    league snapshot, which the rollout engine moves)."""
    if entry.opponent == MODEL_OPPONENT:
        return ModelSeat(entry.id)
    return make(entry.game, entry.opponent, **entry.params)


__all__ = ["MODEL_OPPONENT", "ModelSeat", "Opponent", "REGISTRY", "make", "opponent_for"]
