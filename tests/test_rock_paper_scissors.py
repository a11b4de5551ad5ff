"""Rock-paper-scissors: the game, its opponents, and each link of the chain that carries what
episode k showed into episode k + 1 and rewards using it (docs/method.md, "Three ceilings
per episode"):

1. episode k + 1's prompt holds what the opponent played (and, under the ablation
   ``context_mode: none``, does not);
2. the warm start's reflections say it;
3. a move that used it gets a positive advantage under MAGE, by hand;
4. the update raises that move's probability, and lowers the move that ignored it.
"""

from __future__ import annotations

import itertools

import polars as pl
import pytest
import torch
from conftest import defaults, rollout_config, sampling, train_config
from hypothesis import given, settings
from hypothesis import strategies as st

from mage.algo import Penalties, add_advantages, add_returns
from mage.backends.scripted import ScriptedBackend
from mage.games import Outcome, make_game
from mage.games.rock_paper_scissors import MOVES
from mage.models.policy import load_policy
from mage.opponents import make
from mage.protocol import parse_action
from mage.rollout import RolloutEngine, plan_meta_episodes
from mage.rollout.prompts import EpisodeRecord, play_prompt
from mage.rollout.schema import from_rows
from mage.trainer.policy_trainer import PolicyTrainer

GAME = "rock_paper_scissors"
# who wins, written out again: (mine, theirs) -> outcome
BEATEN_BY = {"rock": "paper", "paper": "scissors", "scissors": "rock"}


def expected(mine: str, theirs: str) -> Outcome:
    return Outcome.DRAW if mine == theirs else Outcome.WIN if BEATEN_BY[theirs] == mine else Outcome.LOSS


@pytest.mark.parametrize("seat", [0, 1])
@pytest.mark.parametrize("mine,theirs", list(itertools.product(MOVES, repeat=2)))
def test_every_round_scores_as_the_rules_say(seat, mine, theirs):
    game = make_game(GAME)
    opponent = make(GAME, "constant", move=theirs)
    episode = game.new_episode(game.initial_state(5, seat), opponent)
    # the opponent may have chosen already (seat 1): nothing of it shows before the agent moves
    assert episode.render_state() == "Choose your move. Legal actions: rock, paper, scissors."
    episode.apply_agent_actions([episode.legal_actions()[mine]])
    outcome = expected(mine, theirs)
    assert episode.is_terminal and episode.outcome() == outcome
    assert episode.agent_return() == {Outcome.WIN: 10.0, Outcome.DRAW: 0.0, Outcome.LOSS: -10.0}[outcome]
    verdict = {Outcome.WIN: "you won", Outcome.DRAW: "a draw", Outcome.LOSS: "you lost"}[outcome]
    assert episode.render_result() == f"You played {mine}, the opponent played {theirs}: {verdict}."


REPLIES = st.one_of(
    st.text(max_size=40),
    st.builds(lambda before, inner, after: f"{before}<action>{inner}</action>{after}", st.text(max_size=8),
              st.one_of(st.sampled_from([*MOVES, *(m.upper() for m in MOVES), " paper ", "rock, paper", "lizard"]),
                        st.text(max_size=10)),
              st.text(max_size=8)))


@given(REPLIES)
@settings(max_examples=300, deadline=None)
def test_replies_parse_without_raising_and_name_one_move_or_none(reply):
    game = make_game(GAME)
    episode = game.new_episode(game.initial_state(0), make(GAME, "constant", move="rock"))
    parsed = parse_action(reply, episode.action_aliases(), game.moves_per_turn)
    assert parsed.valid == (len(parsed.actions) == 1)
    if parsed.valid:
        assert MOVES[parsed.actions[0]] == parsed.text.strip(" .!'\"").lower()


def test_each_move_parses():
    game = make_game(GAME)
    episode = game.new_episode(game.initial_state(0), make(GAME, "constant", move="rock"))
    for move in MOVES:
        assert parse_action(f"<action>{move}</action>", episode.action_aliases(), 1).actions == (MOVES.index(move),)
    assert not parse_action("<action>rock, paper</action>", episode.action_aliases(), 1).valid


def test_opponents_and_their_parameters():
    game = make_game(GAME).openspiel_game
    state = game.new_initial_state()
    assert make(GAME, "biased", move="paper", probability=0.7).action_probabilities(state, 0) == \
        pytest.approx({0: 0.15, 1: 0.7, 2: 0.15})
    beat, copy = make(GAME, "reactive", answer="beat"), make(GAME, "reactive", answer="copy")
    for opponent in (beat, copy):
        assert opponent.remembers and opponent.action_probabilities(state, 1) == pytest.approx({0: 1 / 3, 1: 1 / 3, 2: 1 / 3})
    # the agent (seat 0) played scissors in the episode before: beat answers rock, copy scissors
    beat.reset(0, [(2, 0)])
    copy.reset(0, [(2, 0)])
    assert beat.action_probabilities(state.child(1), 1) == {0: 1.0, 1: 0.0, 2: 0.0}
    assert copy.action_probabilities(state.child(1), 1) == {0: 0.0, 1: 0.0, 2: 1.0}
    for bad in ({"move": "lizard"}, {"move": "rock", "probability": 0.2}):
        with pytest.raises(ValueError):
            make(GAME, "biased", **bad)
    with pytest.raises(ValueError, match="answer"):
        make(GAME, "reactive", answer="mirror")


