"""Opponents of OpenSpiel games as OpenSpiel policies.

Every opponent is an ``open_spiel.python.policy.Policy``: ``action_probabilities(state,
player_id)`` gives its action distribution, so OpenSpiel's best-response and
exploitability code runs on it unchanged. For play it adds ``reset(seed)`` and
``act(state)``, which draws a move from the opponent's own seeded generator: the same seed
always gives the same game.

An opponent lives for one meta-episode. ``reset(seed, past)`` starts each of its episodes with
``past``, the OpenSpiel histories of the meta-episode's earlier episodes: an opponent that
``remembers`` reads them in ``action_probabilities`` (rock-paper-scissors' ``reactive``
player), the others ignore them. The ceilings across episodes (:mod:`mage.population.ceilings`) set
``past`` the same way, so the engine and the ceilings play the same opponent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyspiel
from open_spiel.python import policy as openspiel_policy


class Opponent(openspiel_policy.Policy):
    """A fixed opponent of a two-player OpenSpiel game.

    ``deterministic``: ``action_probabilities`` is one-hot everywhere.
    ``explicit``: ``action_probabilities`` is the exact policy (False for search-based
    players whose distribution can only be estimated by sampling, such as MCTS).
    ``remembers``: its moves depend on the meta-episode's earlier episodes (``past``).
    """

    rule: str = ""  # the registry name, e.g. "conservative"
    description: str = ""
    deterministic: bool = False
    explicit: bool = True
    remembers: bool = False

    def __init__(self, game: pyspiel.Game, **params: Any) -> None:
        super().__init__(game, list(range(game.num_players())))
        self.game = game
        self.params = dict(params)
        self._rng = np.random.default_rng(0)
        #: the OpenSpiel histories of the meta-episode's earlier episodes, oldest first
        self.past: tuple[tuple[int, ...], ...] = ()

    def reset(self, seed: int, past: Sequence[Sequence[int]] = ()) -> None:
        """Start an episode: reseed the opponent's randomness and remember the histories of the
        meta-episode's earlier episodes (called at the start of every episode)."""
        self._rng = np.random.default_rng(seed)
        self.past = tuple(tuple(int(a) for a in history) for history in past)

    def act(self, state: pyspiel.State) -> int:
        """Draw the opponent's move in ``state`` from ``action_probabilities``."""
        probs = self.action_probabilities(state, state.current_player())
        actions = sorted(probs)
        weights = np.array([probs[a] for a in actions], dtype=float)
        if self.deterministic:
            return int(actions[int(np.argmax(weights))])
        return int(actions[self._rng.choice(len(actions), p=weights / weights.sum())])

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({params})"


#: The ``opponent`` of a population entry played by a model (a league snapshot): the league
#: adds such entries while training runs; a configuration cannot name it.
MODEL_OPPONENT = "model"


class ModelSeat:
    """An opponent played by a model, a frozen snapshot of the agent (docs/method.md, "The
    league"). It has no rule to call: the rollout engine asks the backend serving ``name`` for
    its moves, batched, with a prompt built from its own view (``deferred``), and replaces an
    invalid reply with a legal move drawn uniformly from ``rng`` (reseeded every episode)."""

    rule = MODEL_OPPONENT
    deferred = True
    deterministic = False
    explicit = False

    def __init__(self, name: str) -> None:
        self.name = name
        self.description = f"the model snapshot {name}"
        self.rng = np.random.default_rng(0)

    def reset(self, seed: int, past: Sequence[Sequence[int]] = ()) -> None:
        self.rng = np.random.default_rng(seed)

    def act(self, state: pyspiel.State) -> int:
        raise RuntimeError(f"{self.name} is played by a model: the rollout engine moves it")

    def __repr__(self) -> str:
        return f"ModelSeat({self.name!r})"
