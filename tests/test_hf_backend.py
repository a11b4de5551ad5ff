"""The transformers backend on a small random model saved to a local directory."""

from __future__ import annotations

import polars as pl
import pytest
import torch
from conftest import defaults, rollout_config, sampling, teach
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from mage.backends import GenerationRequest
from mage.backends.hf import HFBackend
from mage.backends.scripted import ScriptedBackend
from mage.rollout import RolloutEngine, plan_meta_episodes


def teacher_forced_logprobs(model, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
    """log p(response token | prefix) from one forward pass over prompt + response."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)
    return logprobs.gather(1, torch.tensor(response_ids)[:, None]).squeeze(1).tolist()


def test_logprobs_match_a_teacher_forced_pass(tiny_model_dir):
    backend = HFBackend(tiny_model_dir, batch_size=3)  # the hub path: from_pretrained on a directory
    prompts = ["Your card: King (K).", "Board:\n  A B C", "Game: Kuhn Poker, two players. " * 3, "x", "Moves so far:"]
    settings = sampling(temperature=0.8, top_p=0.9, top_k=50, max_new_tokens=24, seed=1)
    generations = backend.generate([GenerationRequest(p) for p in prompts], settings)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for generation in generations:
        assert len(generation.logprobs) == len(generation.token_ids) > 0
        expected = teacher_forced_logprobs(reference, generation.prompt_token_ids, generation.token_ids)
        assert generation.logprobs == pytest.approx(expected, abs=1e-4)


def test_left_padding_does_not_change_greedy_output(tiny_model_dir):
    backend = HFBackend(tiny_model_dir, batch_size=8)
    greedy = sampling(temperature=0.0, max_new_tokens=12)
    short = "Your card: Jack (J)."
    alone = backend.generate([GenerationRequest(short)], greedy)[0]
    batched = backend.generate([GenerationRequest(short), GenerationRequest("Game: Tic-Tac-Toe " * 10)], greedy)[0]
    assert batched.token_ids == alone.token_ids
    assert batched.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_micro_batches_hold_one_phase_and_answers_keep_request_order(tiny_model_dir):
    backend = HFBackend(tiny_model_dir, batch_size=2)
    greedy = sampling(temperature=0.0, max_new_tokens=6)
    requests = [GenerationRequest(f"Your card: {card}.", phase=phase)
                for card, phase in [("Jack", "play"), ("Queen", "reflect"), ("King", "play"), ("Ace", "reflect"), ("Ten", "play")]]
    seen: list[list[int]] = []
    generate_batch = backend._generate_batch

    def spy(prompt_ids, sampling, phase):
        seen.append([ids for ids in prompt_ids])
        return generate_batch(prompt_ids, sampling, phase)

    backend._generate_batch = spy
    answers = backend.generate(requests, greedy)
    phase_of = {tuple(backend.encode([r.prompt])[0]): r.phase for r in requests}
    assert sorted(len(batch) for batch in seen) == [1, 2, 2]  # 3 play rows -> 2 + 1, 2 reflect rows -> 2
    assert all(len({phase_of[tuple(ids)] for ids in batch}) == 1 for batch in seen)
    for request, answer in zip(requests, answers):  # each answer is its own request's
        assert answer.token_ids == HFBackend(tiny_model_dir).generate([request], greedy)[0].token_ids


def test_shared_prefill_is_exact(tiny_model_dir):
    """Shared-prefix and duplicate-prompt prefill gives the plain path's tokens and log-probs."""
    rules = "Game: Kuhn Poker, two players. The deck has three cards. " * 4
    prompts = [rules + "Your card: King (K).", rules + "Your card: King (K).", rules + "Board:", rules + "x " * 9]
    greedy = sampling(temperature=0.0, max_new_tokens=10)
    requests = [GenerationRequest(p) for p in prompts]
    shared = HFBackend(tiny_model_dir, share_prefill=True).generate(requests, greedy)
    plain = HFBackend(tiny_model_dir, share_prefill=False).generate(requests, greedy)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for a, b in zip(shared, plain):
        assert a.token_ids == b.token_ids and a.prompt_token_ids == b.prompt_token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert a.logprobs == pytest.approx(teacher_forced_logprobs(reference, a.prompt_token_ids, a.token_ids), abs=1e-4)
    sampled = HFBackend(tiny_model_dir).generate(requests, sampling(max_new_tokens=10, seed=3))
    for generation in sampled:  # sampling from duplicated rows stays independent and exact
        expected = teacher_forced_logprobs(reference, generation.prompt_token_ids, generation.token_ids)
        assert generation.logprobs == pytest.approx(expected, abs=1e-4)


@pytest.fixture(scope="module")
def memorising_backend(tiny_model_dir):
    """The tiny model trained to answer one prompt with '<action>bet</action>' and trailing text."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert teach(model, tokenizer, {"Your card: King (K). It is your turn.": "<action>bet</action> and then some more words"},
                 steps=150) < 0.05
    return HFBackend(model, tokenizer)


def test_stop_strings_end_the_reply(memorising_backend):
    request = GenerationRequest("Your card: King (K). It is your turn.")
    stopped = memorising_backend.generate([request], sampling(temperature=0.0, max_new_tokens=30))[0]
    assert stopped.text == "<action>bet</action>" and stopped.finish_reason == "stop"
    unstopped = memorising_backend.generate([request], sampling(temperature=0.0, max_new_tokens=30, stop=()))[0]
    assert unstopped.text.startswith("<action>bet</action> and then")
    capped = memorising_backend.generate([request], sampling(temperature=0.0, max_new_tokens=2))[0]
    assert capped.finish_reason == "length" and len(capped.token_ids) == 2


def test_lora_adapter_is_applied(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    adapted = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapted.save_pretrained(tmp_path / "adapter")
    greedy = sampling(temperature=0.0, max_new_tokens=10)
    request = [GenerationRequest("Your card: Queen (Q).")]
    plain = HFBackend(tiny_model_dir).generate(request, greedy)[0]
    with_adapter = HFBackend(tiny_model_dir, adapter=tmp_path / "adapter").generate(request, greedy)[0]
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    from peft import PeftModel

    reference = PeftModel.from_pretrained(reference, tmp_path / "adapter")
    expected = teacher_forced_logprobs(reference, with_adapter.prompt_token_ids, with_adapter.token_ids)
    assert with_adapter.logprobs == pytest.approx(expected, abs=1e-4)
    assert with_adapter.logprobs != pytest.approx(plain.logprobs, abs=1e-4) or with_adapter.token_ids != plain.token_ids


@pytest.fixture(scope="module")
def peaked_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with logits about 3 times larger (tied embeddings: the shared matrix
    tripled, which the final norm undoes at the input), so temperature and top-k change its
    next-token distribution measurably, and with a generation_config of its own that would
    narrow sampling if it applied (a Qwen's carries a repetition penalty, top-k and top-p),
    plus a LoRA adapter that leaves it unchanged."""
    from peft import LoraConfig, get_peft_model

    directory = tmp_path_factory.mktemp("peaked-model")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    model.generation_config.update(do_sample=True, top_k=5, top_p=0.3, min_p=0.5, repetition_penalty=5.0, typical_p=0.2)
    model.save_pretrained(directory / "model")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(directory / "model")
    fresh = get_peft_model(AutoModelForCausalLM.from_pretrained(directory / "model"),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))  # B = 0: no change
    fresh.save_pretrained(directory / "adapter")
    return directory


