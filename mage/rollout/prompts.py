"""Prompts of a meta-episode (docs/method.md, The meta-episode).

Every turn the prompt is rebuilt from scratch as one user message:

1. the rules (never cut),
2. the initial state and the meta-episode's shape (N episodes, same opponent),
3. one block per finished episode, by context mode:
   ``reflection_only`` (outcome + reflection), ``history_only`` (moves + outcome, no
   reflections), ``history_and_reflection`` (all three); ``none`` shows no block (an ablation:
   nothing an earlier episode revealed reaches a later one, only the episode's number),
4. the current episode: its state, history and legal actions (play), or the episode just
   finished with the request to reflect (reflect).

A prompt longer than the model allows is handled by the configured rule: ``error`` raises
:class:`PromptTooLongError`; ``drop_oldest`` removes finished-episode blocks oldest first
and says so in a visible marker. Rules, initial state and the current episode are never
removed; if they alone do not fit, it is an error either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mage.games import Game, InitialState


class PromptTooLongError(ValueError):
    """A prompt does not fit the model's context even after the configured rule."""


@dataclass(frozen=True)
class EpisodeRecord:
    """A finished episode as later prompts show it."""

    number: int  # 1-based
    history: str
    result: str
    episode_return: float
    reflection: str | None = None  # None: no reflection was asked for


@dataclass(frozen=True)
class Prompt:
    text: str
    dropped_episodes: int = 0  # finished-episode blocks removed to fit


def _shows_episodes(mode: str) -> bool:
    return mode != "none"


def _shows_history(mode: str) -> bool:
    return mode in ("history_only", "history_and_reflection")


def _shows_reflection(mode: str) -> bool:
    return mode in ("reflection_only", "history_and_reflection")


def episode_block(record: EpisodeRecord, mode: str) -> str:
    lines = [f"## Episode {record.number}"]
    if _shows_history(mode):
        lines += ["Moves:", record.history]
    lines.append(f"Result: {record.result} Score: {record.episode_return:+g}.")
    if _shows_reflection(mode) and record.reflection is not None:
        lines.append(f"Your reflection: {record.reflection or '(none: the reflection was missing or invalid)'}")
    return "\n".join(lines)


def _same_counterpart(game: Game) -> str:
    """What stays the same across a meta-episode: the opponent, or (one player) the level."""
    return "against the same opponent from the same starting position" if game.num_players > 1 else "on the same level"


def _header(game: Game, initial: InitialState, num_episodes: int) -> list[str]:
    if num_episodes == 1:
        shape = "You play one episode."
    else:
        shape = (f"You play {num_episodes} episodes in a row {_same_counterpart(game)}. "
                 "Learn from earlier episodes to do better in later ones.")
    return [game.rules_text(), f"# Your situation\n{shape}\n" + game.render_initial_state(initial)]


def _fit(
    head: list[str],
    blocks: list[str],
    tail: list[str],
    count_tokens: Callable[[str], int],
    max_tokens: int | None,
    overflow: str,
) -> Prompt:
    def join(kept: Sequence[str], dropped: int) -> str:
        earlier = list(kept)
        if dropped:
            earlier.insert(0, f"[{dropped} earlier episode(s) omitted to fit the context window]")
        middle = ["# Earlier episodes\n" + "\n\n".join(earlier)] if earlier else []
        return "\n\n".join(head + middle + tail)

    text = join(blocks, 0)
    if max_tokens is None or count_tokens(text) <= max_tokens:
        return Prompt(text)
    if overflow == "error":
        raise PromptTooLongError(f"prompt of {count_tokens(text)} tokens exceeds the limit of {max_tokens} (overflow rule: error)")
    for dropped in range(1, len(blocks) + 1):
        text = join(blocks[dropped:], dropped)
        if count_tokens(text) <= max_tokens:
            return Prompt(text, dropped)
    raise PromptTooLongError(
        f"prompt of {count_tokens(text)} tokens exceeds the limit of {max_tokens} even with every earlier "
        "episode dropped: rules, initial state and the current episode do not fit"
    )


def play_prompt(
    game: Game,
    initial: InitialState,
    finished: Sequence[EpisodeRecord],
    current_state: str,
    episode_number: int,
    num_episodes: int,
    mode: str,
    count_tokens: Callable[[str], int] = lambda text: 0,
    max_tokens: int | None = None,
    overflow: str = "error",
) -> Prompt:
    """The prompt of a play turn in episode ``episode_number`` (1-based)."""
    tail = [
        f"# Episode {episode_number} of {num_episodes} (now)\n{current_state}",
        "Think briefly if you need to, then give your move inside <action></action>.",
    ]
    blocks = [episode_block(r, mode) for r in finished] if _shows_episodes(mode) else []
    return _fit(_header(game, initial, num_episodes), blocks, tail, count_tokens, max_tokens, overflow)


def reflect_prompt(
    game: Game,
    initial: InitialState,
    finished: Sequence[EpisodeRecord],
    just_finished: EpisodeRecord,
    num_episodes: int,
    mode: str,
    count_tokens: Callable[[str], int] = lambda text: 0,
    max_tokens: int | None = None,
    overflow: str = "error",
) -> Prompt:
    """The prompt of the reflection after ``just_finished`` (whose moves it always shows)."""
    number = just_finished.number
    tail = [
        f"# Episode {number} of {num_episodes} just ended\nMoves:\n{just_finished.history}\n"
        f"Result: {just_finished.result} Score: {just_finished.episode_return:+g}.",
        f"# Reflect\nYou will now play episode {number + 1} of {num_episodes} {_same_counterpart(game)}. "
        + ("Identify your mistakes and what the opponent's moves reveal about how it plays, "
           if game.num_players > 1 else "Identify your mistakes, ")
        + "then write an improved plan inside <remark></remark>.",
    ]
    blocks = [episode_block(r, mode) for r in finished] if _shows_episodes(mode) else []
    return _fit(_header(game, initial, num_episodes), blocks, tail, count_tokens, max_tokens, overflow)
