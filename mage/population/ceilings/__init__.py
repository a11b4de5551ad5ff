"""Ceilings: the best any player could do (docs/method.md, The metrics).

* :mod:`mage.population.ceilings.one_episode`: against one fixed opponent in one episode, the best-response
  payoff and the best win probability, per seat and per initial state;
* :mod:`mage.population.ceilings.across_episodes`: per episode k of a meta-episode, the known-opponent,
  memoryless and adaptive ceilings of pass@k over a population (the value of adaptation);
* :mod:`mage.population.ceilings.search`: the exact search over what the agent sees that both use.
"""

from mage.population.ceilings.across_episodes import KINDS, Unavailable, ceilings_across_episodes, shown_after
from mage.population.ceilings.one_episode import (
    CONFIDENCE,
    Ceiling,
    best_response_payoff,
    expectimax,
    initial_decision_states,
    known_opponent_win_probability,
    mean_interval,
    omniscient_win_probability,
    opponent_ceilings,
    play_games,
    proportion_interval,
    single_player_ceiling,
    single_player_return_ceiling,
    state_key,
)

__all__ = ["CONFIDENCE", "KINDS", "Ceiling", "Unavailable", "best_response_payoff", "ceilings_across_episodes",
           "expectimax", "initial_decision_states", "known_opponent_win_probability", "mean_interval", "omniscient_win_probability",
           "opponent_ceilings", "play_games", "proportion_interval", "shown_after", "single_player_ceiling",
           "single_player_return_ceiling", "state_key"]
