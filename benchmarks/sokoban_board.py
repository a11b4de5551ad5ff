"""Does the tiny architecture learn a Sokoban move from the board? (issue 15, item 3)

Apart from the protocol: a fresh tiny model (``params/model/tiny.yaml``'s shape, or
``--hidden-size``/``--layers``), or the model of ``--from`` (a built preset), is cloned on the
play calls of scripted players on Sokoban's training levels: ``--steps`` steps on each
prompt's last ``--context-tokens`` tokens (the board block, as the build's short phase), then
``--whole-steps`` on whole prompts (the build's second phase, batched by prompt), ``--rows``
calls a step at a constant ``--learning-rate`` (the build's step, ``mage.build.preset``).
Every ``--every`` steps it is scored on the optimal solver's play calls of other levels, both
on their last ``--context-tokens`` tokens and on the whole prompt (what the policy sees when it
plays): how often its most likely first move (of the four directions, after ``<action>``) is
the solver's, and the negative log-likelihood of the solver's move. Chance is a quarter and
ln 4 = 1.386; a model that reads only the walls around the player does better. With
``--label look_around`` the cloned replies first think the 3x3 cells around the player, and the
scores are taken after the solver's own such thought; a last column pair says how many of
those 9 cells the model reads right (teacher-forced).

    python benchmarks/sokoban_board.py                          # 1500 steps at 1e-3 (about 40 minutes here)
    python benchmarks/sokoban_board.py --steps 200 --every 50   # a quick look
    python benchmarks/sokoban_board.py --from <preset> --steps 0 --whole-steps 300 --label wanderer \
        --learning-rate 3e-4 --every 50                         # carry a preset's reading to whole prompts

    python benchmarks/sokoban_board.py --label look_around --meta-episodes 1024 --steps 1000 \
        --whole-steps 50 --no-whole-by-prompt --every 200 --score-meta-episodes 256   # sokoban_long's reading

Prints a Markdown table row per score. What it found: docs/notes/findings.md, "A warm start that
reads the board".
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import replace

import numpy as np
import polars as pl
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DIRECTIONS = ("up", "down", "left", "right")


#: --label's players: the optimal solver, the default warm start's wanderer, and the
#: wanderer that first thinks the 3x3 cells around the player (+experiment=sokoban_long)
PLAYERS = {"solver": "solver", "wanderer": {"rule": "wanderer", "solver_probability": 0.75},
           "look_around": {"rule": "wanderer", "solver_probability": 0.75, "look_around": True}}
#: the solver as scored under look_around: its replies carry the same thought
SOLVER_LOOKING = {"rule": "wanderer", "solver_probability": 1.0, "look_around": True}
#: a looking reply's tokens: <think>, 3 cells, ',', 3 cells, ',', 3 cells, </think>, <action>, the first move
CELLS, THOUGHT_END, FIRST_MOVE = (1, 2, 3, 5, 6, 7, 9, 10, 11), 12, 14


def play_calls(spec: str | dict, meta_episodes: int, seed: int) -> pl.DataFrame:
    from mage.build.preset import WARM_START_ROLLOUT
    from mage.build.tiny import scripted_tables
    from mage.settings import load_settings

    table = scripted_tables(load_settings(["game=sokoban"]), [spec], meta_episodes, seed, False, WARM_START_ROLLOUT)
    return table.filter(pl.col("phase") == "play")


def first_move(action: str) -> int:
    """The first direction of a call's parsed ``action`` (the table's column: ``left, up``)."""
    return DIRECTIONS.index(action.split(",")[0].strip())


@torch.no_grad()
def score(model, prompts: list[list[int]], moves: list[int], direction_ids: list[int], pad_id: int) -> tuple[float, float]:
    """First-move accuracy and mean NLL of the solver's first move (over the four directions)."""
    from mage.train.batching import causal_lm_forward, micro_batches

    model.eval()
    hits = nll = 0.0
    # left-padded rows in order, with no reply: the last position scores the next token
    for batch in micro_batches(prompts, [[] for _ in prompts], pad_id, batching="padded", rows_per_batch=128):
        logits = causal_lm_forward(model, batch, model.device)[:, -1, direction_ids]
        logprobs = torch.log_softmax(logits.float(), -1)
        truth = torch.tensor([moves[i] for i in batch.rows])
        hits += float((logprobs.argmax(-1) == truth).sum())
        nll += float(-logprobs.gather(1, truth[:, None]).sum())
    model.train()
    return hits / len(prompts), nll / len(prompts)


