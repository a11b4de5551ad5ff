"""An opponent played by a model (a league snapshot, ``ModelSeat``) in the rollout engine: it
plays from its own view, batched, makes no rows, and an invalid reply becomes a uniformly
drawn legal move, counted. A scripted backend in the opponent's seat must play exactly as
the same rule does as a scripted opponent."""

from __future__ import annotations

import dataclasses
import json

import polars as pl
import pytest
from conftest import defaults, rollout_config, sampling

from mage.backends.scripted import ScriptedBackend
from mage.evaluation import exploitability as kuhn
from mage.games.kuhn_poker import KuhnPoker
from mage.opponents import MODEL_OPPONENT
from mage.rollout import RolloutEngine, plan_meta_episodes


class Recording(ScriptedBackend):
    """A scripted backend that keeps every batch it was sent."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[list] = []

    def generate(self, requests, sampling_settings):
        self.batches.append(list(requests))
        return super().generate(requests, sampling_settings)


class Joint(ScriptedBackend):
    """An agent's backend that answers its opponents' calls in its own batches, as vLLM's views of
    one engine do (``generate_joint``), each part by its own backend; it keeps each joint batch's
    part sizes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.joint_batches: list[list[int]] = []
        self.opponent_seeds: list[int] = []

    def joins(self, others):
        return all(isinstance(other, ScriptedBackend) for other in others)

    def generate_joint(self, batches, sampling_settings):
        self.joint_batches.append([len(part) for _, part in batches])
        self.opponent_seeds += [request.seed for _, part in batches[1:] for request in part]
        return [ScriptedBackend.generate(backend, list(part), sampling_settings) for backend, part in batches]


def played(game: str, rule: str, as_model: bool, opponent_backend=None, groups: int = 8, agent=None, **params):
    settings = defaults(f"game={game}")
    scripted = next(e for e in settings.population.train.values())
    entry = dataclasses.replace(scripted, id="snapshot-1", opponent=MODEL_OPPONENT if as_model else rule,
                                params={} if as_model else params, share=1.0)
    specs = plan_meta_episodes([entry], num_groups=groups, group_size=2, seed=3)
    opponents = {"snapshot-1": opponent_backend or ScriptedBackend({"rule": rule, **params})} if as_model else None
    engine = RolloutEngine(agent or ScriptedBackend("random", seed=0), rollout_config(episodes=3, group_size=2),
                           settings.game.params, opponents=opponents)
    table = engine.run(specs, sampling(seed=5), progress=False)
    return table, engine.last_stats


@pytest.mark.parametrize(("game", "rule", "params"), [
    ("kuhn_poker", "conservative", {}), ("kuhn_poker", "aggressive", {}),
    ("tic_tac_toe", "preferred_pattern", {"pattern": "reading_order"})])  # deterministic rules: no draws to align
def test_a_rule_in_the_model_s_seat_plays_as_the_scripted_opponent(game, rule, params):
    scripted, _ = played(game, rule, as_model=False, **params)
    modelled, stats = played(game, rule, as_model=True, **params)
    assert stats.opponent_calls > 0 and stats.opponent_invalid == 0
    assert modelled.height == scripted.height == stats.calls  # the opponent's calls make no rows
    assert modelled.equals(scripted)


@pytest.mark.parametrize(("game", "agent_rule", "rule", "params"), [
    ("kuhn_poker", "aggressive", "conservative", {}),
    ("tic_tac_toe", "preferred_pattern", "preferred_pattern", {"pattern": "reading_order"})])