def play(held_out: bool, mode: str, rule: str | dict = "random", groups=6) -> pl.DataFrame:
    settings_ = defaults(f"game={GAME}")
    entries = [e for e in settings_.population.entries if (e.split == "held_out") == held_out]
    specs = plan_meta_episodes(entries, groups, 2, seed=3)
    engine = RolloutEngine(ScriptedBackend(rule, seed=0), rollout_config(group_size=2, early_stop=False, context_mode=mode),
                           settings_.game.params)
    return engine.run(specs, sampling(), progress=False)


def test_an_opponent_that_remembers_answers_the_agents_last_move():
    table = play(True, "reflection_only", groups=20).filter(pl.col("phase") == "play")
    moves = {(r["meta_id"], r["episode"]): r for r in table.iter_rows(named=True)}
    checked = 0
    for (meta, episode), row in moves.items():
        if episode == 1 or row["opponent"] not in ("beats_your_last", "copies_your_last"):
            continue
        mine_before = moves[(meta, episode - 1)]["action"]
        reply = BEATEN_BY[mine_before] if row["opponent"] == "beats_your_last" else mine_before
        result = expected(row["action"], reply)
        assert (row["won"], row["draw"]) == (result == Outcome.WIN, result == Outcome.DRAW), row
        checked += 1
    assert checked >= 10


# -- link 1 and 2: the prompt and the reflection ------------------------------------------------
def test_the_next_episodes_prompt_holds_what_the_opponent_played_and_the_ablation_removes_it():
    shown = play(False, "reflection_only")
    hidden = play(False, "none")
    for table, holds in ((shown, True), (hidden, False)):
        later = table.filter((pl.col("phase") == "play") & (pl.col("episode") > 1))
        assert later.height > 0
        for row in later.iter_rows(named=True):
            theirs = row["opponent"].removeprefix("always_")
            assert (f"the opponent played {theirs}:" in row["prompt"]) == holds, row["prompt"]
    # without it, a later episode's prompt is the same whoever the opponent is
    prompts = hidden.filter((pl.col("phase") == "play") & (pl.col("episode") == 2))["prompt"]
    assert prompts.n_unique() == 1
    # link 2: the warm start's player writes what happened and what beats it into its reflection
    for row in shown.filter(pl.col("phase") == "reflect").iter_rows(named=True):
        theirs = row["opponent"].removeprefix("always_")
        beat = BEATEN_BY[theirs]
        assert f"the opponent played {theirs}. Next time: {theirs} loses to {beat}, so play {beat}." in row["response"]


# -- link 3 and 4: the advantage of using it, and the update -----------------------------------
def chain_rows() -> list[dict]:
    """One group against always_paper, every meta-episode lost episode 1 with rock. Episode 2:
    metas 0 and 1 play scissors (what beats the paper they saw: won), metas 2 and 3 rock again
    (lost); episode 3: meta 2 scissors (won), meta 3 paper (a draw)."""
    plays = {0: ["rock", "scissors"], 1: ["rock", "scissors"], 2: ["rock", "rock", "scissors"], 3: ["rock", "rock", "paper"]}
    rows = []
    for meta, moves in plays.items():
        for episode, move in enumerate(moves, start=1):
            result = expected(move, "paper")
            ret = {Outcome.WIN: 10.0, Outcome.DRAW: 0.0, Outcome.LOSS: -10.0}[result]
            common = {"run_id": "r", "iteration": 1, "policy_version": 0, "group_id": 0, "meta_id": meta, "game": GAME,
                      "opponent": "always_paper", "seat": 0, "seed": 1, "initial_state": "{}", "episode": episode,
                      "prompt": "", "prompt_token_ids": [1], "response_token_ids": [7, 7, 7],
                      "response_logprobs": [0.0] * 3, "finish_reason": "stop", "dropped_episodes": 0, "valid": True,
                      "invalid_reason": None, "episode_return": ret, "won": ret > 0, "draw": ret == 0,
                      "truncated": False}
            if episode > 1:
                rows.append(common | {"turn": 0, "phase": "reflect", "observation": "end", "response": "<remark/>",
                                      "action": None, "step_reward": 0.0, "done": False})
            rows.append(common | {"turn": 1, "phase": "play", "observation": "Choose your move.",
                                  "response": f"<action>{move}</action>", "action": move, "step_reward": ret,
                                  "done": True})
    return rows