@pytest.mark.parametrize("with_adapter", [False, True])
def test_samples_follow_the_tempered_softmax_and_not_the_models_defaults(peaked_model_dir, with_adapter):
    from scipy.stats import chisquare

    temperature, draws = 0.5, 3000
    backend = HFBackend(peaked_model_dir / "model", adapter=peaked_model_dir / "adapter" if with_adapter else None)
    drawn = sampling(temperature=temperature, top_p=1.0, top_k=0, max_new_tokens=1, stop=(), seed=0)
    generations = backend.generate([GenerationRequest("Your card: King (K).")] * draws, drawn)
    inner = backend.model.get_base_model() if with_adapter else backend.model
    assert inner.generation_config.top_k == 5, "the model's own config is put back"
    # the expected distribution, from a plain forward pass of the saved model
    reference = AutoModelForCausalLM.from_pretrained(peaked_model_dir / "model", dtype=torch.float32)
    with torch.no_grad():
        logits = reference(torch.tensor([generations[0].prompt_token_ids])).logits[0, -1]
    expected = torch.softmax(logits.double() / temperature, -1).numpy()
    observed = torch.bincount(torch.tensor([g.token_ids[0] for g in generations]), minlength=len(expected)).numpy()
    # bins: the 10 likeliest tokens one by one, ranks 11-50 (what transformers' default
    # top-k of 50 keeps), and the rest; the tail bins hold about a third of the mass
    order = expected.argsort()[::-1]
    bins = [order[i : i + 1] for i in range(10)] + [order[10:50], order[50:]]
    assert expected[order[50:]].sum() > 0.2
    counts = [observed[b].sum() for b in bins]
    assert chisquare(counts, [draws * expected[b].sum() for b in bins]).pvalue > 1e-4, counts


