"""The ``scripted`` backend: a rule speaks the protocol, with no model.

It drives the rollout engine in tests and demonstrations, and writes the transcripts the
tiny preset's behaviour-cloning warm start learns from. For a play request it asks its
``rule`` for a move in the live episode (``request.context``) and answers
``<action>name</action>``; for a reflection it answers ``<remark>...</remark>`` with a
short plan derived from the finished episode. ``invalid_rate`` makes it answer with a
malformed reply now and then, so invalid-action handling can be exercised.

A rule is any opponent of :mod:`mage.opponents` (for OpenSpiel games: it is asked for the
agent's move, in the agent's seat), ``"solver"`` for Sokoban (the optimal solver's next
moves) or ``"random"`` (uniform over the legal actions, any game).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mage.backends.base import Backend, Generation, GenerationRequest, SamplingSettings
from mage.backends.chat import format_prompt

MALFORMED_REPLIES = ("I am not sure.", "<action>", "<action>fly</action>", "<remark>oops</remark>")


def _move_names(episode: Any, actions: Sequence[int]) -> list[str]:
    names = {action: name for name, action in episode.legal_actions().items()}
    return [names[a] for a in actions]


def solver_rule(episode: Any, moves_per_turn: int) -> list[int]:
    """Sokoban: the next moves of an optimal solution from the current position."""
    from mage.games.sokoban import solve
    from mage.games.sokoban.game import ACTIONS

    plan = solve(episode.level) or []
    if not plan:  # unsolvable from here (deadlock): any move
        return [ACTIONS["up"]]
    return [ACTIONS[m] for m in plan[:moves_per_turn]]


class ScriptedBackend(Backend):
    """Answers like a fixed rule; see the module docstring."""

    name = "scripted"

    def __init__(
        self,
        rule: Any = "random",
        *,
        invalid_rate: float = 0.0,
        seed: int = 0,
        think: bool = False,
        tokenizer: Any = None,
        chat: bool = True,
    ) -> None:
        if not 0.0 <= invalid_rate <= 1.0:
            raise ValueError(f"invalid_rate must be in [0, 1], got {invalid_rate}")
        self.rule, self.invalid_rate, self.think = rule, invalid_rate, think
        self.tokenizer, self.chat = tokenizer, chat
        self.rng = np.random.default_rng(seed)

    # -- moves -----------------------------------------------------------------------------
    def _choose(self, episode: Any) -> list[int]:
        legal = episode.legal_actions()
        if self.rule == "random":
            return [int(self.rng.choice(sorted(legal.values())))]
        if self.rule == "solver":
            return solver_rule(episode, episode.game.moves_per_turn)
        if isinstance(self.rule, Callable) and not hasattr(self.rule, "action_probabilities"):
            return list(self.rule(episode))
        # An OpenSpiel policy, asked for the agent's move in the agent's seat; sampled with
        # this backend's generator so transcripts are reproducible.
        probs = self.rule.action_probabilities(episode.state, episode.agent)
        actions = sorted(probs)
        weights = np.array([probs[a] for a in actions], dtype=float)
        if getattr(self.rule, "deterministic", False):
            return [int(actions[int(np.argmax(weights))])]
        return [int(actions[self.rng.choice(len(actions), p=weights / weights.sum())])]

    def _play(self, episode: Any) -> str:
        moves = ", ".join(_move_names(episode, self._choose(episode)))
        thought = "<think>I follow my plan.</think>\n" if self.think else ""
        return f"{thought}<action>{moves}</action>"

    @staticmethod
    def _reflect(episode: Any) -> str:
        outcome = episode.outcome().value if episode.is_terminal else "unfinished"
        mine = [m.name for m in episode.history if m.actor == "agent"]
        theirs = [m.name for m in episode.history if m.actor == "opponent"]
        plan = "keep the same plan" if outcome == "win" else "try a different line against this opponent"
        return (
            f"<remark>Result: {outcome}. I played {', '.join(mine) or 'nothing'}; the opponent played "
            f"{', '.join(theirs) or 'nothing'}. Next time: {plan}.</remark>"
        )

    # -- interface -------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingSettings) -> list[Generation]:
        results = []
        for request in requests:
            episode = request.context
            if episode is None:
                raise ValueError("the scripted backend needs the live episode as request.context")
            if self.invalid_rate and self.rng.random() < self.invalid_rate:
                text = str(self.rng.choice(MALFORMED_REPLIES))
            elif request.phase == "reflect":
                text = self._reflect(episode)
            else:
                text = self._play(episode)
            results.append(self._generation(request.prompt, text))
        return results

    def _generation(self, prompt: str, text: str) -> Generation:
        if self.tokenizer is None:
            return Generation(text=text)
        prompt_ids = self.tokenizer(format_prompt(self.tokenizer, prompt, self.chat), add_special_tokens=False)["input_ids"]
        token_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return Generation(text, prompt_ids, token_ids, [0.0] * len(token_ids))

    def count_prompt_tokens(self, prompts: Sequence[str]) -> list[int]:
        if self.tokenizer is not None:
            texts = [format_prompt(self.tokenizer, p, self.chat) for p in prompts]
            return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        return [len(p.split()) for p in prompts]  # a word count stands in for tokens