def test_opponents_asked_in_the_agent_s_batch_play_as_the_scripted_opponent(game, agent_rule, rule, params):
    """A backend that batches its opponents' calls with its own (vLLM: each under its LoRA
    adapter) is sent one batch per step, holding the agent's calls and the opponents' to move,
    and the game is the one the scripted opponent plays. The agent is a deterministic rule: a
    random one draws in batch order, which joint batches change."""
    agent_params = {"pattern": "centre_then_edges"} if game == "tic_tac_toe" else {}
    scripted, _ = played(game, rule, as_model=False, agent=ScriptedBackend({"rule": agent_rule, **agent_params}),
                         **params)
    joint = Joint({"rule": agent_rule, **agent_params})
    opponent = Recording({"rule": rule, **params})
    modelled, stats = played(game, rule, as_model=True, agent=joint, opponent_backend=opponent, **params)
    assert stats.opponent_calls > 0 and stats.opponent_invalid == 0
    assert not opponent.batches  # never asked on its own
    assert stats.backend_calls == len(joint.joint_batches)
    assert sum(sizes[1] for sizes in joint.joint_batches if len(sizes) > 1) == stats.opponent_calls
    assert any(len(sizes) > 1 and sizes[0] > 0 for sizes in joint.joint_batches)  # the agent's and theirs together
    assert modelled.height == stats.calls and modelled.equals(scripted)
    # each opponent call drew from the seed it draws from when asked on its own: from the
    # rollout's seed, not from the step's (which depends on what else is in the batch)
    alone = Recording({"rule": rule, **params})
    played(game, rule, as_model=True, agent=ScriptedBackend({"rule": agent_rule, **agent_params}),
           opponent_backend=alone, **params)
    assert sorted(joint.opponent_seeds) == sorted(r.seed for batch in alone.batches for r in batch)


def test_the_opponent_sees_its_own_card_and_nothing_of_the_agent_s():
    backend = Recording("intermediate")
    table, stats = played("kuhn_poker", "intermediate", as_model=True, opponent_backend=backend)
    requests = [request for batch in backend.batches for request in batch]
    assert len(requests) == stats.opponent_calls > 0
    assert max(len(batch) for batch in backend.batches) > 1  # batched across meta-episodes
    names = ("Jack (J)", "Queen (Q)", "King (K)")
    for request in requests:
        view = request.context
        own, agent = view.initial.data["cards"][view.agent], view.initial.data["cards"][1 - view.agent]
        shown = request.prompt.replace(KuhnPoker().rules_text(), "")  # the rules name every card
        assert f"Your card: {names[own]}" in shown and names[agent] not in shown
        # the first-episode prompt the snapshot saw in training (3 episodes announced), which is also
        # the one its exploitability is read at (mage.evaluation.exploitability)
        betting = tuple(int(a) for a in view.state.history()[2:])
        info = kuhn.InformationState(view.agent, own, betting)
        assert request.prompt == kuhn.first_episode_prompt(KuhnPoker(), info, 3, "reflection_only")
    # every deal the agent played was the opponent's view's too: its card is the other one
    deals = {tuple(json.loads(s)["data"]["cards"]) for s in table["initial_state"].unique()}
    assert {tuple(r.context.initial.data["cards"]) for r in requests} <= deals


def test_an_invalid_opponent_reply_becomes_a_random_legal_move_and_is_counted():
    always_invalid = ScriptedBackend("conservative", invalid_rate=1.0, seed=1)
    table, stats = played("kuhn_poker", "conservative", as_model=True, opponent_backend=always_invalid)
    assert stats.opponent_invalid == stats.opponent_calls > 0
    assert table.height == stats.calls
    ended = table.filter(pl.col("done"))
    assert ended.height == table.filter(pl.col("phase") == "play").group_by("meta_id", "episode").len().height
    # a conservative opponent never bets with J or Q; drawn at random, it does
    scripted, _ = played("kuhn_poker", "conservative", as_model=False)
    assert not table.equals(scripted)


def test_a_model_opponent_without_a_backend_is_named():
    settings = defaults("game=kuhn_poker")
    entry = dataclasses.replace(next(iter(settings.population.train.values())), id="snapshot-7",
                                opponent=MODEL_OPPONENT, params={}, share=1.0)
    engine = RolloutEngine(ScriptedBackend("random"), rollout_config(group_size=2), settings.game.params)
    with pytest.raises(ValueError, match="snapshot-7 is played by a model"):
        engine.run(plan_meta_episodes([entry], 2, 2, seed=0), sampling(), progress=False)


def test_a_configuration_cannot_name_the_model_opponent():
    from mage.settings import SettingsError, load_settings

    with pytest.raises((SettingsError, ValueError), match="league snapshot"):
        load_settings(["game=kuhn_poker", "population.train.conservative.opponent=model"])
