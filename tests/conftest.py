"""Test-wide settings: offline, quiet, no telemetry."""

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


def game_text_corpus() -> list[str]:
    """Prompts and replies of a few scripted Kuhn and Tic-Tac-Toe rollouts."""
    from mage.backends import SamplingSettings
    from mage.backends.scripted import ScriptedBackend
    from mage.config import compose
    from mage.population import population_entries
    from mage.rollout import RolloutConfig, RolloutEngine, plan_meta_episodes

    texts = []
    for game in ("kuhn_poker", "tic_tac_toe"):
        cfg = compose([f"game={game}"])
        entries = [e for e in population_entries(cfg) if e.split == "train" and e.opponent != "mcts"]
        specs = plan_meta_episodes(entries, num_groups=4, group_size=2, seed=0)
        engine = RolloutEngine(ScriptedBackend("random", seed=0), RolloutConfig(group_size=2), cfg.game.params)
        table = engine.run(specs, SamplingSettings(), progress=False)
        texts += table["prompt"].to_list() + table["response"].to_list()
    return texts


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A small random Qwen2 model and a tokenizer trained on game text, saved to a directory."""
    from mage.models.tiny import random_model, train_tokenizer

    directory = tmp_path_factory.mktemp("tiny-model")
    tokenizer = train_tokenizer(game_text_corpus(), vocab_size=400)
    model = random_model(tokenizer, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def pytest_collection_modifyitems(config, items):
    """Skip GPU-only tests where no CUDA GPU is present, and vLLM ones without the extra."""
    import importlib.util

    import torch

    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    no_vllm = pytest.mark.skip(reason="needs the vllm extra (pip install -e '.[gpu]') and a GPU")
    has_vllm = importlib.util.find_spec("vllm") is not None
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "vllm" in item.keywords and not (has_vllm and torch.cuda.is_available()):
            item.add_marker(no_vllm)
