"""Building the ``tiny`` preset: tokenizer, seeded model, behaviour-cloning warm start.

``build_tiny(settings, out_dir)`` writes an ordinary model directory (``config.json``,
``model.safetensors``, tokenizer files) plus ``preset.json`` describing how it was made
and how the warm start plays (per opponent of the training and held-out populations, with
the ceilings beside), so it can be loaded exactly like a hub model with
``from_pretrained(out_dir)``.

The warm start imitates a scripted player of the run's game (``model.tiny.bc_rules``,
chosen per game in ``params/model_game/tiny/<game>.yaml``: Kuhn Poker's timid player,
Tic-Tac-Toe's beginner, Sokoban's wanderer) with templated ``<remark>`` reflections: it
learns to speak the protocol and to play weakly, which leaves the improvement to
reinforcement learning.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from tqdm.auto import tqdm

from mage import io
from mage.backends import make_backend
from mage.backends.base import Backend
from mage.backends.chat import format_prompt
from mage.config.sections import SPLITS, EvalSection, TinySection
from mage.evaluation.play import evaluate
from mage.games import make_game
from mage.population.manifest import load_manifest, seed_population
from mage.report.tables import per_episode, per_opponent
from mage.rollout.metrics import ALL
from mage.settings import Settings, load_settings
from mage.tensors import resolve_device
from mage.trainer.batching import causal_lm_forward, micro_batches
from mage.warmstart.tiny import (
    WARM_START_ROLLOUT,
    check_round_trip,
    random_model,
    rule_name,
    scripted_tables,
    train_tokenizer,
)

#: Where a build reports its stages, one line each (the prepare-model task passes Prefect's
#: run logger: the flow's log and the UI show a long build advancing, where a tqdm bar on a
#: worker thread would show nothing).
Say = Callable[[str], None]

#: Behaviour-cloning progress lines per build, besides its first and last step.
BC_REPORTS = 10


def say_nothing(_: str) -> None:
    """The default :data:`Say`: a notebook's build shows its tqdm bars instead."""


#: The games whose text every tiny tokenizer is trained on (one tokenizer covers them all, so each
#: one's text encodes compactly), as every recorded run's was. A game outside it adds its own text
#: to its own preset's tokenizer (:func:`tokenizer_games`): a new game leaves the presets of the
#: others as they were built.
TOKENIZER_GAMES = ("kuhn_poker", "tic_tac_toe", "sokoban")


def tokenizer_games(game: str | None) -> tuple[str, ...]:
    """The games whose text the tokenizer of ``game``'s preset is trained on."""
    return TOKENIZER_GAMES if game is None or game in TOKENIZER_GAMES else (*TOKENIZER_GAMES, game)


def corpus(build: TinySection, progress: bool, game: str | None = None) -> list[str]:
    """Prompts and replies of scripted players of :func:`tokenizer_games`: the tokenizer's
    training text."""
    texts = []
    for game in tokenizer_games(game):
        rules = ["random"] + (["solver"] if game == "sokoban" else [])
        table = scripted_tables(load_settings([f"game={game}"]), rules, build.corpus_meta_episodes, build.seed, progress)
        texts += table["prompt"].unique().to_list() + table["response"].unique().to_list()
    return texts


def _bc_step(model, optimizer, prompts, responses, rows: list[int], pad_id: int) -> float:
    """One optimizer step on ``rows``: the mean loss over their response tokens. (A mean per
    call instead would give a reflection's opening ``<remark>`` a fortieth of a call's weight:
    the warm start then opened reflections with ``<action>``.)"""
    batches = micro_batches([prompts[i] for i in rows], [responses[i] for i in rows], pad_id, share_prefix=True)
    tokens = sum(len(responses[i]) for i in rows)
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for batch in batches:
        logits = causal_lm_forward(model, batch, model.device)[:, :-1]
        targets, mask = batch.targets.to(model.device), batch.response_mask.to(model.device)
        nll = -torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        loss = (nll * mask).sum() / tokens
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return total


