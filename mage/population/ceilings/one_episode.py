"""Ceilings: the best any player could do against a fixed opponent (docs/method.md, The
metrics).

Two numbers per (game, opponent, agent seat), both in raw game units (chips, +-1) and
scaled to the episode return:

* ``best_response_payoff``: the expected payoff of OpenSpiel's best response to the
  opponent's policy. The best responder sees only what the rules show it.
* ``max_win_probability``: the probability of winning of a player who knows the opponent's
  policy and the whole initial state (both Kuhn cards) and plays to win, averaged over
  initial states. It sees the moves as the rules show them: in a game of simultaneous moves
  played turn by turn (rock-paper-scissors) the opponent's choice stays hidden. Against a
  deterministic opponent every initial state is won or not, so this is exactly the
  fraction of initial states such a player can win.

Both are exact for opponents with an explicit policy table. For search-based opponents
(MCTS) the policy is estimated by sampling the search at every state and smoothed towards
uniform (an action never sampled is not assumed impossible). Candidate policies are
computed against that estimate (its best response, its win maximiser and, for perfect-
information games, a minimax player), the best candidate is picked on ``n_games // 2``
games against the real, freshly seeded opponent, and its figure is measured on ``n_games``
new games, so the pick does not bias the estimate. These are Monte-Carlo estimates of a
lower bound on the ceiling, with 95% confidence intervals, labelled
``method: monte_carlo`` and naming the policy that achieved them.

A game too large to search whole (more than :data:`MAX_TREE_STATES` states: Connect Four)
has Monte-Carlo figures for every opponent, of one MCTS player that searches the true state
(:func:`fits_full_tree`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyspiel
from open_spiel.python.algorithms import best_response

from mage.opponents.base import Opponent
from mage.population.ceilings.search import Search, World

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Ceiling:
    """One ceiling figure; ``ci95`` is set for Monte-Carlo estimates only."""

    value: float
    method: str  # "exact", "monte_carlo" or "by_construction"
    ci95: tuple[float, float] | None = None
    n_games: int | None = None
    policy: str | None = None  # Monte-Carlo only: the candidate policy that was measured
    #: exact only: the value from each initial state (``state_key`` -> value); ``value`` is
    #: their probability-weighted mean. An evaluation on a handful of deals compares with
    #: the ceiling of exactly those deals, not with the average deal.
    per_initial_state: dict[str, float] | None = None

    def scaled(self, scale: float) -> Ceiling:
        ci = None if self.ci95 is None else (self.ci95[0] * scale, self.ci95[1] * scale)
        per_state = None if self.per_initial_state is None else {k: v * scale for k, v in self.per_initial_state.items()}
        return Ceiling(self.value * scale, self.method, ci, self.n_games, self.policy, per_state)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def state_key(state: pyspiel.State) -> str:
    """How ceilings name a state (and an initial state in ``per_initial_state``)."""
    return _key(state)


def _key(state: pyspiel.State) -> str:
    # The history identifies a state in any game; Tic-Tac-Toe's board string also does and
    # merges transpositions, which keeps the full-tree searches small.
    return str(state) if state.get_game().get_type().short_name == "tic_tac_toe" else state.history_str()


def initial_decision_states(game: pyspiel.Game) -> list[tuple[pyspiel.State, float]]:
    """Expand the root's chance nodes (Kuhn's deal): the initial states and their probabilities."""
    frontier, result = [(game.new_initial_state(), 1.0)], []
    while frontier:
        state, prob = frontier.pop()
        if state.is_chance_node():
            frontier.extend((state.child(a), prob * p) for a, p in state.chance_outcomes())
        else:
            result.append((state, prob))
    return result


def _perfect_information(game: pyspiel.Game) -> bool:
    return game.get_type().information == pyspiel.GameType.Information.PERFECT_INFORMATION


def best_response_payoff(game: pyspiel.Game, opponent: Opponent, agent_seat: int) -> tuple[float, Callable]:
    """Expected payoff of the best response to ``opponent``'s policy, and that policy.

    Imperfect-information games use OpenSpiel's ``BestResponsePolicy``. In a perfect-
    information game the best response is an expectimax over the opponent's policy; it is
    computed here over transposition-merged states because OpenSpiel's version walks the
    whole history tree (550k nodes for Tic-Tac-Toe, seconds per call). The tests check
    that both agree.
    """
    if _perfect_information(game):
        value, _, choose = expectimax(game, opponent, agent_seat, lambda returns: returns[agent_seat])
        return value, choose
    responder = best_response.BestResponsePolicy(game, agent_seat, opponent)
    value = responder.value(game.new_initial_state())

    def choose(state: pyspiel.State) -> int:
        return int(responder.best_response_action(state.information_state_string(agent_seat)))

    return float(value), choose


def omniscient_win_probability(
    game: pyspiel.Game, opponent: Opponent, agent_seat: int
) -> tuple[float, list[float], Callable]:
    """Max P(win) of a player who sees the whole state and plays to win.

    Returns the mean over initial states, the value of each initial state (in
    ``initial_decision_states`` order) and the maximising policy.
    """
    return expectimax(game, opponent, agent_seat, lambda returns: float(returns[agent_seat] > 0))


def known_opponent_win_probability(game: pyspiel.Game, opponent: Opponent, agent_seat: int
                                   ) -> tuple[float, list[float]]:
    """Max P(win) of a player who knows ``opponent`` and the initial state (chance resolved)
    but sees the opponent's moves only as its information state shows them: the mean over
    initial states and each one's value (in ``initial_decision_states`` order). In a game whose
    opponent moves are all public (Kuhn Poker) this is :func:`omniscient_win_probability`."""
    starts = initial_decision_states(game)
    per_state = [float(Search([World(opponent, state, 1.0)], agent_seat).adaptive(1)[0]) for state, _ in starts]
    return float(sum(prob * v for (_, prob), v in zip(starts, per_state))), per_state


def expectimax(
    game: pyspiel.Game, opponent: Opponent, agent_seat: int, utility: Callable[[list[float]], float]
) -> tuple[float, list[float], Callable]:
    """Maximise E[utility(terminal returns)] seeing the whole state, against ``opponent``.

    Chance nodes are averaged, the opponent's moves weighted by its policy. Returns the
    mean over initial states, each initial state's value and the maximising policy.
    """
    memo: dict[str, float] = {}
    best_action: dict[str, int] = {}

    def value_of(state: pyspiel.State) -> float:
        if state.is_terminal():
            return utility(state.returns())
        key = _key(state)
        if key in memo:
            return memo[key]
        if state.is_chance_node():
            value = sum(p * value_of(state.child(a)) for a, p in state.chance_outcomes())
        elif state.current_player() == agent_seat:
            values = {a: value_of(state.child(a)) for a in state.legal_actions()}
            # ties go to the lowest action, so the policy is deterministic
            best_action[key] = max(values, key=lambda a: (values[a], -a))
            value = values[best_action[key]]
        else:
            probs = opponent.action_probabilities(state, state.current_player())
            value = sum(p * value_of(state.child(a)) for a, p in probs.items() if p > 0)
        memo[key] = value
        return value

    starts = initial_decision_states(game)
    per_state = [value_of(state) for state, _ in starts]
    mean = float(sum(prob * v for (_, prob), v in zip(starts, per_state)))

    def choose(state: pyspiel.State) -> int:
        value_of(state)
        return best_action[_key(state)]

    return mean, per_state, choose


def play_games(
    game: pyspiel.Game,
    choose: Callable[[pyspiel.State], int],
    opponent: Opponent,
    agent_seat: int,
    n_games: int,
    seed: int,
) -> np.ndarray:
    """Play ``choose`` against ``opponent`` (reseeded every game): the agent's raw payoffs."""
    rng = np.random.default_rng(seed)
    payoffs = np.empty(n_games)
    for i in range(n_games):
        opponent.reset(int(rng.integers(2**31 - 1)))
        state = game.new_initial_state()
        while not state.is_terminal():
            if state.is_chance_node():
                actions, probs = zip(*state.chance_outcomes())
                state.apply_action(int(rng.choice(actions, p=probs)))
            elif state.current_player() == agent_seat:
                state.apply_action(choose(state))
            else:
                state.apply_action(opponent.act(state))
        payoffs[i] = state.returns()[agent_seat]
    return payoffs


