"""Opponents for any two-player OpenSpiel game (docs/games.md, "Any OpenSpiel game").

* ``random``: uniform over the legal moves;
* ``mcts``: OpenSpiel's MCTS bot with a given number of simulations. It searches the true
  state: in a game of imperfect information it sees the hidden cards and dice, a strong
  player but not a fair one;
* ``equilibrium``: OpenSpiel's CFR+ average policy after ``iterations`` (C++), where the game
  has at most :data:`MAX_EQUILIBRIUM_STATES` information states. It is deterministic: every
  process that builds it computes the same table, whose NashConv and digest the population
  manifest records in the entry's description (a table that changed with OpenSpiel's version
  shows there);
* ``fixed``: the first legal move of a list of OpenSpiel move names, else uniform;
* ``biased``: a move with a given probability when legal, the rest uniform over the others.

Moves are named as OpenSpiel names them in the game (``state.action_to_string``): ``Raise``,
``2-3``, ``[P0]Bid: 4``, ``x3``.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from functools import cache

import pyspiel
from open_spiel.python import policy as openspiel_policy

from mage.games.openspiel_game import move_names
from mage.opponents.base import Opponent

#: The most information states (both players) for which ``equilibrium`` runs CFR+: beyond,
#: a sweep of the tree takes too long to repeat hundreds of times on a laptop.
MAX_EQUILIBRIUM_STATES = 20_000


def _action_of(game: pyspiel.Game, name: str, what: str) -> int:
    names = move_names(game)
    if name not in names:
        raise ValueError(f"{what}: unknown move {name!r}; moves are {sorted(names)}")
    return names[name]


def _uniform(legal: Sequence[int]) -> dict[int, float]:
    return {int(a): 1.0 / len(legal) for a in legal}


class RandomOpponent(Opponent):
    rule = "random"
    description = "uniform random over the legal moves"

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        return _uniform(state.legal_actions())


class FixedOpponent(Opponent):
    """The first legal move of ``moves`` (one name or a list), else uniform over the legal ones."""

    rule = "fixed"

    def __init__(self, game: pyspiel.Game, moves: str | Sequence[str] = ()) -> None:
        names = [moves] if isinstance(moves, str) else list(moves)
        if not names:
            raise ValueError("fixed: give moves, one OpenSpiel move name or a list of them")
        super().__init__(game, moves=names)
        self.priority = [_action_of(game, name, "fixed") for name in names]
        self.description = f"plays the first legal move of [{', '.join(names)}], else uniformly at random"

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        legal = state.legal_actions()
        for action in self.priority:
            if action in legal:
                return {a: float(a == action) for a in legal}
        return _uniform(legal)


class BiasedOpponent(Opponent):
    """``move`` with ``probability`` when it is legal, the rest shared evenly by the other moves."""

    rule = "biased"

    def __init__(self, game: pyspiel.Game, move: str = "", probability: float = 0.5) -> None:
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"biased: probability must be in [0, 1], got {probability!r}")
        super().__init__(game, move=move, probability=probability)
        self.action = _action_of(game, move, "biased")
        self.probability = float(probability)
        self.description = f"plays {move} with probability {probability:g} when it can, else uniformly at random"

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        legal = state.legal_actions()
        if self.action not in legal or len(legal) == 1:
            return _uniform(legal)
        rest = (1.0 - self.probability) / (len(legal) - 1)
        return {a: self.probability if a == self.action else rest for a in legal}


def information_state_count(game: pyspiel.Game, cap: int) -> int:
    """The information states of both players, counted up to ``cap`` (one more means "over")."""
    return _information_states(str(game), cap)


@cache
def _information_states(game_string: str, cap: int) -> int:
    game = pyspiel.load_game(game_string)
    seen: set[str] = set()
    stack = [game.new_initial_state()]
    while stack and len(seen) <= cap:
        state = stack.pop()
        if state.is_terminal():
            continue
        if not state.is_chance_node():
            seen.add(f"{state.current_player()}|{state.information_state_string()}")
        stack.extend(state.child(a) for a in (
            [a for a, _ in state.chance_outcomes()] if state.is_chance_node() else state.legal_actions()))
    return len(seen)


def cfr_plus_average_policy(game: pyspiel.Game, iterations: int) -> tuple[pyspiel.Policy, float, str]:
    """OpenSpiel's CFR+ average policy of ``game`` after ``iterations`` (C++, deterministic), its
    NashConv, and a digest of its table (every information state's probabilities, rounded);
    computed once a process per game and iteration count."""
    return _cfr_plus(str(game), iterations)[:3]


@cache
def _cfr_plus(game_string: str, iterations: int) -> tuple[pyspiel.Policy, float, str, pyspiel.CFRPlusSolver]:
    game = pyspiel.load_game(game_string)
    solver = pyspiel.CFRPlusSolver(game)
    for _ in range(iterations):
        solver.evaluate_and_update_policy()
    average = solver.average_policy()
    table = {}
    for state in openspiel_policy.TabularPolicy(game).states:
        key = f"{state.current_player()}|{state.information_state_string()}"
        table[key] = [[int(a), round(float(p), 9)] for a, p in sorted(average.action_probabilities(state).items())]
    digest = hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()[:16]
    # the solver is cached beside its policy: the policy reads the solver's tables, and finds none
    # once the solver is gone
    return average, float(pyspiel.nash_conv(game, average)), digest, solver


class EquilibriumOpponent(Opponent):
    """OpenSpiel's CFR+ average policy, sampled (``play: sample``) or its most probable move."""

    rule = "equilibrium"

    def __init__(self, game: pyspiel.Game, iterations: int = 200, play: str = "sample") -> None:
        if play not in ("sample", "greedy"):
            raise ValueError(f"equilibrium: play must be 'sample' or 'greedy', got {play!r}")
        if not (isinstance(iterations, int) and 1 <= iterations <= 100_000):
            raise ValueError(f"equilibrium: iterations must be an integer in [1, 100000], got {iterations!r}")
        count = information_state_count(game, MAX_EQUILIBRIUM_STATES)
        if count > MAX_EQUILIBRIUM_STATES:
            raise ValueError(f"equilibrium: {game} has more than {MAX_EQUILIBRIUM_STATES:,} information states; "
                             "CFR+ is not run on a game this large here (use mcts)")
        super().__init__(game, iterations=iterations, play=play)
        self.iterations, self.play = iterations, play
        self.deterministic = play == "greedy"

    @property
    def description(self) -> str:  # type: ignore[override]
        # solved when first asked (the settings build every opponent to check it, and play none)
        _, nash_conv, digest = cfr_plus_average_policy(self.game, self.iterations)
        return (f"OpenSpiel CFR+ average policy after {self.iterations} iterations (NashConv {nash_conv:.6f}, "
                f"table {digest}), " + ("its most probable move" if self.play == "greedy" else "sampled"))

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        average = cfr_plus_average_policy(self.game, self.iterations)[0]
        probs = {int(a): float(p) for a, p in average.action_probabilities(state).items()}
        if not self.deterministic:
            return probs
        best = max(sorted(probs), key=lambda a: probs[a])  # ties go to the lower action id
        return {a: float(a == best) for a in probs}


def _stable_seed(*parts: object) -> int:
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


class MCTSOpponent(Opponent):
    """OpenSpiel's MCTS bot with a random-rollout evaluator, seeded from the opponent's generator
    at every move. Its action distribution has no closed form: ``action_probabilities``
    estimates it from ``policy_samples`` independently seeded searches (a deterministic
    function of the state), which is what the Monte-Carlo ceilings use."""

    rule = "mcts"
    explicit = False

    def __init__(
        self,
        game: pyspiel.Game,
        max_simulations: int = 100,
        uct_c: float = 1.4,
        n_rollouts: int = 1,
        solve: bool = True,
        policy_samples: int = 16,
        max_memory_mb: int = 100,
    ) -> None:
        if max_simulations < 1 or n_rollouts < 1 or policy_samples < 1:
            raise ValueError("mcts: max_simulations, n_rollouts and policy_samples must be >= 1")
        super().__init__(game, max_simulations=max_simulations, uct_c=uct_c, n_rollouts=n_rollouts, solve=solve)
        self.max_simulations, self.uct_c, self.n_rollouts, self.solve = max_simulations, uct_c, n_rollouts, solve
        self.policy_samples = policy_samples
        self.max_memory_mb = max_memory_mb
        self.description = (
            f"OpenSpiel MCTS, {max_simulations} simulations, uct_c {uct_c}, "
            f"{n_rollouts} random rollout(s) per leaf, solve {'on' if solve else 'off'}"
        )
        self._estimates: dict[str, dict[int, float]] = {}

    def _search(self, state: pyspiel.State, seed: int) -> int:
        evaluator = pyspiel.RandomRolloutEvaluator(self.n_rollouts, seed)
        bot = pyspiel.MCTSBot(
            self.game, evaluator, self.uct_c, self.max_simulations, self.max_memory_mb, self.solve, seed, False
        )
        return int(bot.step(state))

    def act(self, state: pyspiel.State) -> int:
        return self._search(state, int(self._rng.integers(2**31 - 1)))

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        """Monte-Carlo estimate: frequencies of the move chosen by independently seeded searches."""
        key = str(state)
        if key not in self._estimates:
            counts = Counter(self._search(state, _stable_seed(key, k)) for k in range(self.policy_samples))
            self._estimates[key] = {a: counts[a] / self.policy_samples for a in state.legal_actions()}
        return dict(self._estimates[key])


OPPONENTS = {
    "random": RandomOpponent,
    "mcts": MCTSOpponent,
    "equilibrium": EquilibriumOpponent,
    "fixed": FixedOpponent,
    "biased": BiasedOpponent,
}

__all__ = ["MAX_EQUILIBRIUM_STATES", "OPPONENTS", "BiasedOpponent", "EquilibriumOpponent", "FixedOpponent",
           "MCTSOpponent", "RandomOpponent", "cfr_plus_average_policy", "information_state_count"]
