"""Three ceilings per episode k (docs/method.md, "Three ceilings per episode").

With early stop, success at episode k is pass@k: the meta-episode was won within its first k
episodes. Every episode restarts from the same initial state against the same opponent, which
the agent does not know: it is drawn from the split's population by share. Three policies
bound pass@k, each the best of its kind:

* **known opponent**: knows the opponent and the whole initial state (both Kuhn cards), sees
  the moves as the rules show them, and adapts within the meta-episode as it likes (against an
  opponent that does not remember, ``1 - (1 - p)^k``, p its one-episode best);
* **memoryless**: does not know the opponent, and uses nothing that earlier episodes revealed;
  it plays a pure strategy per episode chosen in advance (an open-loop schedule: episode 2 may
  be played differently from episode 1, but not because of what episode 1 showed);
* **adaptive**: does not know the opponent, but knows the population's prior and uses all it
  has seen: its view of every move, and each finished episode as later prompts show it (the
  moves and the result line, which a perfect reflection carries forward).

Averaged over the prior, memoryless <= adaptive <= known opponent. adaptive - memoryless is
the **value of adaptation**: what a policy gains only by using earlier episodes. Per opponent,
the memoryless and adaptive figures are what the prior's best policy does against that
opponent (it may do better against one opponent by giving up on another).

All three are exact (:mod:`mage.population.ceilings.search`), for games whose initial states can be
listed (:meth:`mage.games.base.Game.initial_states`) against opponents with explicit policies;
otherwise :class:`Unavailable` says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import numpy as np

from mage.games.base import Game, InitialState
from mage.games.openspiel_episode import Replay
from mage.population.ceilings.one_episode import state_key
from mage.population.ceilings.search import Search, TooLarge, World

#: The three ceilings, in the order a report shows them.
KINDS = ("memoryless", "adaptive", "known_opponent")


class Unavailable(ValueError):
    """The ceilings across episodes cannot be computed exactly for this game or population."""


def shown_after(game: Game, initial: InitialState, history: Sequence[int]) -> str:
    """What a finished episode from ``initial`` with OpenSpiel ``history`` shows the agent in
    later prompts: its moves and its result line, rendered by the game's own episode."""
    return _shown_after(game, initial.to_json(), tuple(int(a) for a in history))


@cache
def _shown_after(game: Game, initial_json: str, history: tuple[int, ...]) -> str:
    initial = InitialState.from_json(initial_json)
    state = game.openspiel_state(initial)
    agent, opponent = [], []
    for action in history[len(state.history()):]:
        (agent if state.current_player() == initial.agent_seat else opponent).append(action)
        state.apply_action(action)
    episode = game.new_episode(initial, Replay(opponent))
    for action in agent:
        episode.apply_agent_actions([action])
    return f"{episode.render_history()}\n{episode.describe_end()}"


def _worlds(game: Game, opponents: Mapping[str, tuple[Any, float]], seat: int
            ) -> list[tuple[str, InitialState, World]]:
    if getattr(game, "openspiel_game", None) is None:
        raise Unavailable(f"{game.name} is not an OpenSpiel game")
    if game.chance_in_play:
        raise Unavailable(f"{game.name}: chance acts after the deal, drawn from the seed the same in every "
                          "episode, where the searches assume fresh draws")
    states = game.initial_states(seat)
    if states is None:
        raise Unavailable(f"{game.name}'s initial states cannot be listed (with these game parameters)")
    total = sum(share for _, share in opponents.values())
    worlds = []
    for opponent_id, (opponent, share) in opponents.items():
        if not getattr(opponent, "explicit", False):
            raise Unavailable(f"opponent {opponent_id} has no explicit policy (its moves can only be sampled)")
        for initial, probability in states:
            worlds.append((opponent_id, initial, World(opponent, game.openspiel_state(initial), share / total * probability)))
    return worlds


def ceilings_across_episodes(game: Game, opponents: Mapping[str, tuple[Any, float]], seat: int,
                             episodes: int) -> dict[str, dict[str, dict[str, Any]]]:
    """The three ceilings for k = 1..``episodes`` against ``opponents`` (id -> (opponent,
    share); shares are relative), the agent in ``seat``.

    Returns ``{kind: {opponent_id: {"value": [pass@1, ..., pass@episodes], "per_initial_state":
    {state key: [...]}}}}`` for each kind of :data:`KINDS`; an opponent's value is the mean over
    initial states by their probability.

    Raises:
        Unavailable: a game or opponent the searches cannot take, or too large to enumerate.
    """
    listed = _worlds(game, opponents, seat)
    worlds = [world for _, _, world in listed]
    values = {kind: np.zeros((len(worlds), episodes)) for kind in KINDS}
    try:
        # the agent's view of the initial state (its card) splits the worlds into independent searches
        groups: dict[str, list[int]] = {}
        for index, world in enumerate(worlds):
            groups.setdefault(world.start.information_state_string(seat), []).append(index)
        for members in groups.values():
            search = Search([worlds[i] for i in members], seat,
                            lambda w, history, m=members: shown_after(game, listed[m[w]][1], history))
            for k in range(1, episodes + 1):
                values["adaptive"][members, k - 1] = search.adaptive(k)
            values["memoryless"][members] = np.stack(search.memoryless(episodes), axis=1)
        for index, (_, initial, world) in enumerate(listed):
            alone = Search([World(world.opponent, world.start, 1.0)], seat,
                           lambda w, history, initial=initial: shown_after(game, initial, history))
            values["known_opponent"][index] = [alone.adaptive(k)[0] for k in range(1, episodes + 1)]
    except TooLarge as error:
        raise Unavailable(f"{game.name}: {error}") from None
    result: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in KINDS}
    for opponent_id in opponents:
        rows = [i for i, (owner, _, _) in enumerate(listed) if owner == opponent_id]
        probabilities = np.array([worlds[i].weight for i in rows])
        probabilities = probabilities / probabilities.sum()
        for kind in KINDS:
            result[kind][opponent_id] = {
                "value": [float(v) for v in probabilities @ values[kind][rows]],
                "per_initial_state": {state_key(worlds[i].start): [float(v) for v in values[kind][i]] for i in rows},
            }
    return result
