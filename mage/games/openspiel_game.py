"""Any two-player OpenSpiel game, through one adapter (docs/games.md, "Any OpenSpiel game").

``make_game("leduc_poker", openspiel={...})`` loads OpenSpiel's game of that name with those
parameters and plays it as a game of this project:

* **What fits.** Two players; turn-based, or simultaneous moves (converted to turns with
  ``pyspiel.convert_to_turn_based``: the second chooser does not see the first's choice);
  rewarded at the end; chance explicit or none; an information-state or observation string.
  A game that does not fit is refused when it is built, with the reason (:func:`unfit`).
* **The prompt** shows the agent's information state where the game has one (its
  observation string otherwise), and the legal moves by OpenSpiel's own names
  (``state.action_to_string``). A perfect-information game shows every move of the
  episode; an imperfect-information one shows only the agent's own (the information state
  says what it saw of the rest: a move listed there would leak a hidden choice).
* **Chance** comes from the initial state's seed: the chance events before the first
  decision (the deal) are drawn when the initial state is, and stored in it; the k-th chance
  event later in an episode is drawn with the k-th number of a generator seeded from the same
  seed, so every episode of a meta-episode, and every member of a group, meets the same
  chance wherever it meets the same chance node.
* **A reply** names exactly one legal move, as today: the names, and their lower-case
  spellings, are the only accepted ones.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyspiel

from mage.games.base import Game, InitialState, Move, Outcome, check_param
from mage.games.openspiel_episode import OpenSpielEpisode
from mage.protocol.parsing import normalise

#: The shipped games' rules in words, for the OpenSpiel parameters they describe (params/game/);
#: any other game, or these with other parameters, gets :func:`generic_rules`.
RULES: dict[str, tuple[dict[str, Any], str]] = {
    "leduc_poker": ({}, """\
Game: Leduc Poker, two players.
- The deck has six cards: two Jacks, two Queens and two Kings. Each player antes 1 chip and is \
dealt one private card.
- Two betting rounds. In each, a player may "Call" (match the bet, or check when there is none), \
"Raise" (2 chips in round 1, 4 in round 2; at most two raises a round) or "Fold" (give up the pot).
- After round 1 one public card is dealt. At the showdown a pair with the public card wins; \
otherwise the higher card wins; equal cards split the pot.
- Your view numbers the cards 0 to 5: 0 and 1 are Jacks, 2 and 3 Queens, 4 and 5 Kings. It lists \
the moves of each round as 1 = Call and 2 = Raise, and the chips each player has left (from 100).
- Your score is the chips you win or lose."""),
    "liars_dice": ({"numdice": 1, "dice_sides": 4}, """\
Game: Liar's Dice, two players, one four-sided die each.
- Each player rolls a die (faces 1 to 4) in secret. Players take turns bidding "q-f": at least q \
of the two dice show face f, where a 4 counts as any face. Each bid must be higher than the last.
- Instead of bidding, a player may call "Liar" on the last bid: both dice are shown. If the bid \
holds, the caller loses; otherwise the bidder loses.
- Your score: +10 for a win, -10 for a loss."""),
    "goofspiel": ({"num_cards": 3, "imp_info": True, "points_order": "random"}, """\
Game: Goofspiel, two players.
- Each player holds the cards 1 to 3; the point cards 1 to 3 are turned up in a random order. Each round a point card is turned up, and both players bid \
one of their cards in secret; the higher bid wins the point card's value, a tie wins nothing. \
Bid cards are discarded.
- After the last round the player with more points wins.
- Your score: +10 for a win, 0 for a draw, -10 for a loss."""),
    "connect_four": ({}, """\
Game: Connect Four on a board of 6 rows and 7 columns, two players.
- Players take turns dropping a piece into a column (0 to 6, left to right); it falls to the \
lowest empty cell. Player 1 plays x, Player 2 plays o.
- Four of your pieces in a row, column or diagonal win. A full board is a draw.
- Your score: +10 for a win, 0 for a draw, -10 for a loss."""),
}

ANSWER = "Answer with exactly one legal move, spelt as listed, inside <action></action>, for example <action>{example}</action>."


def unfit_name(name: str) -> str | None:
    """Why OpenSpiel's game ``name`` (with its default parameters) cannot be played here, or None."""
    return unfit(pyspiel.load_game(name))