@torch.no_grad()
def score_looking(model, prompts: list[list[int]], replies: list[list[int]], direction_ids: list[int],
                  pad_id: int) -> tuple[float, float, float]:
    """For replies that think the cells around the player first: the first move's accuracy and
    NLL (over the four directions) after the reply's own thought, and the share of the 9 cells
    the model's most likely token gets right, the thought teacher-forced."""
    from mage.train.batching import causal_lm_forward, micro_batches

    model.eval()
    hits = nll = cells = 0.0
    for batch in micro_batches(prompts, [r[: FIRST_MOVE + 1] for r in replies], pad_id, share_prefix=True):
        logits = causal_lm_forward(model, batch, model.device)[:, :-1]
        mask = batch.response_mask.bool()
        for row in range(logits.shape[0]):
            reply_logits, truth = logits[row][mask[row]], batch.targets[row][mask[row]]
            cells += float((reply_logits[list(CELLS)].argmax(-1) == truth[list(CELLS)]).float().mean())
            moves = torch.log_softmax(reply_logits[FIRST_MOVE, direction_ids].float(), -1)
            move = direction_ids.index(int(truth[FIRST_MOVE]))
            hits += float(moves.argmax() == move)
            nll += float(-moves[move])
    model.train()
    return hits / len(prompts), nll / len(prompts), cells / len(prompts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1500, help="steps on the prompts' last --context-tokens")
    parser.add_argument("--whole-steps", type=int, default=0, help="steps on whole prompts, after --steps")
    parser.add_argument("--whole-rows", type=int, default=32, help="calls per whole-prompt step (the build's 32)")
    parser.add_argument("--whole-by-prompt", action=argparse.BooleanOptionalAction, default=True,
                        help="whole-prompt batches cut in prompt order (the default build's); --no-whole-by-prompt: "
                             "shuffled (sokoban_long's)")
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--rows", type=int, default=64, help="calls per short step")
    parser.add_argument("--label", choices=sorted(PLAYERS), default="solver",
                        help="the player cloned; look_around also scores the cells its thought reads")
    parser.add_argument("--meta-episodes", type=int, default=2048, help="cloned meta-episodes (4 share a level)")
    parser.add_argument("--context-tokens", type=int, default=128)
    parser.add_argument("--score-meta-episodes", type=int, default=1024, help="the solver's, scored (other levels)")
    parser.add_argument("--from", dest="source", help="a model directory (a built preset) instead of a fresh model")
    parser.add_argument("--hidden-size", type=int, help="default: params/model/tiny.yaml")
    parser.add_argument("--layers", type=int, help="default: params/model/tiny.yaml")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.source and (args.hidden_size or args.layers):
        parser.error("--hidden-size and --layers shape a fresh model: --from's model has its own")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mage.backends.chat import format_prompt
    from mage.build.preset import _bc_batches, _bc_step, fresh_model
    from mage.settings import load_settings

    torch.set_num_threads(args.threads)
    build = load_settings(["game=sokoban"]).model.tiny
    started = time.perf_counter()
    if args.source:
        tokenizer, model = AutoTokenizer.from_pretrained(args.source), AutoModelForCausalLM.from_pretrained(args.source)
    else:  # the build's own tokenizer and seeded model, at the shape asked for
        hidden, layers = args.hidden_size or build.hidden_size, args.layers or build.num_layers
        tokenizer, model, _ = fresh_model(replace(build, hidden_size=hidden, num_layers=layers,
                                                  intermediate_size=3 * hidden))
    looking = args.label == "look_around"
    train = play_calls(PLAYERS[args.label], args.meta_episodes, 101)
    # other seeds: other levels (the overlap is printed)
    held_out = play_calls(SOLVER_LOOKING if looking else "solver", args.score_meta_episodes, 9001)
    overlap = set(train["initial_state"].to_list()) & set(held_out["initial_state"].to_list())

    def encode(prompts: list[str]) -> list[list[int]]:
        return tokenizer([format_prompt(tokenizer, p) for p in prompts], add_special_tokens=False)["input_ids"]

    whole = encode(train["prompt"].to_list())
    short = [ids[-args.context_tokens :] for ids in whole]
    responses = tokenizer(train["response"].to_list(), add_special_tokens=False)["input_ids"]
    test_moves = [first_move(a) for a in held_out["action"].to_list()]
    direction_ids = tokenizer.convert_tokens_to_ids(list(DIRECTIONS))
    test_replies: list[list[int]] = []
    if looking:  # the reply follows the prompt; the thought's fixed shape is what score_looking indexes
        test_replies = tokenizer(held_out["response"].to_list(), add_special_tokens=False)["input_ids"]
        ends = tokenizer.convert_tokens_to_ids(["</think>", "<action>"])
        assert all(r[THOUGHT_END : FIRST_MOVE] == ends for r in test_replies), "a thought is not 9 cell tokens"
        test_whole = encode(held_out["prompt"].to_list())
    else:  # the move follows <action>
        action = tokenizer.convert_tokens_to_ids("<action>")
        test_whole = [p + [action] for p in encode(held_out["prompt"].to_list())]
    test_short = [p[-args.context_tokens - (not looking) :] for p in test_whole]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    majority = np.bincount(test_moves, minlength=4).max() / len(test_moves)
    print(f"# {platform.node()}, {os.cpu_count()} cores, torch {torch.__version__}, {args.threads} threads; "
          f"{args.source or 'a fresh model'}: {model.config.hidden_size} wide, {model.config.num_hidden_layers} layers, "
          f"{sum(p.numel() for p in model.parameters())} parameters; cloned: {train.height} {args.label} calls on "
          f"{train['initial_state'].n_unique()} levels; scored: {held_out.height} solver calls on "
          f"{held_out['initial_state'].n_unique()} levels ({len(overlap)} shared); the commonest first move "
          f"{majority:.3f}; data and tokenizer {time.perf_counter() - started:.0f} s")
    print(f"| steps (phase) | training loss (per reply token) | first move = solver's, last {args.context_tokens} tokens "
          "| NLL of the solver's move, same | first move = solver's, whole prompt | NLL, same | cells read, last "
          f"{args.context_tokens} tokens | cells read, whole prompt | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    short_order = rng.permutation(len(short)).tolist()
    whole_batches: list[list[int]] = []
    losses: list[float] = []  # since the last row, so a row's loss is of one phase
    started = time.perf_counter()

    def report(step: int, phase: str) -> None:
        if looking:
            cut, full = (score_looking(model, test, test_replies, direction_ids, tokenizer.pad_token_id)
                         for test in (test_short, test_whole))
        else:
            cut, full = (score(model, test, test_moves, direction_ids, tokenizer.pad_token_id)
                         for test in (test_short, test_whole))
        read = f"{cut[2]:.3f} | {full[2]:.3f}" if looking else "- | -"
        loss = f"{np.mean(losses):.3f}" if losses else "-"
        losses.clear()
        print(f"| {step} ({phase}) | {loss} | {cut[0]:.3f} | {cut[1]:.3f} | {full[0]:.3f} | {full[1]:.3f} | {read} | "
              f"{time.perf_counter() - started:.0f} |", flush=True)

    if args.source:
        report(0, "as given")
    total = args.steps + args.whole_steps
    for step in range(1, total + 1):
        if step <= args.steps:
            begin = (step - 1) * args.rows % len(short_order)
            rows, prompts = (short_order + short_order)[begin : begin + args.rows], short
        else:  # as the build's whole-prompt phase: batches cut in prompt order, so they share a prefix
            if not whole_batches:
                whole_batches = _bc_batches(whole, set(), args.whole_rows, None, args.whole_by_prompt, rng)
            rows, prompts = whole_batches.pop(), whole
        losses.append(_bc_step(model, optimizer, prompts, responses, rows, tokenizer.pad_token_id))
        if step % args.every == 0 or step in (args.steps, total):  # and at the end of each phase
            report(step, "short" if step <= args.steps else "whole")


if __name__ == "__main__":
    main()
