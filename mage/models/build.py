"""Building the ``tiny`` preset: tokenizer, seeded model, behaviour-cloning warm start.

``build_tiny(settings, out_dir)`` writes an ordinary model directory (``config.json``,
``model.safetensors``, tokenizer files) plus ``preset.json`` describing how it was made
and how the warm start behaves (validity and win rate of its own rollouts), so it can be
loaded exactly like a hub model with ``from_pretrained(out_dir)``.

The warm start imitates scripted players (by default uniformly random legal moves with
templated ``<remark>`` reflections): it learns to speak the protocol, not to play well,
which leaves the improvement to reinforcement learning.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from tqdm.auto import tqdm

from mage import io
from mage.backends.chat import format_prompt
from mage.models.tiny import check_round_trip, random_model, scripted_tables, train_tokenizer
from mage.settings import ModelConfig, TinyBuild
from mage.train.batching import causal_lm_forward, micro_batches


def corpus(build: TinyBuild, games: list[str], progress: bool) -> list[str]:
    texts = []
    for game in games:
        rules = ["random"] + (["solver"] if game == "sokoban" else [])
        table = scripted_tables(game, rules, build.corpus_meta_episodes, build.seed, progress)
        texts += table["prompt"].unique().to_list() + table["response"].unique().to_list()
    return texts


def behaviour_cloning(model, tokenizer, table: pl.DataFrame, build: TinyBuild, progress: bool) -> list[float]:
    """Supervised learning of the scripted replies (loss on response tokens only)."""
    prompts = [
        tokenizer(format_prompt(tokenizer, p), add_special_tokens=False)["input_ids"] for p in table["prompt"].to_list()
    ]
    responses = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in table["response"].to_list()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=build.bc_learning_rate)
    rng = np.random.default_rng(build.seed)
    losses = []
    model.train()
    steps = build.bc_epochs * -(-len(prompts) // build.bc_batch_rows)
    # Linear decay to a tenth: the last steps settle the protocol's format tokens.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - 0.9 * min(step / steps, 1.0))
    bar = tqdm(total=steps, desc="behaviour cloning", unit="step", disable=not progress)
    for _ in range(build.bc_epochs):
        order = rng.permutation(len(prompts))
        for start in range(0, len(order), build.bc_batch_rows):
            rows = order[start : start + build.bc_batch_rows].tolist()
            batches = micro_batches(
                [prompts[i] for i in rows], [responses[i] for i in rows], tokenizer.pad_token_id, share_prefix=True
            )
            tokens = sum(len(responses[i]) for i in rows)
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for batch in batches:
                logits = causal_lm_forward(model, batch, torch.device("cpu"))[:, :-1]
                nll = -torch.log_softmax(logits.float(), -1).gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)
                loss = (nll * batch.response_mask).sum() / tokens
                loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(total)
            bar.update(1)
            bar.set_postfix(loss=f"{total:.3f}", refresh=False)
    bar.close()
    model.eval()
    return losses


def warm_start_check(model, tokenizer, game_name: str, seed: int, progress: bool, groups: int = 16) -> dict[str, float]:
    """How the warm start plays: its own rollouts (training sampling) against the training
    population, so the preset's description says how much room it leaves for RL."""
    from mage.backends.base import SamplingSettings
    from mage.backends.hf import HFBackend
    from mage.config import compose
    from mage.population import population_entries, seating
    from mage.rollout import RolloutConfig, RolloutEngine, plan_meta_episodes
    from mage.rollout.metrics import final_episode_metrics

    cfg = compose([f"game={game_name}"])
    entries = [e for e in population_entries(cfg) if e.split == "train"]
    specs = plan_meta_episodes(entries, groups, 4, seed, *seating(cfg))
    engine = RolloutEngine(HFBackend(model, tokenizer), RolloutConfig(group_size=4), cfg.game.params)
    table = engine.run(specs, SamplingSettings(max_new_tokens=64, seed=seed), run_id="warm-start", progress=progress)
    pooled = final_episode_metrics(table).filter(pl.col("opponent") == "all").row(0, named=True)
    play = table.filter(pl.col("phase") == "play")
    reflect = table.filter(pl.col("phase") == "reflect")
    return {
        "meta_episodes": len(specs),
        "invalid_rate": round(1.0 - float(play["valid"].mean()), 4),
        "reflection_validity": round(float(reflect["valid"].mean()), 4) if reflect.height else None,
        "first_win_rate": round(pooled["first_win_rate"], 4),
        "final_win_rate": round(pooled["final_win_rate"], 4),
        "final_mean_return": round(pooled["final_mean_return"], 4),
    }


def build_tiny(model_cfg: ModelConfig, out_dir: str | Path | None = None, progress: bool = True) -> Path:
    """Build the tiny preset into ``out_dir`` (default ``model_cfg.path``), atomically."""
    build = model_cfg.tiny or TinyBuild()
    out_dir = Path(out_dir or model_cfg.path)
    started = time.perf_counter()
    games = sorted(set(build.bc_games) | {"kuhn_poker", "tic_tac_toe", "sokoban"})
    texts = corpus(build, games, progress)
    tokenizer = train_tokenizer(texts, vocab_size=build.vocab_size)
    model = random_model(
        tokenizer,
        hidden_size=build.hidden_size,
        num_layers=build.num_layers,
        num_heads=build.num_heads,
        num_kv_heads=build.num_kv_heads,
        intermediate_size=build.intermediate_size,
        max_position_embeddings=build.max_position_embeddings,
        seed=build.seed,
    )
    bc_table = pl.concat(
        [scripted_tables(g, list(build.bc_rules), build.bc_meta_episodes, build.seed + 1, progress) for g in build.bc_games]
    )
    losses = behaviour_cloning(model, tokenizer, bc_table, build, progress)
    check = {game: warm_start_check(model, tokenizer, game, build.seed + 2, progress) for game in build.bc_games}
    description: dict[str, Any] = {
        "preset": model_cfg.name,
        "build": {k: (list(v) if isinstance(v, tuple) else v) for k, v in build.__dict__.items()},
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "tokenizer_games": games,
        "bc_calls": bc_table.height,
        "bc_loss_first": losses[0] if losses else None,
        "bc_loss_last": float(np.mean(losses[-10:])) if losses else None,
        "warm_start": check,
        "seconds": round(time.perf_counter() - started, 1),
    }

    def write(tmp: Path) -> None:
        tmp.mkdir()
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "preset.json").write_text(json.dumps(description, indent=2, sort_keys=True) + "\n")
        # What a user loads must be what was trained: encode a sample of the corpus both ways.
        check_round_trip(tokenizer, str(tmp), texts[:: max(1, len(texts) // 200)])

    io.replace_directory(out_dir, write)
    return out_dir