def test_the_models_generation_config_is_hidden_during_generate_and_put_back_after_a_failure(tiny_model_dir,
                                                                                              monkeypatch):
    backend = HFBackend(tiny_model_dir)
    own, seen = backend.model.generation_config, []

    def failing_generate(*args, **kwargs):
        seen.append(backend.model.generation_config)
        raise RuntimeError("out of memory")

    monkeypatch.setattr(backend.model, "generate", failing_generate)
    with pytest.raises(RuntimeError, match="out of memory"):
        backend.generate([GenerationRequest("Your card: King (K).")], sampling(max_new_tokens=2))
    assert seen and seen[0] is not own and seen[0].to_dict() == GenerationConfig().to_dict()
    assert backend.model.generation_config is own


def test_engine_rows_carry_policy_logprobs(tiny_model_dir):
    cfg = defaults("game=kuhn_poker")
    entries = list(cfg.population.train.values())
    specs = plan_meta_episodes(entries, num_groups=2, group_size=2, seed=0)
    backend = HFBackend(tiny_model_dir, batch_size=8)
    engine = RolloutEngine(backend, rollout_config(group_size=2, episodes=2), cfg.game.params)
    table = engine.run(specs, sampling(max_new_tokens=16, seed=0), progress=False)
    assert table.height >= len(specs)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for prompt_ids, response_ids, logprobs in table.select(
        "prompt_token_ids", "response_token_ids", "response_logprobs"
    ).iter_rows():
        assert logprobs == pytest.approx(teacher_forced_logprobs(reference, prompt_ids, response_ids), abs=1e-4)
    # A random model rarely speaks the protocol: its replies are invalid and use up turns.
    play = table.filter(pl.col("phase") == "play")
    assert play.height > 0 and play["invalid_reason"].null_count() < play.height  # some play reply invalid
    assert (play["invalid_reason"].is_null() == play["valid"]).all()  # a reason exactly where a reply is invalid


