"""The small game API the rest of the pipeline relies on.

A :class:`Game` knows its rules text, how to draw a reproducible :class:`InitialState`
(deal, seat, board, level) from a seed, and how to start an :class:`Episode` from one.
Every episode of a meta-episode starts from the same initial state, so an initial state is
a plain, JSON-serialisable snapshot that replays exactly.

An :class:`Episode` is one play-through. The agent acts through
:meth:`Episode.apply_agent_actions`; the opponent (if any) moves inside the episode until
it is the agent's turn again or the game is over. The rollout engine only needs:
``legal_actions`` / ``action_aliases`` (for parsing), ``render_state`` and
``render_history`` (for prompts), ``is_terminal``, ``outcome`` and ``agent_return``.
"""

from __future__ import annotations

import enum
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class Outcome(str, enum.Enum):
    """Result of an episode from the agent's point of view."""

    ONGOING = "ongoing"
    WIN = "win"
    DRAW = "draw"
    LOSS = "loss"


@dataclass(frozen=True)
class InitialState:
    """A replayable snapshot of where an episode starts.

    ``data`` holds the game-specific part (Kuhn: the two cards; Tic-Tac-Toe: opening
    moves, empty by default; Sokoban: the level). It must be JSON-serialisable so the
    snapshot can be stored in the trajectory table and replayed elsewhere.
    """

    game: str
    seed: int
    agent_seat: int
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {"game": self.game, "seed": self.seed, "agent_seat": self.agent_seat, "data": self.data},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> InitialState:
        raw = json.loads(text)
        return cls(game=raw["game"], seed=int(raw["seed"]), agent_seat=int(raw["agent_seat"]), data=raw["data"])


@dataclass(frozen=True)
class Move:
    """One move of an episode's history, kept in words for rendering."""

    actor: str  # "agent" or "opponent"
    action: int
    name: str


class Episode(ABC):
    """One play-through of a game from an :class:`InitialState`."""

    initial: InitialState
    history: list[Move]

    @property
    @abstractmethod
    def is_terminal(self) -> bool: ...

    @abstractmethod
    def legal_actions(self) -> dict[str, int]:
        """Canonical action names (as shown to the agent) -> action ids, for the agent now."""

    def action_aliases(self) -> dict[str, int]:
        """Every accepted spelling (lower case) -> action id. Defaults to the canonical names."""
        return {name.lower(): action for name, action in self.legal_actions().items()}

    @abstractmethod
    def apply_agent_actions(self, actions: Sequence[int]) -> None:
        """Apply the agent's move(s), then let the opponent move until the agent's turn."""

    @abstractmethod
    def outcome(self) -> Outcome: ...

    @abstractmethod
    def agent_return(self) -> float:
        """Scaled payoff R(tau) for the agent: terminal, 0 while the episode runs (a puzzle's
        progress terms aside: Sokoban's box reward counts from the start)."""

    @abstractmethod
    def render_state(self) -> str:
        """What the agent sees now: its card or the board, with coordinates."""

    def observation(self) -> str:
        """What identifies the current state, for the GiGPO step anchor (the table's
        ``observation`` column): :meth:`render_state` unless a game shows more than the state
        (Sokoban's move counter)."""
        return self.render_state()

    def render_history(self) -> str:
        """The episode's moves so far, one readable line each."""
        if not self.history:
            return "No moves yet."
        return "\n".join(f"{i + 1}. {_actor_label(m.actor)} {m.name}" for i, m in enumerate(self.history))

    @abstractmethod
    def render_result(self) -> str:
        """How a finished (terminal) episode ended, shown in later episodes' prompts."""

    def describe_end(self) -> str:
        """:meth:`render_result`, or the forfeit line for an episode cut by the turn limit."""
        if self.is_terminal:
            return self.render_result()
        return "The turn limit was reached before the game ended: counted as a loss."


def _actor_label(actor: str) -> str:
    return "You:" if actor == "agent" else "Opponent:"


class Game(ABC):
    """A game: rules text, initial states and episodes.

    ``payoff_scale`` turns the game's raw utility into the episode return of docs/method.md
    (Kuhn: 5 x chips; Tic-Tac-Toe: 10 x {-1, 0, 1}; Sokoban: 10 on success).
    """

    name: str
    num_players: int
    payoff_scale: float
    turn_limit: int
    moves_per_turn: int = 1
    #: Parameters that fix a training set (Sokoban's ``levels``): a warm start that stands in
    #: for a pretrained model is built without them (mage.warmstart.tiny.scripted_tables).
    training_set_params: tuple[str, ...] = ()
    #: Canonical action names that are short codes a reply copies from the prompt (cells,
    #: directions); the tiny preset's tokenizer keeps each one a single token, so that the
    #: name in a list of legal moves and the name in a reply are the same token.
    action_names: tuple[str, ...] = ()

    @abstractmethod
    def initial_state(self, seed: int, agent_seat: int = 0) -> InitialState:
        """Draw the initial state for ``seed`` with the agent in ``agent_seat`` (0 = first)."""

    def initial_states(self, agent_seat: int) -> list[tuple[InitialState, float]] | None:
        """Every initial state :meth:`initial_state` can draw for ``agent_seat``, with its
        probability, where they can be listed (the ceilings across episodes need them); None
        where they cannot (Sokoban's levels, random openings)."""
        return None

    @abstractmethod
    def new_episode(self, initial: InitialState, opponent: Any | None = None) -> Episode:
        """Start an episode from ``initial``; the same snapshot always gives the same state."""

    @abstractmethod
    def rules_text(self) -> str:
        """The task/rules block of every prompt."""

    @abstractmethod
    def render_initial_state(self, initial: InitialState) -> str:
        """The initial-state block of every prompt (seat, card, board or level)."""

    def openspiel_state(self, initial: InitialState) -> Any | None:
        """The OpenSpiel state ``initial`` starts from (after chance and opening moves, before
        either player acts), or None for games not played on OpenSpiel."""
        return None

    def reflection_plan(self, episode: Episode) -> str | None:
        """The plan a player that read the finished ``episode`` would write for the next one,
        where the game makes it one line (rock-paper-scissors: the move that beats the
        opponent's); None for the scripted reflections' generic plan. Only the scripted
        player writes it (:mod:`mage.backends.scripted`): the warm start's reflections."""
        return None

    @property
    def chance_in_play(self) -> bool:
        """Whether chance acts after the first decision (Leduc's public card): its draws come from
        the initial state's seed, the same in every episode of a meta-episode, where the ceilings
        across episodes assume fresh ones (they are not computed for such a game)."""
        return False

    def forfeit_return(self, episode: Episode) -> float:
        """Return of ``episode``, cut off by the turn limit before it ended (a loss): a
        two-player game's lost payoff; a puzzle's return so far (0, or Sokoban's box reward)."""
        return -self.payoff_scale if self.num_players == 2 else episode.agent_return()


def check_param(ok: bool, name: str, value: Any, allowed: str) -> None:
    """A game parameter that cannot be right is rejected when the game is built."""
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