def test_a_move_that_used_what_episode_one_showed_gets_a_positive_advantage_by_hand():
    settings_ = defaults(f"game={GAME}")
    penalties = Penalties(invalid=settings_.game.invalid_penalty, length=0.0, max_response_tokens=128)
    table = add_advantages(add_returns(from_rows(chain_rows()), settings_.algo, penalties), settings_.algo)
    plays = table.filter(pl.col("phase") == "play").sort("meta_id", "episode")
    advantage = {(r["meta_id"], r["episode"]): r["advantage"] for r in plays.iter_rows(named=True)}
    # D: metas 0, 1: -10, +20; meta 2: -10, 0, +20; meta 3: -10, 0, +10. Episode term, baseline per
    # episode (the preset's): episode 2's calls (plays and the reflections before them) score
    # 20, 20, 0, 0 (mean 10): scissors +10, rock -10.
    # Step term, one global anchor for every play (the same observation): G = D + 0.6 G(next):
    # 2, 2, -2.8, -6.4 | 20, 20, 12, 6 | 20, 10, mean 8.28.
    assert advantage[(0, 2)] == pytest.approx(10 + 20 - 8.28)
    assert advantage[(2, 2)] == pytest.approx(-10 + 12 - 8.28)
    assert advantage[(3, 2)] == pytest.approx(-10 + 6 - 8.28)
    assert (settings_.algo.objective, settings_.algo.anchor, settings_.algo.episode_baseline) == ("differential", "global", "per_episode")


def test_the_update_raises_the_move_that_used_it_and_lowers_the_one_that_did_not(tiny_model_dir):
    settings_ = defaults(f"game={GAME}")
    game = make_game(GAME)
    initial = game.initial_state(1)
    seen = EpisodeRecord(1, "1. You: rock\n2. Opponent: paper", "You played rock, the opponent played paper: you lost.",
                         -10.0, "Result: loss. I played rock; the opponent played paper. Next time: paper loses to "
                                "scissors, so play scissors.")
    prompt = play_prompt(game, initial, [seen], "Choose your move. Legal actions: rock, paper, scissors.", 2, 3,
                         "reflection_only").text
    penalties = Penalties(invalid=0.5, length=0.0, max_response_tokens=128)
    scored = add_advantages(add_returns(from_rows(chain_rows()), settings_.algo, penalties), settings_.algo)
    policy = load_policy(tiny_model_dir)
    encode = lambda text: policy.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids = encode(prompt)
    batch = scored.filter((pl.col("phase") == "play") & (pl.col("episode") == 2)).with_columns(
        pl.Series("prompt_token_ids", [ids] * 4),
        pl.Series("response_token_ids", [encode(f"<action>{a}</action>") for a in ("scissors", "scissors", "rock", "rock")]))
    trainer = PolicyTrainer(policy, train_config(learning_rate=3e-3, mini_batch_size=4), settings_.algo)

    def logprob(move: str) -> float:
        response = encode(f"<action>{move}</action>")
        with torch.no_grad():
            logits = policy.model(input_ids=torch.tensor([ids + response])).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, -1)
        return sum(float(logprobs[len(ids) - 1 + t, token]) for t, token in enumerate(response))

    before = {move: logprob(move) for move in ("scissors", "rock")}
    trainer.update(batch, seed=0)
    after = {move: logprob(move) for move in ("scissors", "rock")}
    assert after["scissors"] > before["scissors"] and after["rock"] < before["rock"]


# -- the warm start's player: it recalls its plan, does not follow it, and its reflections read the episode
def test_the_recalling_player_thinks_its_last_plan_and_plays_as_it_would_anyway():
    from mage.backends.scripted import NO_PLAN, make_rule

    recalling = play(False, "reflection_only", rule={"rule": "random", "recall": True})
    plain = play(False, "reflection_only")
    plays = recalling.filter(pl.col("phase") == "play")
    # the same random draws: the thought takes none
    assert plays["action"].to_list() == plain.filter(pl.col("phase") == "play")["action"].to_list()
    for row in plays.iter_rows(named=True):
        reflections = [line for line in row["prompt"].splitlines() if line.startswith("Your reflection: ")]
        thought = f"My plan: {reflections[-1].split('Next time: ')[1]}" if reflections else NO_PLAN
        assert row["response"] == f"<think>{thought}</think><action>{row['action']}</action>"
    assert (plays["episode"] > 1).any()
    with pytest.raises(ValueError, match="recall must be true or false"):
        make_rule(GAME, {"rule": "random", "recall": "yes"})


def test_reflections_that_state_the_moves_are_counted_by_hand():
    from mage.warmstart.preset import reflections_state_the_moves

    reflections = play(False, "reflection_only").filter(pl.col("phase") == "reflect")
    assert reflections_state_the_moves(reflections) == 1.0  # the scripted player reads every episode
    # a reflection that names another move for the opponent does not count
    wrong = reflections.with_columns(pl.col("response").str.replace(r"the opponent played (\w+)", "the opponent played lizard"))
    assert reflections_state_the_moves(wrong) == 0.0
    half = pl.concat([reflections.head(2), wrong.slice(2, 2)])
    assert reflections_state_the_moves(half) == 0.5
    assert reflections_state_the_moves(reflections.clear()) is None
