"""Games: ``make_game(name, **params)``: ``kuhn_poker``, ``tic_tac_toe`` and ``rock_paper_scissors`` on OpenSpiel,
and ``sokoban``."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from mage.games.base import Episode, Game, InitialState, Move, Outcome


def _kuhn(**params: Any) -> Game:
    from mage.games.kuhn_poker import KuhnPoker

    return KuhnPoker(**params)


def _tic_tac_toe(**params: Any) -> Game:
    from mage.games.tic_tac_toe import TicTacToe

    return TicTacToe(**params)


def _rock_paper_scissors(**params: Any) -> Game:
    from mage.games.rock_paper_scissors import RockPaperScissors

    return RockPaperScissors(**params)


def _sokoban(**params: Any) -> Game:
    from mage.games.sokoban import Sokoban

    return Sokoban(**params)


GAMES = {"kuhn_poker": _kuhn, "tic_tac_toe": _tic_tac_toe, "rock_paper_scissors": _rock_paper_scissors,
         "sokoban": _sokoban}


def make_game(name: str, **params: Any) -> Game:
    """Build a game by name; an unknown name raises a ValueError listing the known ones."""
    if name not in GAMES:
        raise ValueError(f"unknown game {name!r}; known games: {sorted(GAMES)}")
    return GAMES[name](**params)


def checked_game(name: str, params: Mapping[str, Any], key: str) -> Game:
    """The game built from ``params``, or a ValueError naming the config ``key`` they were
    set under: ``KEY: unknown key(s) ...`` with the allowed ones, or ``KEY.PARAM must be ...``."""
    accepted = [p for p in inspect.signature(type(make_game(name)).__init__).parameters if p != "self"]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"{key}: unknown key(s) {unknown} for {name}; allowed keys: {accepted}")
    try:
        return make_game(name, **params)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{key}.{error}") from None


__all__ = ["Episode", "Game", "InitialState", "Move", "Outcome", "GAMES", "checked_game", "make_game"]
