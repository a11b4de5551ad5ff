"""Stop strings follow the phase, and a tag quoted while thinking does not stop a reply: the
same checks on every backend that generates (hf, and vllm where it is installed), against a
model taught the replies (conftest.TAUGHT), decoded greedily."""

from __future__ import annotations

import pytest
from conftest import sampling

from mage.backends import GenerationRequest

GREEDY = sampling(temperature=0.0, max_new_tokens=40)

#: (prompt, phase) -> the reply up to where it must stop, worked out from conftest.TAUGHT.
EXPECTED = {
    # play stops at </action>, not at the </remark> that follows it
    ("Your card: King (K). It is your turn.", "play"): "<action>bet</action>",
    # a reflection quoting an action runs on to </remark>
    ("Reflect on the episode.", "reflect"): "<remark>next time <action>bet</action> early</remark>",
    # the same reply, asked for as a move, stops at the action (phase decides, not the text)
    ("Reflect on the episode.", "play"): "<remark>next time <action>bet</action>",
    # an action quoted inside <think> does not stop the reply; the one after </think> does
    ("Think, then act.", "play"): "<think>maybe <action>check</action> no</think><action>bet</action>",
}


def make(kind: str, model_dir):
    if kind == "hf":
        from mage.backends.hf import HFBackend

        return HFBackend(model_dir)
    from mage.backends.vllm import VLLMBackend

    return VLLMBackend(model_dir, dtype="float32", max_model_len=2048, enforce_eager=True)  # the engine of test_vllm_backend


@pytest.mark.parametrize("kind", ["hf", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.e2e])])
def test_replies_stop_where_their_phase_ends(kind, taught_model_dir):
    backend = make(kind, taught_model_dir)
    requests = [GenerationRequest(prompt, phase) for prompt, phase in EXPECTED]
    generations = backend.generate(requests, GREEDY)
    for (key, expected), generation in zip(EXPECTED.items(), generations):
        assert generation.text == expected, key
        assert generation.finish_reason == "stop"
        assert len(generation.logprobs) == len(generation.token_ids)
    backend.release()


@pytest.mark.parametrize("kind", ["hf", pytest.param("vllm", marks=[pytest.mark.vllm, pytest.mark.e2e])])
def test_an_explicit_stop_list_and_the_token_limit(kind, taught_model_dir):
    backend = make(kind, taught_model_dir)
    request = [GenerationRequest("Your card: King (K). It is your turn.")]
    unstopped = backend.generate(request, sampling(temperature=0.0, max_new_tokens=40, stop=()))[0]
    assert unstopped.text.startswith("<action>bet</action> and then </remark> more")
    capped = backend.generate(request, sampling(temperature=0.0, max_new_tokens=2))[0]
    assert capped.finish_reason == "length" and len(capped.token_ids) == 2
    backend.release()


# -- thinking_open: where a reply stands, decided on the text alone -------------------------
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mage.backends import thinking_open  # noqa: E402

plain_text = st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=30)
open_tag = st.sampled_from(["<think>", "<THINK>", "<Think>"])
close_tag = st.sampled_from(["</think>", "</THINK>", "</Think>"])


@given(plain_text, plain_text, open_tag, close_tag, st.booleans())
def test_thinking_open_follows_the_last_tag(before, inside, opened, closed, at_start):
    assert thinking_open(before, at_start) is at_start  # no tag: as the prompt left it
    assert thinking_open(before + opened + inside, at_start) is True
    assert thinking_open(before + opened + inside + closed + before, at_start) is False
    assert thinking_open(inside + closed + before, True) is False  # opened by the prompt, closed here
    assert thinking_open(before + closed + inside + opened + "<action>bet</action>", at_start) is True