def mean_interval(samples: np.ndarray) -> tuple[float, float]:
    """Student-t confidence interval of a sample mean."""
    if len(samples) < 2 or np.all(samples == samples[0]):
        return float(samples.mean()), float(samples.mean())
    from scipy import stats  # here: every flow and Ray worker imports this module, and few draw an interval

    low, high = stats.t.interval(CONFIDENCE, len(samples) - 1, loc=samples.mean(), scale=stats.sem(samples))
    return float(low), float(high)


def proportion_interval(successes: int, n: int) -> tuple[float, float]:
    """Wilson score interval of a proportion."""
    from scipy import stats

    ci = stats.binomtest(int(successes), int(n)).proportion_ci(CONFIDENCE, method="wilson")
    return float(ci.low), float(ci.high)


class _Smoothed(Opponent):
    """An estimated policy mixed with uniform: (1 - eps) * p + eps / |legal actions|."""

    def __init__(self, estimate: Opponent, epsilon: float) -> None:
        super().__init__(estimate.game)
        self.estimate, self.epsilon = estimate, epsilon

    def action_probabilities(self, state: pyspiel.State, player_id: int | None = None) -> dict[int, float]:
        probs = self.estimate.action_probabilities(state, player_id)
        return {a: (1 - self.epsilon) * p + self.epsilon / len(probs) for a, p in probs.items()}