def unfit(game: pyspiel.Game) -> str | None:
    """Why ``game`` cannot be played here, or None when it can."""
    kind = game.get_type()
    if game.num_players() != 2:
        return f"it has {game.num_players()} players; only two-player games are played here"
    if kind.dynamics not in (pyspiel.GameType.Dynamics.SEQUENTIAL, pyspiel.GameType.Dynamics.SIMULTANEOUS):
        return f"its dynamics are {kind.dynamics}; turn-based or simultaneous moves are played here"
    if kind.reward_model != pyspiel.GameType.RewardModel.TERMINAL:
        return "it rewards during play; only games rewarded at the end are played here"
    if kind.chance_mode == pyspiel.GameType.ChanceMode.SAMPLED_STOCHASTIC:
        return "its chance is sampled, not listed; the seeded draws need explicit chance outcomes"
    if not (kind.provides_information_state_string or kind.provides_observation_string):
        return "it has neither an information-state nor an observation string to show the agent"
    return None


@functools.lru_cache(maxsize=32)
def load(name: str, parameters_json: str) -> pyspiel.Game:
    """OpenSpiel's ``name`` with these parameters, turned to turns if its moves are simultaneous.
    Raises a ValueError for a game that is unknown or does not fit (:func:`unfit`)."""
    if name not in pyspiel.registered_names():
        raise ValueError(f"unknown game {name!r}: neither this project's nor OpenSpiel's")
    reason = unfit_name(name)
    if reason is not None:
        raise ValueError(f"name must be a game this project can play: OpenSpiel's {name} does not fit, {reason}")
    try:
        game = pyspiel.load_game(name, json.loads(parameters_json))
    except pyspiel.SpielError as error:
        raise ValueError(f"openspiel must be parameters OpenSpiel's {name} accepts, got {json.loads(parameters_json)!r} "
                         f"({error})") from None
    reason = unfit(game)
    if reason is not None:
        raise ValueError(f"openspiel must give a game this project can play: OpenSpiel's {name} does not fit, {reason}")
    if game.get_type().dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS:
        game = pyspiel.convert_to_turn_based(game)
    return game


def generic_rules(name: str, parameters: Mapping[str, Any]) -> str:
    """The rules of a game the project has no words for: OpenSpiel's name and parameters."""
    kind = pyspiel.load_game(name, dict(parameters)).get_type()
    simultaneous = (" Moves chosen at the same time are asked one player after the other: neither sees the "
                    "other's.") if kind.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS else ""
    return (f"Game: {kind.long_name} (OpenSpiel's {name}, parameters {dict(parameters)}), two players.{simultaneous}\n"
            "Your score is the game's payoff at the end, scaled.")


def move_names(game: pyspiel.Game) -> dict[str, int]:
    """Every move's name, for either player, -> its action id; named at the first decision (some
    games name an action only in a state: liar's dice's ``Action(id=3)`` is ``1-4`` there)."""
    state = game.new_initial_state()
    while state.is_chance_node():
        state.apply_action(state.chance_outcomes()[0][0])
    return {state.action_to_string(player, action): action for player in range(game.num_players())
            for action in range(game.num_distinct_actions())}


def draw_chance(state: pyspiel.State, u: float) -> int:
    """The chance outcome at ``state`` that the uniform number ``u`` picks (inverse CDF over the
    outcomes in OpenSpiel's order): the same ``u`` at the same node picks the same outcome."""
    outcomes = state.chance_outcomes()
    total = 0.0
    for action, probability in outcomes:
        total += probability
        if u < total:
            return int(action)
    return int(outcomes[-1][0])