def _bc_batches(prompts: list[list[int]], reflecting: set[int], rows_per_batch: int, reflection_share: float | None,
                by_prompt: bool, rng: np.random.Generator) -> list[list[int]]:
    """One pass of batches. A batch draws ``reflection_share`` of its calls from the reflections
    (over-sampled: they are a tenth of the calls, and the reply's opening tag, ``<remark>`` or
    ``<action>``, is learnt only if both phases are common); ``None`` mixes every call
    uniformly, and ``0`` leaves the reflections out. ``by_prompt`` cuts batches from calls in
    prompt order, so a micro-batch shares a long prefix; the batches come shuffled."""
    if reflection_share is None:
        reflecting = set()
    plays = [i for i in range(len(prompts)) if i not in reflecting]
    reflections = sorted(reflecting)
    per_batch = round(rows_per_batch * reflection_share) if reflections else 0
    batches = max(1, -(-len(plays) // max(rows_per_batch - per_batch, 1)))
    plays = rng.permutation(plays).tolist()
    picked = rng.choice(reflections, size=batches * per_batch).tolist() if per_batch else []
    if by_prompt:
        plays.sort(key=lambda i: prompts[i])
        picked.sort(key=lambda i: prompts[i])
    step = rows_per_batch - per_batch
    chunks = [plays[b * step : (b + 1) * step] + picked[b * per_batch : (b + 1) * per_batch] for b in range(batches)]
    return [chunks[k] for k in rng.permutation(len(chunks)) if chunks[k]]


def learning_rate_factor(step: int, total_steps: int, constant_share: float) -> float:
    """The build's schedule: the full rate for the first ``constant_share`` of the steps, then a
    linear decay that reaches a tenth at the last step."""
    constant = round(constant_share * total_steps)
    return 1.0 - 0.9 * min(max(step - constant, 0) / max(total_steps - constant, 1), 1.0)


def behaviour_cloning(model, tokenizer, table: pl.DataFrame, build: TinySection, progress: bool,
                      say: Say = say_nothing) -> list[float]:
    """Supervised learning of the scripted replies (loss on response tokens only), in two phases:

    1. ``bc_short_steps`` steps of ``bc_short_batch_rows`` calls on the prompts' last
       ``bc_context_tokens`` tokens: cheap steps where a move must be read off the nearby
       state (Tic-Tac-Toe's list of empty cells: a copy a small model learns from thousands of
       examples, not from a few hundred whole prompts). The first ``bc_moves_only_share`` of
       them take play calls only: a Sokoban reflection is ninety tokens against a move's
       eight, so reflections outweigh the moves in a batch's loss. (On the moves alone the
       board-reading came in one build of three; with the wanderer that first thinks the
       cells around the player, ``+experiment=sokoban_long``, in 1000 steps: docs/notes/findings.md,
       "A warm start that reads the board");
    2. ``bc_steps`` steps of ``bc_batch_rows`` calls on whole prompts, shuffled, or with
       ``bc_batches_by_prompt`` batched by prompt order so that a batch shares a long prefix
       (faster, but a batch's calls are alike: on Kuhn Poker the model then stops reading the
       legal actions).

    ``bc_reflection_share`` of the other steps' calls are reflections (:func:`_bc_batches`).

    The learning rate holds for the first ``bc_constant_lr_share`` of all steps, then decays
    linearly to a tenth (:func:`learning_rate_factor`). ``say`` hears the loss
    :data:`BC_REPORTS` times along the way."""
    # One batched call each: the fast tokenizer encodes a list in one pass (twice as fast as a
    # call per text on the thousands of calls here), with the same ids.
    prompts = tokenizer([format_prompt(tokenizer, p) for p in table["prompt"].to_list()],
                        add_special_tokens=False)["input_ids"]
    responses = tokenizer(table["response"].to_list(), add_special_tokens=False)["input_ids"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=build.bc_learning_rate)
    total_steps = build.bc_short_steps + build.bc_steps
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: learning_rate_factor(step, total_steps, build.bc_constant_lr_share))
    rng = np.random.default_rng(build.seed)
    losses: list[float] = []
    model.train()
    bar = tqdm(total=total_steps, desc="behaviour cloning", unit="step", disable=not progress)
    report_every = max(1, -(-total_steps // BC_REPORTS))
    started = time.perf_counter()
    short = [ids[-build.bc_context_tokens:] for ids in prompts]
    reflecting = set(np.flatnonzero((table["phase"] == "reflect").to_numpy()).tolist())
    moves_only = round(build.bc_moves_only_share * build.bc_short_steps)
    # (name, steps, calls a step, their prompts, share of reflections (0: none), batched by prompt)
    phases = (("moves", moves_only, build.bc_short_batch_rows, short, 0.0, False),
              ("short", build.bc_short_steps - moves_only, build.bc_short_batch_rows, short,
               build.bc_reflection_share, False),
              ("whole", build.bc_steps, build.bc_batch_rows, prompts, build.bc_reflection_share,
               build.bc_batches_by_prompt))
    for phase, steps, rows_per_step, inputs, share, by_prompt in phases:
        if phase == "moves" and not steps:
            continue  # no draws from rng: a build without this phase is the same as before it existed
        chunks = _bc_batches(prompts, reflecting, rows_per_step, share, by_prompt, rng)
        for index in range(steps):
            if index and index % len(chunks) == 0:
                chunks = _bc_batches(prompts, reflecting, rows_per_step, share, by_prompt, rng)
            rows = chunks[index % len(chunks)]
            loss = _bc_step(model, optimizer, inputs, responses, rows, tokenizer.pad_token_id)
            schedule.step()
            losses.append(loss)
            bar.update(1)
            bar.set_postfix(phase=phase, loss=f"{loss:.3f}", refresh=False)
            if len(losses) % report_every == 0 or len(losses) == total_steps:
                recent = losses[-report_every:]
                say(f"behaviour cloning: step {len(losses)}/{total_steps} ({phase}), loss {np.mean(recent):.3f} "
                    f"over the last {len(recent)} steps, {time.perf_counter() - started:.0f} s")
    bar.close()
    model.eval()
    return losses


def warm_start_check(model, tokenizer, settings: Settings, manifest: Mapping[str, Any], progress: bool,
                     backend: Backend | None = None) -> dict[str, Any]:
    """How the warm start plays: evaluation-style rollouts (``model.tiny.check_*``: meta-
    episodes per split, episodes, seed and sampling; its own settings, so a change to
    ``eval`` does not rebuild the model) against the training and the held-out opponents,
    per opponent and pooled, with each one's ceiling beside it: how much room it leaves for RL.
    ``backend``: what generates (default: the ``hf`` backend's defaults on ``model``)."""
    build = settings.model.tiny
    backend = backend or make_backend("hf", model=model, tokenizer=tokenizer, chat=settings.model.chat)
    cfg = EvalSection(split="train", episodes=build.check_episodes, meta_episodes=build.check_meta_episodes,
                     group_size=1, early_stop=True, seed=build.check_seed, sampling=build.check_sampling,
                     games=())
    out: dict[str, Any] = {"meta_episodes_per_split": build.check_meta_episodes, "episodes": cfg.episodes,
                           "sampling": dataclasses.asdict(build.check_sampling)}
    for split in SPLITS:
        table = evaluate(settings, backend, replace(cfg, split=split), run_id="warm-start", progress=progress,
                         rollout=WARM_START_ROLLOUT)
        rows = per_opponent(table, manifest, cfg.episodes, cfg.early_stop)
        out[split] = {row["opponent"]: {key: _rounded(row.get(key)) for key in CHECK_FIELDS} for row in rows}
        # pooled success by k beside the three ceilings (docs/method.md, "Three ceilings per episode")
        out.setdefault("by_k", {})[split] = [{key: _rounded(row.get(key)) for key in BY_K_FIELDS}
                                             for row in per_episode(table, manifest, cfg.episodes) if row["opponent"] == ALL]
        reflect = table.filter(pl.col("phase") == "reflect")
        out[split]["all"]["reflection_validity"] = _rounded(float(reflect["valid"].mean())) if reflect.height else None
        out[split]["all"]["reflection_states_the_moves"] = _rounded(reflections_state_the_moves(reflect))
    return out


def reflections_state_the_moves(reflections: pl.DataFrame) -> float | None:
    """The share of reflections that state both players' moves as the episode that just ended
    shows them, in the scripted player's words (``I played X; the opponent played Y.``,
    :mod:`mage.backends.scripted`): does the warm start read the episode it reflects on, or
    write the sentence's shape with any moves in it? None without reflections or an opponent."""
    stated = []
    for prompt, response in zip(reflections["prompt"].to_list(), reflections["response"].to_list()):
        ended = prompt.rsplit("just ended\nMoves:\n", 1)
        if len(ended) < 2:
            continue
        moves = [line.split(". ", 1)[1] for line in ended[1].split("\nResult: ", 1)[0].splitlines() if ". " in line]
        mine = [m.removeprefix("You: ") for m in moves if m.startswith("You: ")]
        theirs = [m.removeprefix("Opponent: ") for m in moves if m.startswith("Opponent: ")]
        if not theirs:  # a puzzle, or an episode the opponent never moved in
            continue
        stated.append(f"I played {', '.join(mine) or 'nothing'}; the opponent played {', '.join(theirs)}." in response)
    return sum(stated) / len(stated) if stated else None


CHECK_FIELDS = ("meta_episodes", "first_win_rate", "final_win_rate", "final_draw_rate", "final_mean_return",
                "max_win_probability", "win_ceiling_final", "final_win_vs_ceiling", "memoryless_ceiling_final",
                "adaptive_ceiling_final", "invalid_rate")
BY_K_FIELDS = ("episode", "pass_at_k", "memoryless_ceiling", "adaptive_ceiling", "pass_at_k_ceiling")


def _rounded(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else value


def population_manifest(settings: Settings) -> dict[str, Any]:
    """The run's population manifest: the seeded file if it is there, else computed (ceilings
    included) without writing it, since it is the ``seed_population`` stage's output."""
    path = Path(settings.paths.population_manifest)
    if path.is_file():
        try:
            return load_manifest(path)
        except io.CorruptFileError as error:  # recomputable: the check goes on without it
            logging.getLogger(__name__).warning(f"{error} (recomputing the population in memory)")
    return seed_population(settings, progress=False)


def _recorded(build: TinySection) -> dict[str, Any]:
    """``build`` as ``preset.json`` records it (tuples as lists)."""
    return json.loads(json.dumps(dataclasses.asdict(build)))


def build_differences(directory: str | Path, build: TinySection) -> dict[str, tuple[Any, Any]]:
    """The ``model.tiny`` settings that differ between the preset already in ``directory`` (its
    ``preset.json``) and ``build``, as ``{key: (built, asked)}``; empty when they agree or when
    the directory records none (a model saved by hand, or a hub model). A key that one side
    does not record (added to ``model.tiny`` after the preset was built) is not compared."""
    try:
        built = json.loads((Path(directory) / "preset.json").read_text())["build"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if not isinstance(built, dict):
        return {}
    asked = _recorded(build)
    return {key: (built[key], asked[key]) for key in sorted(set(built) & set(asked)) if built[key] != asked[key]}


def fresh_model(build: TinySection, progress: bool = False, game: str | None = None) -> tuple[Any, Any, list[str]]:
    """The tokenizer of ``game``'s preset, trained on the games' text (:func:`tokenizer_games`),
    and its model drawn from ``build.seed``, before any cloning; and the text the tokenizer was
    trained on."""
    texts = corpus(build, progress, game)
    whole = [name for name_of_game in tokenizer_games(game) for name in make_game(name_of_game).action_names]
    tokenizer = train_tokenizer(texts, vocab_size=build.vocab_size, whole=whole)
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
    return tokenizer, model, texts


def build_tiny(settings: Settings, out_dir: str | Path | None = None, progress: bool = True,
               say: Say = say_nothing) -> Path:
    """Build the tiny preset of ``settings.model`` for ``settings``'s game into ``out_dir``
    (default ``model.path``), atomically: tokenizer, seeded model, behaviour cloning of the
    ``model.tiny.bc_rules`` players against the game's training population, the check.
    ``progress``: tqdm bars; ``say``: one line per stage (and :data:`BC_REPORTS` during the
    cloning), for a log."""
    model_cfg = settings.model
    build = model_cfg.tiny
    if build is None:
        raise ValueError(f"model {model_cfg.name!r} has no 'tiny' section: it is not built locally")
    out_dir = Path(out_dir or model_cfg.path)
    started = time.perf_counter()
    say(f"building the tiny preset {model_cfg.name!r} for {settings.game.name} into {out_dir}: "
        "tokenizer and model, behaviour cloning, the warm start's check")
    tokenizer, model, texts = fresh_model(build, progress, settings.game.name)
    model.to(resolve_device(model_cfg.device))
    built = time.perf_counter()
    parameters = sum(p.numel() for p in model.parameters())
    say(f"tokenizer ({len(tokenizer)} tokens) and model ({parameters:,} parameters, {model.device}) "
        f"in {built - started:.0f} s")
    bc_table = scripted_tables(settings, list(build.bc_rules), build.bc_meta_episodes, build.seed + 1, progress,
                               WARM_START_ROLLOUT)
    say(f"behaviour cloning of {', '.join(map(rule_name, build.bc_rules))}: {bc_table.height} scripted calls from "
        f"{build.bc_meta_episodes} meta-episodes, {build.bc_short_steps + build.bc_steps} steps")
    losses = behaviour_cloning(model, tokenizer, bc_table, build, progress, say)
    cloned = time.perf_counter()
    say(f"the warm start's check: {build.check_meta_episodes} meta-episodes per split")
    check = warm_start_check(model, tokenizer, settings, population_manifest(settings), progress)
    description: dict[str, Any] = {
        "preset": model_cfg.name,
        "game": settings.game.name,
        "build": _recorded(build),
        "device": str(model.device),  # where it was cloned: CPU and GPU builds differ in the last bits
        "parameters": parameters,
        "vocab_size": len(tokenizer),
        "tokenizer_games": sorted(tokenizer_games(settings.game.name)),
        "bc_calls": bc_table.height,
        "bc_loss_first": losses[0] if losses else None,
        "bc_loss_last": float(np.mean(losses[-10:])) if losses else None,
        "warm_start": check,
        "seconds": {
            "tokenizer_and_model": round(built - started, 1),
            "behaviour_cloning": round(cloned - built, 1),
            "check": round(time.perf_counter() - cloned, 1),
        },
    }

    def write(tmp: Path) -> None:
        tmp.mkdir()
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "preset.json").write_text(json.dumps(description, indent=2, sort_keys=True) + "\n")
        # What a user loads must be what was trained: encode a sample of the corpus both ways.
        check_round_trip(tokenizer, str(tmp), texts[:: max(1, len(texts) // 200)])

    io.replace_directory(out_dir, write)
    say(f"built {out_dir} in {time.perf_counter() - started:.0f} s; the warm start's final-episode win rate: "
        + ", ".join(f"{split} {check[split]['all']['final_win_rate']}" for split in SPLITS)
        + " (preset.json holds the rest)")
    return out_dir