def _minimax_policy(game: pyspiel.Game) -> Callable[[pyspiel.State], int] | None:
    if not _perfect_information(game):
        return None
    from open_spiel.python.algorithms import minimax_solver

    table = minimax_solver.MinimaxSolver(game.get_type().short_name).solve()

    def choose(state: pyspiel.State) -> int:
        values = table[str(state)].action_values
        return max(state.legal_actions(), key=lambda a: (values[a], -a))

    return choose


#: The most states (by :func:`state_key`) a game may have for its ceilings to search the whole
#: tree; beyond (Connect Four), they are Monte-Carlo estimates of an MCTS player (:func:`_mcts_player`).
MAX_TREE_STATES = 200_000

#: The simulations of the MCTS player whose games estimate a large game's ceilings.
CEILING_MCTS_SIMULATIONS = 100


def fits_full_tree(game: pyspiel.Game) -> bool:
    """Whether ``game`` has at most :data:`MAX_TREE_STATES` states, so that its ceilings can
    search the whole tree (Kuhn Poker, Tic-Tac-Toe, Leduc, small Goofspiel and liar's dice)."""
    return _fits_full_tree(str(game))


@functools.lru_cache(maxsize=32)
def _fits_full_tree(game_string: str) -> bool:
    game = pyspiel.load_game(game_string)
    seen: set[str] = set()
    stack = [game.new_initial_state()]
    while stack:
        state = stack.pop()
        key = _key(state)
        if key in seen or state.is_terminal():
            continue
        seen.add(key)
        if len(seen) > MAX_TREE_STATES:
            return False
        stack.extend(state.child(a) for a in (
            [a for a, _ in state.chance_outcomes()] if state.is_chance_node() else state.legal_actions()))
    return True


def _mcts_player(game: pyspiel.Game, seed: int) -> Callable[[pyspiel.State], int]:
    """An MCTS player (:data:`CEILING_MCTS_SIMULATIONS`, random rollouts) seeded afresh at every
    move from ``seed``. It searches the true state: in a game of imperfect information it
    sees what the rules hide, as the win-probability ceiling's player does."""
    rng = np.random.default_rng(seed)

    def choose(state: pyspiel.State) -> int:
        move_seed = int(rng.integers(2**31 - 1))
        bot = pyspiel.MCTSBot(game, pyspiel.RandomRolloutEvaluator(1, move_seed), 1.4, CEILING_MCTS_SIMULATIONS,
                              100, True, move_seed, False)
        return int(bot.step(state))

    return choose