class OpenSpielGame(Game):
    """A two-player OpenSpiel game, played through the adapter (module docstring)."""

    num_players = 2

    def __init__(self, openspiel_name: str, openspiel: Mapping[str, Any] | None = None, turn_limit: int = 20,
                 payoff_scale: float = 10.0) -> None:
        check_param(isinstance(openspiel, Mapping) or openspiel is None, "openspiel", openspiel,
                    "a mapping of OpenSpiel's parameters")
        check_param(isinstance(turn_limit, int) and turn_limit >= 1, "turn_limit", turn_limit, ">= 1")
        check_param(payoff_scale > 0, "payoff_scale", payoff_scale, "> 0")
        self.name = openspiel_name
        self.parameters = dict(openspiel or {})
        self.openspiel_game = load(openspiel_name, json.dumps(self.parameters, sort_keys=True))
        self.turn_limit = turn_limit
        self.payoff_scale = float(payoff_scale)
        kind = pyspiel.load_game(openspiel_name, self.parameters).get_type()  # before any turn conversion
        #: whether every move is public, so that the episode's moves are shown whole (moves chosen at
        #: the same time are not: the second chooser must not see the first's)
        self.perfect_information = kind.information == pyspiel.GameType.Information.PERFECT_INFORMATION \
            and kind.dynamics == pyspiel.GameType.Dynamics.SEQUENTIAL
        #: whether the prompt shows the information state: a perfect-information game's observation
        #: (its board) says the same in a form people read, where the game has one
        self.shows_information_state = kind.provides_information_state_string and not (
            self.perfect_information and kind.provides_observation_string)

    def __repr__(self) -> str:
        return f"OpenSpielGame({self.name!r}, {self.parameters!r})"

    # -- initial states ------------------------------------------------------------------
    def initial_state(self, seed: int, agent_seat: int = 0) -> InitialState:
        if agent_seat not in (0, 1):
            raise ValueError(f"agent_seat must be 0 or 1, got {agent_seat!r}")
        rng = np.random.default_rng(seed)
        state = self.openspiel_game.new_initial_state()
        chance = []
        while state.is_chance_node():
            chance.append(draw_chance(state, float(rng.random())))
            state.apply_action(chance[-1])
        return InitialState(self.name, int(seed), agent_seat, {"chance": chance})

    def initial_states(self, agent_seat: int) -> list[tuple[InitialState, float]] | None:
        listed, frontier = [], [(self.openspiel_game.new_initial_state(), 1.0)]
        while frontier:
            state, probability = frontier.pop()
            if not state.is_chance_node():
                chance = [int(a) for a in state.history()]
                listed.append((InitialState(self.name, 0, agent_seat, {"chance": chance}), probability))
            else:
                frontier.extend((state.child(a), probability * p) for a, p in state.chance_outcomes())
            if len(listed) + len(frontier) > 10_000:
                return None
        return sorted(listed, key=lambda item: item[0].data["chance"])

    def openspiel_state(self, initial: InitialState) -> pyspiel.State:
        state = self.openspiel_game.new_initial_state()
        for action in initial.data.get("chance", []):
            state.apply_action(int(action))
        return state

    @functools.cached_property
    def chance_in_play(self) -> bool:  # type: ignore[override]
        if self.openspiel_game.get_type().chance_mode == pyspiel.GameType.ChanceMode.DETERMINISTIC:
            return False
        stack, visited = [(self.openspiel_game.new_initial_state(), False)], 0
        while stack and visited < 200_000:
            state, decided = stack.pop()
            visited += 1
            if state.is_terminal():
                continue
            if state.is_chance_node():
                if decided:
                    return True
                stack.extend((state.child(a), False) for a, _ in state.chance_outcomes())
            else:
                stack.extend((state.child(a), True) for a in state.legal_actions())
        return bool(stack)  # too large to rule out: assumed

    def new_episode(self, initial: InitialState, opponent: Any | None = None) -> OpenSpielGameEpisode:
        if opponent is None:
            raise ValueError(f"{self.name} needs an opponent")
        return OpenSpielGameEpisode(self, initial, opponent)

    # -- text --------------------------------------------------------------------------------
    @functools.cached_property
    def _example_move(self) -> str:
        state = self.openspiel_game.new_initial_state()
        while state.is_chance_node():
            state.apply_action(state.chance_outcomes()[0][0])
        return state.action_to_string(state.current_player(), state.legal_actions()[0])

    def rules_text(self) -> str:
        parameters, rules = RULES.get(self.name, (None, ""))
        if parameters != self.parameters:
            rules = generic_rules(self.name, self.parameters)
        return f"{rules}\n{ANSWER.format(example=self._example_move)}"

    def render_initial_state(self, initial: InitialState) -> str:
        order = "you move first" if initial.agent_seat == 0 else "the opponent moves first"
        return f"You are Player {initial.agent_seat + 1} ({order})."

    def view(self, state: pyspiel.State, seat: int) -> str:
        """What ``seat`` sees of ``state``: its information state, or its observation (a
        perfect-information game's board, where it has one)."""
        if self.shows_information_state:
            return state.information_state_string(seat)
        return state.observation_string(seat)

    @functools.cached_property
    def action_names(self) -> tuple[str, ...]:  # type: ignore[override]
        # short codes a reply copies from the prompt (Connect Four's ``o3``), kept whole by the tiny
        # tokenizer; a game with many moves keeps none whole
        names = move_names(self.openspiel_game)
        return tuple(sorted(names)) if len(names) <= 64 else ()

    def episode_at(self, state: pyspiel.State, seat: int) -> OpenSpielGameEpisode:
        """An episode standing at ``state`` (any state of :attr:`openspiel_game`), the agent in
        ``seat``: its ``state`` a clone of ``state``, its history the non-chance moves of
        ``state.history()``, each named as the mover saw it before moving, and its initial state
        the chance events before the first decision (the deal). It renders the prompt the agent
        would see there (the exact exploitability reads the policy at every information state:
        mage.evaluation.exploitability_openspiel); a later opponent move is given with
        ``apply_opponent_action``, later chance is drawn from the seed as in play."""
        from mage.games.openspiel_episode import Replay

        if seat not in (0, 1):
            raise ValueError(f"seat must be 0 or 1, got {seat!r}")
        replay = self.openspiel_game.new_initial_state()
        deal: list[int] = []
        moves: list[Move] = []
        for action in state.history():
            if replay.is_chance_node():
                if not moves:
                    deal.append(int(action))
            else:
                player = replay.current_player()
                moves.append(Move("agent" if player == seat else "opponent", int(action),
                                  replay.action_to_string(player, action)))
            replay.apply_action(action)
        # an opponent that is never asked: the episode waits at its turn (as for a deferred model
        # opponent), so that building it plays no move and draws no chance beyond ``state``
        waiting = Replay([])
        waiting.deferred = True  # type: ignore[attr-defined]
        episode = OpenSpielGameEpisode(self, InitialState(self.name, 0, seat, {"chance": deal}), waiting)
        episode.state = state.clone()
        episode.history = moves
        return episode