def test_scripted_backend_with_a_tokenizer_gives_token_ids(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = defaults("game=kuhn_poker")
    entries = list(cfg.population.train.values())
    specs = plan_meta_episodes(entries, num_groups=1, group_size=1, seed=0)
    engine = RolloutEngine(ScriptedBackend("random", tokenizer=tokenizer), rollout_config(group_size=1), cfg.game.params)
    table = engine.run(specs, sampling(), progress=False)
    first = table.row(0, named=True)
    assert tokenizer.decode(first["response_token_ids"]) == first["response"]
    assert tokenizer.decode(first["prompt_token_ids"]).startswith("<|im_start|>user\nGame: Kuhn Poker")


def test_the_prompt_cache_never_forgets_a_prompt_it_is_asked_for(tiny_model_dir, monkeypatch):
    # Regression: a full cache used to be cleared after the cached prompts of the call had
    # been counted as present, and the lookup then failed (a KeyError in a Tic-Tac-Toe run).
    monkeypatch.setattr("mage.backends.hf.ENCODED_PROMPTS_KEPT", 3)
    backend = HFBackend(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def expected(prompt: str) -> list[int]:
        return tokenizer(backend.format(prompt), add_special_tokens=False)["input_ids"]

    backend.encode(["a", "b"])
    calls = [["a", "c", "d"], ["d", "e", "f", "a"], ["g"]]
    for prompts in calls:
        assert backend.encode(prompts) == [expected(p) for p in prompts]


def test_a_model_handed_over_is_used_on_its_own_device(tiny_model_dir, monkeypatch):
    """The tiny build hands its model, mid-training, to the backend for its check. On a GPU
    machine the backend used to send the inputs to CUDA while the model stayed where it was."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine
    backend = HFBackend(model, tokenizer, batch_size=2)
    assert backend.device == torch.device("cpu")
    [generation] = backend.generate([GenerationRequest("Board:\n  A B C")],
                                    sampling(temperature=0.0, max_new_tokens=4))
    assert len(generation.token_ids) > 0
    with pytest.raises(ValueError, match="model given is on cpu"):
        HFBackend(model, tokenizer, device="cuda")


# -- regrouping: rows left running go on as a smaller batch -----------------------------------
KING, THINK = "Your card: King (K). It is your turn.", "Think, then act."  # conftest.TAUGHT's prompts


def spy_on_decode(backend, monkeypatch) -> list[tuple[int, int, list[bool], bool]]:
    """Record each ``generate`` call of ``backend``: (rows, tokens each had already, which ended, paused)."""
    calls, decode = [], backend._decode

    def spy(rows, opened, sampling, phase, spent, pause_rows):
        tokens, logprobs, ended, paused = decode(rows, opened, sampling, phase, spent, pause_rows)
        calls.append((len(rows), spent, ended, paused))
        return tokens, logprobs, ended, paused

    monkeypatch.setattr(backend, "_decode", spy)
    return calls


def test_a_row_left_running_goes_on_alone_with_the_same_reply(taught_model_dir, monkeypatch):
    """Seven replies stop at </action> after 4 tokens; the eighth thinks first (20 tokens, with
    an </action> quoted inside <think> at token 13). Once it is the only row running the call
    pauses and it goes on alone: the <think> it opened before the pause still keeps the quoted
    tag from stopping it, and every reply is the one-call decode's, token for token."""
    requests = [GenerationRequest(KING)] * 7 + [GenerationRequest(THINK)]
    greedy = sampling(temperature=0.0, max_new_tokens=40)
    regrouping = HFBackend(taught_model_dir)
    calls = spy_on_decode(regrouping, monkeypatch)
    answers = regrouping.generate(requests, greedy)
    assert [(rows, spent, paused) for rows, spent, _, paused in calls] == [(8, 0, True), (1, 4, False)]
    assert sorted(calls[0][2]) == [False] + [True] * 7  # the thinking row ran on, the others had ended
    assert [a.text for a in answers] == ["<action>bet</action>"] * 7 + [
        "<think>maybe <action>check</action> no</think><action>bet</action>"]
    assert [a.finish_reason for a in answers] == ["stop"] * 8
    whole = HFBackend(taught_model_dir, regroup=False).generate(requests, greedy)
    for a, b in zip(answers, whole):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_a_regrouped_row_stops_at_the_token_limit(taught_model_dir, monkeypatch):
    monkeypatch.setattr("mage.backends.hf.REGROUP_MIN_TOKENS_LEFT", 8)  # a pause at token 4 of 16
    requests = [GenerationRequest(KING)] * 7 + [GenerationRequest(THINK)]
    capped = sampling(temperature=0.0, max_new_tokens=16)
    regrouping = HFBackend(taught_model_dir)
    calls = spy_on_decode(regrouping, monkeypatch)
    thinking = regrouping.generate(requests, capped)[-1]
    assert [(rows, spent, paused) for rows, spent, _, paused in calls] == [(8, 0, True), (1, 4, False)]
    assert thinking.finish_reason == "length" and len(thinking.token_ids) == len(thinking.logprobs) == 16
    assert thinking.text == "<think>maybe <action>check</action> no</think>"  # 16 tokens of conftest.TAUGHT's reply
    assert thinking.token_ids == HFBackend(taught_model_dir, regroup=False).generate(requests, capped)[-1].token_ids


def test_sampled_regrouped_replies_carry_their_exact_logprobs(taught_model_dir, monkeypatch):
    """Sampling: rows on a prompt nothing taught ramble on after the taught ones have stopped
    and are regrouped, and each reply's log-probs are a teacher-forced pass's over prompt + reply."""
    requests = [GenerationRequest(KING)] * 12 + [GenerationRequest("Moves so far:")] * 4
    regrouping = HFBackend(taught_model_dir)
    calls = spy_on_decode(regrouping, monkeypatch)
    answers = regrouping.generate(requests, sampling(temperature=1.0, max_new_tokens=48, seed=5))
    assert any(paused for *_, paused in calls)
    reference = AutoModelForCausalLM.from_pretrained(taught_model_dir, dtype=torch.float32)
    for answer in answers:
        assert len(answer.logprobs) == len(answer.token_ids) > 0
        expected = teacher_forced_logprobs(reference, answer.prompt_token_ids, answer.token_ids)
        assert answer.logprobs == pytest.approx(expected, abs=1e-4)

