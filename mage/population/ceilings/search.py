"""Exact best pass@k over what the agent sees, against a prior over worlds.

A **world** is one way a meta-episode can be: an opponent (an explicit policy, which may read
the meta-episode's earlier episodes, :attr:`mage.opponents.base.Opponent.past`) and the state
every episode starts from, with its prior probability. pass@k is the probability that the
agent wins one of the first k episodes (with early stop, its success at episode k).

The agent sees, in an episode, its OpenSpiel information state; of a finished episode, what
``render`` says it is shown (the moves and the result line of later prompts). Two searches:

* :meth:`Search.adaptive`: the best policy that uses everything it has seen, an expectimax over
  the agent's observations. At each of its decisions the worlds still possible are those that
  gave the same observations; it picks the action of highest total success (ties: the lowest
  action). With one world this is the best player who knows the opponent and the whole state.
* :meth:`Search.memoryless`: the best schedule of pure strategies, one per episode, chosen in
  advance (no use of what earlier episodes showed). pass@k is multilinear in the episodes'
  behaviour strategies (every trajectory's probability is a product in which each episode's
  decision probabilities appear once), so a pure schedule attains the maximum.

Both return each world's success, so a ceiling splits by opponent and by initial state. Only
small games fit: :class:`TooLarge` is raised where one episode has more than
``MAX_EPISODE_STATES`` states, or a search takes more than ``MAX_WORK`` steps.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyspiel

#: Most tree steps one search may take (a second or two in Python; Kuhn Poker's largest takes about
#: 3,000, rock-paper-scissors' 10,000 at k = 3); beyond it, :class:`TooLarge`. Liar's dice with one
#: four-sided die each needs more at k = 2: every search that cannot finish spends this budget
#: first, so it is ten times the largest that does, not more (at 500,000, seeding liar's dice's
#: population spent 20 s learning that its ceilings across episodes cannot be computed).
MAX_WORK = 100_000
#: Most states one episode may have (every move of every player): a game beyond it (Tic-Tac-Toe's
#: 550,000) is refused at once, before a search spends its budget on it.
MAX_EPISODE_STATES = 20_000
TIE = 1e-12  # a later action must be better by more than this to replace an earlier one

#: What a finished episode shows the agent: (world index, the episode's OpenSpiel history) -> text.
Render = Callable[[int, Sequence[int]], str]


class TooLarge(ValueError):
    """The game is too large for an exact search of its meta-episodes."""


@dataclass(frozen=True)
class World:
    """An opponent (with ``action_probabilities`` and ``reset(seed, past)``), the state every
    episode starts from, and the world's prior probability."""

    opponent: Any
    start: pyspiel.State
    weight: float


def episode_states(start: pyspiel.State, cap: int = MAX_EPISODE_STATES) -> int:
    """The states of one episode from ``start``, every move of every player; :class:`TooLarge`
    beyond ``cap``."""
    count, frontier = 0, [start]
    while frontier:
        state = frontier.pop()
        count += 1
        if count > cap:
            raise TooLarge(f"an episode has more than {cap:,} states: the meta-episodes are too many to enumerate")
        if not state.is_terminal():
            actions = [a for a, _ in state.chance_outcomes()] if state.is_chance_node() else state.legal_actions()
            frontier += [state.child(a) for a in actions]
    return count


@dataclass(frozen=True)
class _Particle:
    """One path of one world: where it is, the meta-episode's finished histories, its
    probability (prior times path), what the agent saw since its last decision, its episode."""

    world: int
    state: pyspiel.State
    past: tuple[tuple[int, ...], ...]
    weight: float
    seen: str
    episode: int


