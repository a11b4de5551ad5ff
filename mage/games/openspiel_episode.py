"""The turn loop that Kuhn Poker and Tic-Tac-Toe share: an episode on an OpenSpiel state in
which the opponent moves inside the episode, until it is the agent's turn or the game is over.

A subclass names a move in words (:meth:`OpenSpielEpisode.move_name`) and renders states;
how the state starts comes from the game's :meth:`~mage.games.base.Game.openspiel_state`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from mage.games.base import Episode, Game, InitialState, Move, Outcome


class Replay:
    """An opponent that plays given actions in order (the other seat of an opponent's view; the
    betting before a decision)."""

    def __init__(self, actions: Sequence[int]) -> None:
        self.actions = list(actions)

    def act(self, state: Any) -> int:
        return self.actions.pop(0)


class OpenSpielEpisode(Episode):
    """An episode of a two-player OpenSpiel game against ``opponent`` (anything with
    ``act(state) -> action``), the agent in seat ``initial.agent_seat``."""

    def __init__(self, game: Game, initial: InitialState, opponent: Any) -> None:
        self.game = game
        self.initial = initial
        self.opponent = opponent
        self.agent = initial.agent_seat
        self.history = []
        self.state = game.openspiel_state(initial)
        self._let_opponent_move()

    @abstractmethod
    def move_name(self, action: int) -> str:
        """``action`` in words, as the history shows it; called before it is applied."""

    def _apply(self, actor: str, action: int) -> None:
        self.history.append(Move(actor, action, self.move_name(action)))
        self.state.apply_action(action)

    def _let_opponent_move(self) -> None:
        # an opponent played by a model (``deferred``) answers later, batched by the rollout
        # engine (mage.rollout.engine): the episode waits at its turn (:attr:`opponent_to_move`)
        if getattr(self.opponent, "deferred", False):
            return
        while not self.state.is_terminal() and self.state.current_player() != self.agent:
            self._apply("opponent", int(self.opponent.act(self.state)))

    @property
    def opponent_to_move(self) -> bool:
        """The episode waits for a deferred opponent's move."""
        return not self.state.is_terminal() and self.state.current_player() != self.agent

    def apply_opponent_action(self, action: int) -> None:
        """A deferred opponent's move (a legal one: the engine replaces an invalid reply)."""
        if not self.opponent_to_move:
            raise ValueError("it is not the opponent's turn")
        if action not in self.state.legal_actions():
            raise ValueError(f"illegal {self.game.name} action {action}")
        self._apply("opponent", int(action))

    def opponent_view(self) -> OpenSpielEpisode:
        """The episode as the opponent sees it: the same moves, seated in the opponent's seat,
        so that its rendering shows the opponent's card or marks and hides the agent's."""
        mine = [m.action for m in self.history if m.actor == "agent"]
        view = self.game.new_episode(replace(self.initial, agent_seat=1 - self.agent), Replay(mine))
        for move in self.history:
            if move.actor == "opponent":
                view.apply_agent_actions([move.action])
        return view

    def apply_agent_actions(self, actions: Sequence[int]) -> None:
        for action in actions:
            if self.is_terminal or self.state.current_player() != self.agent:
                break
            if action not in self.state.legal_actions():
                raise ValueError(f"illegal {self.game.name} action {action}")
            self._apply("agent", int(action))
            self._let_opponent_move()

    @property
    def is_terminal(self) -> bool:
        return self.state.is_terminal()

    def utility(self) -> float:
        """The agent's OpenSpiel return (Kuhn: chips won; Tic-Tac-Toe: 1, 0 or -1); 0 while
        the game runs."""
        return float(self.state.returns()[self.agent]) if self.is_terminal else 0.0

    def outcome(self) -> Outcome:
        if not self.is_terminal:
            return Outcome.ONGOING
        utility = self.utility()
        return Outcome.WIN if utility > 0 else Outcome.LOSS if utility < 0 else Outcome.DRAW

    def agent_return(self) -> float:
        return self.game.payoff_scale * self.utility()
