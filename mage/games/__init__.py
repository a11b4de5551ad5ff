"""Games: ``make_game(name, **params)``: ``kuhn_poker``, ``tic_tac_toe`` and ``rock_paper_scissors`` on OpenSpiel,
``sokoban``, and any other two-player OpenSpiel game by its OpenSpiel name, through one adapter
(:mod:`mage.games.openspiel_game`: ``make_game("leduc_poker", openspiel={...})``)."""

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


def is_openspiel_name(name: str) -> bool:
    """Whether ``name`` is played through the adapter: OpenSpiel knows it and no game here has it."""
    import pyspiel

    return name not in GAMES and name in pyspiel.registered_names()


def make_game(name: str, **params: Any) -> Game:
    """Build a game by name: one of :data:`GAMES`, or any OpenSpiel game the adapter can play
    (its parameters: ``openspiel``, ``turn_limit``, ``payoff_scale``); an unknown name raises a
    ValueError listing this project's games."""
    if name in GAMES:
        return GAMES[name](**params)
    if is_openspiel_name(name):
        from mage.games.openspiel_game import OpenSpielGame

        return OpenSpielGame(name, **params)
    raise ValueError(f"unknown game {name!r}; known games: {sorted(GAMES)}, or any two-player game OpenSpiel "
                     "registers (pyspiel.registered_names())")


def checked_game(name: str, params: Mapping[str, Any], key: str) -> Game:
    """The game built from ``params``, or a ValueError naming the config ``key`` they were
    set under: ``KEY: unknown key(s) ...`` with the allowed ones, or ``KEY.PARAM must be ...``."""
    if name in GAMES:
        signature = inspect.signature(type(make_game(name)).__init__)
    elif is_openspiel_name(name):
        from mage.games.openspiel_game import OpenSpielGame

        signature = inspect.signature(OpenSpielGame.__init__)
    else:
        make_game(name)  # the unknown name's error
    accepted = [p for p in signature.parameters if p not in ("self", "openspiel_name")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"{key}: unknown key(s) {unknown} for {name}; allowed keys: {accepted}")
    try:
        return make_game(name, **params)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{key}.{error}") from None


__all__ = ["Episode", "Game", "InitialState", "Move", "Outcome", "GAMES", "checked_game", "is_openspiel_name", "make_game"]