class OpenSpielGameEpisode(OpenSpielEpisode):
    game: OpenSpielGame

    def __init__(self, game: OpenSpielGame, initial: InitialState, opponent: Any) -> None:
        # the chance events after the deal: the k-th draws the k-th number of this generator
        self._chance = np.random.default_rng([int(initial.seed), 1])
        super().__init__(game, initial, opponent)

    def move_name(self, action: int) -> str:
        return self.state.action_to_string(self.state.current_player(), action)

    def _apply(self, actor: str, action: int) -> None:
        super()._apply(actor, action)
        while self.state.is_chance_node():
            self.state.apply_action(draw_chance(self.state, float(self._chance.random())))

    def legal_actions(self) -> dict[str, int]:
        if self.is_terminal:
            return {}
        return {self.state.action_to_string(self.agent, a): int(a) for a in self.state.legal_actions()}

    def action_aliases(self) -> dict[str, int]:
        # a name as the parser reads it (outer punctuation gone: Goofspiel's "[P0]Bid: 1" is "p0]bid: 1")
        return {normalise(name): action for name, action in self.legal_actions().items()}

    def render_state(self) -> str:
        lines = ["Your view of the game:", self.game.view(self.state, self.agent).rstrip()]
        if self.game.perfect_information:
            lines += ["Moves so far:", self.render_history()]
        else:
            mine = [m.name for m in self.history if m.actor == "agent"]
            lines += ["Your moves so far: " + (", ".join(mine) if mine else "none") + "."]
        if not self.is_terminal:
            lines.append("It is your turn. Legal moves: " + ", ".join(self.legal_actions()) + ".")
        return "\n".join(lines)

    def render_history(self) -> str:
        if self.game.perfect_information:
            return super().render_history()
        mine = [m for m in self.history if m.actor == "agent"]
        return "\n".join(f"{i + 1}. You: {m.name}" for i, m in enumerate(mine)) or "No moves yet."

    def render_result(self) -> str:
        verdict = {Outcome.WIN: "You won", Outcome.LOSS: "You lost", Outcome.DRAW: "A draw"}[self.outcome()]
        return (f"{verdict}: payoff {self.utility():+g}. Your final view:\n"
                f"{self.game.view(self.state, self.agent).rstrip()}")


__all__ = ["RULES", "Move", "OpenSpielGame", "OpenSpielGameEpisode", "draw_chance", "load", "move_names", "unfit",
           "unfit_name"]
