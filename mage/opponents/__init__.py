"""Opponents: ``make(game_name, opponent_name, game_params=None, **params)``.

Game names are the project's (:data:`mage.games.GAMES`) or OpenSpiel's for a game played
through the adapter, whose opponents are :mod:`mage.opponents.generic`'s; each opponent is a
policy of the game's OpenSpiel game (``Game.openspiel_game``, built with ``game_params``:
the adapter's OpenSpiel parameters decide which game the opponent plays). Sokoban is a one-player
game: its only "opponent" is ``none``, for which ``make`` returns ``None`` (the
counterpart that varies across a Sokoban population is the level generator's setting).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import pyspiel

from mage.config.sections import PopulationEntry
from mage.opponents import generic, kuhn_poker, rock_paper_scissors, tic_tac_toe
from mage.opponents.base import MODEL_OPPONENT, ModelSeat, Opponent

REGISTRY: dict[str, dict[str, Callable[..., Opponent]]] = {
    "kuhn_poker": kuhn_poker.OPPONENTS,
    "tic_tac_toe": tic_tac_toe.OPPONENTS,
    "rock_paper_scissors": rock_paper_scissors.OPPONENTS,
    "sokoban": {"none": lambda game: None},
}


def opponents_of(game_name: str) -> dict[str, Callable[..., Opponent]]:
    """The opponents a game's population may name."""
    from mage.games import is_openspiel_name

    if game_name in REGISTRY:
        return REGISTRY[game_name]
    if is_openspiel_name(game_name):
        return generic.OPPONENTS
    raise ValueError(f"unknown game {game_name!r}; known games: {sorted(REGISTRY)}, or an OpenSpiel game's name")


def make(game_name: str, opponent_name: str, game_params: Mapping[str, Any] | None = None,
         **params: Any) -> Opponent | None:
    """Build a fixed opponent by name, for the game built with ``game_params``; unknown names
    raise a ValueError listing known ones."""
    factories = opponents_of(game_name)
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
    from mage.games import is_openspiel_name

    # only a game played through the adapter is built with its parameters (its OpenSpiel game is theirs)
    chosen = json.dumps(dict(game_params or {}), sort_keys=True, default=_plain) if is_openspiel_name(game_name) else "{}"
    return factory(_openspiel_game(game_name, chosen), **params)


def _plain(value: Any) -> Any:
    """A configuration's mapping or list (OmegaConf's) as JSON takes it."""
    return dict(value) if isinstance(value, Mapping) else list(value)


@cache
def _openspiel_game(game_name: str, game_params_json: str) -> pyspiel.Game | None:
    from mage.games import make_game

    return getattr(make_game(game_name, **json.loads(game_params_json)), "openspiel_game", None)


def opponent_for(entry: PopulationEntry, game_params: Mapping[str, Any] | None = None) -> Opponent | ModelSeat | None:
    """A population entry's opponent, in the game built with ``game_params`` (``game.params``)
    and the entry's own overrides (None for Sokoban's levels; a :class:`ModelSeat` for a league
    snapshot, which the rollout engine moves)."""
    if entry.opponent == MODEL_OPPONENT:
        return ModelSeat(entry.id)
    return make(entry.game, entry.opponent, {**(game_params or {}), **entry.game_params}, **entry.params)


__all__ = ["MODEL_OPPONENT", "ModelSeat", "Opponent", "REGISTRY", "make", "opponent_for", "opponents_of"]