def opponent_ceilings(
    game: pyspiel.Game, opponent: Opponent, agent_seat: int, n_games: int = 1000, seed: int = 0
) -> dict[str, Ceiling]:
    """Both ceilings for one (opponent, seat), exact or Monte-Carlo as the opponent and the
    game's size allow."""
    if not fits_full_tree(game):
        # too large to search: the games of one MCTS player give both estimates (a lower bound)
        payoffs = play_games(game, _mcts_player(game, seed), opponent, agent_seat, n_games, seed + 1)
        wins = int((payoffs > 0).sum())
        name = f"mcts_{CEILING_MCTS_SIMULATIONS}_simulations"
        return {
            "best_response_payoff": Ceiling(float(payoffs.mean()), "monte_carlo", mean_interval(payoffs), n_games, name),
            "max_win_probability": Ceiling(wins / n_games, "monte_carlo", proportion_interval(wins, n_games),
                                           n_games, name),
        }
    if opponent.explicit:
        br_value, _ = best_response_payoff(game, opponent, agent_seat)
        if _perfect_information(game):  # a transposition-merged search: the information-state one is slow here
            win_value, per_state, _ = omniscient_win_probability(game, opponent, agent_seat)
        else:
            win_value, per_state = known_opponent_win_probability(game, opponent, agent_seat)
        keys = [_key(state) for state, _ in initial_decision_states(game)]
        return {
            "best_response_payoff": Ceiling(br_value, "exact"),
            "max_win_probability": Ceiling(win_value, "exact", per_initial_state=dict(zip(keys, per_state))),
        }
    samples = int(getattr(opponent, "policy_samples", 16))
    estimate = _Smoothed(opponent, epsilon=1.0 / (samples + 1))
    candidates = {
        "best_response_to_estimate": best_response_payoff(game, estimate, agent_seat)[1],
        "win_maximiser_to_estimate": omniscient_win_probability(game, estimate, agent_seat)[2],
    }
    if (minimax := _minimax_policy(game)) is not None:
        candidates["minimax"] = minimax
    pick_games = max(1, n_games // 2)
    trials = {name: play_games(game, choose, opponent, agent_seat, pick_games, seed) for name, choose in candidates.items()}
    by_payoff = max(trials, key=lambda name: trials[name].mean())
    by_wins = max(trials, key=lambda name: (trials[name] > 0).mean())
    # Fresh games (another seed) for the reported figures.
    payoffs = play_games(game, candidates[by_payoff], opponent, agent_seat, n_games, seed + 1)
    won = play_games(game, candidates[by_wins], opponent, agent_seat, n_games, seed + 2) > 0
    wins = int(won.sum())
    return {
        "best_response_payoff": Ceiling(
            float(payoffs.mean()), "monte_carlo", mean_interval(payoffs), n_games, by_payoff
        ),
        "max_win_probability": Ceiling(
            wins / n_games, "monte_carlo", proportion_interval(wins, n_games), n_games, by_wins
        ),
    }


def single_player_ceiling(game: Any, n_levels: int = 200, seed: int = 0) -> Ceiling:
    """Best achievable success rate of a one-player puzzle (Sokoban) within its turn budget.

    Every generated level is solvable. If the longest allowed shortest solution fits in
    ``turn_limit * moves_per_turn`` moves, a perfect player solves every level; otherwise
    the share of levels whose shortest solution fits is estimated on ``n_levels`` levels.
    """
    budget = game.turn_limit * game.moves_per_turn
    if game.max_moves <= budget:
        return Ceiling(1.0, "by_construction")
    fits = sum(game.initial_state(seed + i).data["optimal_moves"] <= budget for i in range(n_levels))
    return Ceiling(fits / n_levels, "monte_carlo", proportion_interval(fits, n_levels), n_levels)


def single_player_return_ceiling(game: Any, success: Ceiling, n_levels: int = 200, seed: int = 0) -> Ceiling:
    """A perfect player's mean episode return on a one-player puzzle: the success ceiling
    times the payoff, plus, with Sokoban's ``box_reward``, what its solution earns for the
    boxes it moves onto targets (they differ by level: estimated on ``n_levels`` levels).
    Sokoban's settings make every level solvable within its turns (``success`` is 1), so
    every sampled level counts its solution's return."""
    if not getattr(game, "box_reward", 0.0):
        return success.scaled(game.payoff_scale)
    if getattr(game, "levels", None) is not None:
        # a fixed set of levels (each seed picks one, uniformly): its mean is exact
        mean = float(np.mean([game.solved_return(game.initial_state(i)) for i in range(game.levels)]))
        return Ceiling(success.value * mean, "exact")
    returns = np.array([game.solved_return(game.initial_state(seed + i)) for i in range(n_levels)])
    spread = float(returns.std(ddof=1)) if n_levels > 1 else 0.0
    mean, half = float(returns.mean()), 1.96 * spread / np.sqrt(n_levels)
    return Ceiling(success.value * mean, "monte_carlo", (success.value * (mean - half), success.value * (mean + half)),
                   n_levels)