class Search:
    """The searches of the module docstring over ``worlds``, the agent in ``seat``."""

    def __init__(self, worlds: Sequence[World], seat: int, render: Render | None = None) -> None:
        if not worlds:
            raise ValueError("a search needs at least one world")
        self.worlds, self.seat, self.render = list(worlds), seat, render
        self.work = 0
        for start in {world.start.history_str(): world.start for world in self.worlds}.values():
            episode_states(start)

    # -- the tree ------------------------------------------------------------------------------
    def _tick(self) -> None:
        self.work += 1
        if self.work > MAX_WORK:
            raise TooLarge(f"more than {MAX_WORK:,} steps: the meta-episodes are too many to enumerate")

    def _shown(self, particle: _Particle) -> str:
        history = particle.state.history()
        if self.render is not None:
            return self.render(particle.world, history)
        return particle.state.information_state_string(self.seat)

    def _opponent_policy(self, particle: _Particle) -> dict[int, float]:
        opponent = self.worlds[particle.world].opponent
        opponent.reset(0, particle.past)
        return opponent.action_probabilities(particle.state, particle.state.current_player())

    def _advance(self, particle: _Particle, k: int, success: np.ndarray, decisions: list[_Particle],
                 choose: Callable[[_Particle], int] | None = None) -> None:
        """Follow ``particle`` to the agent's next decision (appended to ``decisions``), a win
        within ``k`` episodes (its weight added to ``success``) or a loss of the k-th episode.
        With ``choose``, the agent's moves are ``choose(particle)`` and nothing is appended."""
        self._tick()
        state = particle.state
        if state.is_terminal():
            if state.returns()[self.seat] > 0:
                success[particle.world] += particle.weight
            elif particle.episode < k:
                start = self.worlds[particle.world].start
                self._advance(replace(particle, state=start, past=(*particle.past, tuple(state.history())),
                                      seen=f"{particle.seen}\x00{self._shown(particle)}", episode=particle.episode + 1),
                              k, success, decisions, choose)
            return
        if state.is_chance_node():
            outcomes = state.chance_outcomes()
        elif state.current_player() == self.seat:
            if choose is not None:
                self._advance(replace(particle, state=state.child(choose(particle))), k, success, decisions, choose)
                return
            decisions.append(replace(particle, seen=f"{particle.seen}\x01{state.information_state_string(self.seat)}"))
            return
        else:
            outcomes = sorted(self._opponent_policy(particle).items())
        for action, probability in outcomes:
            if probability > 0:
                self._advance(replace(particle, state=state.child(action), weight=particle.weight * probability),
                              k, success, decisions, choose)

    def _starts(self) -> list[_Particle]:
        return [_Particle(i, world.start, (), world.weight, "", 1) for i, world in enumerate(self.worlds)]

    @staticmethod
    def _by_observation(decisions: Sequence[_Particle]) -> list[list[_Particle]]:
        groups: dict[str, list[_Particle]] = {}
        for particle in decisions:
            groups.setdefault(particle.seen, []).append(particle)
        return [groups[seen] for seen in sorted(groups)]

    # -- adaptive --------------------------------------------------------------------------------
    def adaptive(self, k: int) -> np.ndarray:
        """Each world's P(win within ``k`` episodes) under the policy that maximises the prior's
        total, using everything the agent has seen (weights divided out)."""
        success = np.zeros(len(self.worlds))
        decisions: list[_Particle] = []
        for particle in self._starts():
            self._advance(particle, k, success, decisions)
        for group in self._by_observation(decisions):
            success += self._best(group, k)
        return success / self._weights()

    def _best(self, group: Sequence[_Particle], k: int) -> np.ndarray:
        best, best_total = None, -math.inf
        for action in group[0].state.legal_actions():
            success = np.zeros(len(self.worlds))
            decisions: list[_Particle] = []
            for particle in group:
                self._advance(replace(particle, state=particle.state.child(action), seen=""), k, success, decisions)
            for child in self._by_observation(decisions):
                success += self._best(child, k)
            if success.sum() > best_total + TIE:
                best, best_total = success, float(success.sum())
        return best

    def _weights(self) -> np.ndarray:
        return np.array([world.weight for world in self.worlds])

    # -- memoryless ------------------------------------------------------------------------------
    def information_states(self, k: int) -> dict[str, list[int]]:
        """Every information state at which the agent decides within ``k`` episodes, whatever it
        plays, with its legal actions."""
        found: dict[str, list[int]] = {}
        frontier: list[_Particle] = []
        for particle in self._starts():
            self._advance(particle, k, np.zeros(len(self.worlds)), frontier)
        while frontier:
            particle = frontier.pop()
            found.setdefault(particle.state.information_state_string(self.seat), particle.state.legal_actions())
            for action in particle.state.legal_actions():
                self._advance(replace(particle, state=particle.state.child(action)), k, np.zeros(len(self.worlds)),
                              frontier)
        return found

    def schedule_success(self, strategies: Sequence[dict[str, int]], k: int) -> np.ndarray:
        """Each world's P(win within ``k`` episodes) when episode j is played by the pure
        strategy ``strategies[j - 1]`` (information state -> action)."""
        success = np.zeros(len(self.worlds))

        def choose(particle: _Particle) -> int:
            return strategies[particle.episode - 1][particle.state.information_state_string(self.seat)]

        for particle in self._starts():
            self._advance(particle, k, success, [], choose)
        return success / self._weights()

    def memoryless(self, episodes: int) -> list[np.ndarray]:
        """For k = 1..``episodes``: each world's P(win within k) under the schedule of pure
        strategies that maximises the prior's total for that k."""
        infos = self.information_states(episodes)
        names = sorted(infos)
        pure = [dict(zip(names, actions)) for actions in itertools.product(*(infos[n] for n in names))]
        weights = self._weights()
        remembers = any(getattr(world.opponent, "remembers", False) for world in self.worlds)
        if not remembers:
            # episodes are independent given the world: one episode's win probability per
            # (strategy, world) decides every schedule, and a schedule's order does not matter
            wins = np.array([self.schedule_success([strategy], 1) for strategy in pure])
        results = []
        for k in range(1, episodes + 1):
            if remembers:
                schedules = itertools.product(range(len(pure)), repeat=k)
                count = len(pure) ** k
            else:
                schedules = itertools.combinations_with_replacement(range(len(pure)), k)
                count = math.comb(len(pure) + k - 1, k)
            if count * len(self.worlds) > MAX_WORK:
                raise TooLarge(f"{count:,} schedules of {len(pure)} pure strategies over {k} episodes")
            best, best_total = None, -math.inf
            for schedule in schedules:
                if remembers:
                    success = self.schedule_success([pure[i] for i in schedule], k)
                else:
                    success = 1.0 - np.prod(1.0 - wins[list(schedule)], axis=0)
                total = float(success @ weights)
                if total > best_total + TIE:
                    best, best_total = success, total
            results.append(best)
        return results
