"""Games: ``make_game(name, **params)`` with OpenSpiel's names plus ``sokoban``."""

from __future__ import annotations

from typing import Any

from mage.games.base import Episode, Game, InitialState, Move, Outcome


def _kuhn(**params: Any) -> Game:
    from mage.games.kuhn_poker import KuhnPoker

    return KuhnPoker(**params)


def _tic_tac_toe(**params: Any) -> Game:
    from mage.games.tic_tac_toe import TicTacToe

    return TicTacToe(**params)


def _sokoban(**params: Any) -> Game:
    from mage.games.sokoban import Sokoban

    return Sokoban(**params)


GAMES = {"kuhn_poker": _kuhn, "tic_tac_toe": _tic_tac_toe, "sokoban": _sokoban}


def make_game(name: str, **params: Any) -> Game:
    """Build a game by name; an unknown name raises a ValueError listing the known ones."""
    if name not in GAMES:
        raise ValueError(f"unknown game {name!r}; known games: {sorted(GAMES)}")
    return GAMES[name](**params)


__all__ = ["Episode", "Game", "InitialState", "Move", "Outcome", "GAMES", "make_game"]
