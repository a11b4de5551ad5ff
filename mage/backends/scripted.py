"""The ``scripted`` backend: a rule speaks the protocol, with no model.

It drives the rollout engine in tests and demonstrations, and writes the transcripts the
tiny preset's behaviour-cloning warm start learns from. For a play request it asks its
``rule`` for a move in the live episode (``request.context``) and answers
``<action>name</action>``; for a reflection it answers ``<remark>...</remark>``: the outcome,
both players' moves and a short plan (the game's :meth:`~mage.games.base.Game.reflection_plan`
where it has one). The plan is written, never followed: the rule plays as it would anyway. ``invalid_rate`` makes it answer with a
malformed reply now and then, so invalid-action handling can be exercised.

A rule (:func:`make_rule`) is named in config as a string, or as a mapping ``{rule: name,
**params}``:

* ``random``: uniform over the legal actions (any game);
* an opponent of :mod:`mage.opponents` for OpenSpiel games, asked for the agent's move in
  the agent's seat (Kuhn's ``timid``, Tic-Tac-Toe's ``beginner``, ...);
* Sokoban: ``solver`` (the next moves of an optimal solution) and ``wanderer`` (each move
  is the solver's with probability ``solver_probability``, else a random direction: it
  solves short levels and wanders on long ones). ``{rule: wanderer, look_around: true}``
  first writes the 3x3 cells around the player inside ``<think>`` (:func:`surroundings`);
* any of these with ``recall: true`` (``{rule: random, recall: true}``) first thinks the plan of
  the last reflection in the prompt, and then plays as it would anyway (:class:`RecallRule`).

A Python callable ``episode -> actions`` is accepted as well (tests use it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mage.backends.base import Backend, Generation, GenerationRequest, SamplingSection
from mage.backends.chat import format_prompt

MALFORMED_REPLIES = ("I am not sure.", "<action>", "<action>fly</action>", "<remark>oops</remark>")

#: A rule's move(s) in the live episode, drawn with the backend's generator.
Rule = Callable[[Any, np.random.Generator], list[int]]


def _move_names(episode: Any, actions: Sequence[int]) -> list[str]:
    names = {action: name for name, action in episode.legal_actions().items()}
    return [names[a] for a in actions]


def random_rule(episode: Any, rng: np.random.Generator) -> list[int]:
    return [int(rng.choice(sorted(episode.legal_actions().values())))]


def solver_rule(episode: Any, rng: np.random.Generator | None = None) -> list[int]:
    """Sokoban: the next moves of an optimal solution from the current position."""
    from mage.games.sokoban import solve
    from mage.games.sokoban.game import ACTIONS

    plan = solve(episode.level) or []
    if not plan:  # unsolvable from here (deadlock): any move
        return [ACTIONS["up"]]
    return [ACTIONS[m] for m in plan[: episode.game.moves_per_turn]]


def surroundings(level: Any) -> str:
    """The 3x3 cells around the player in the board's symbols, rows in reading order
    separated by commas (`` # # #, # @ _, # $ .``; outside the grid reads as wall). Each cell is
    the same token as in the prompt's board, so a model that writes this copies cells."""
    return ",".join("".join(f" {symbol}" for symbol in row) for row in level.around_player())


class WandererRule:
    """Sokoban: each move of a turn is the optimal solver's next move with probability
    ``solver_probability``, else a uniformly random direction (a deadlocked position gets
    random moves only). Short levels survive a few random steps; long ones rarely do.

    ``look_around``: the reply first thinks the 3x3 cells around the player
    (:func:`surroundings`). That patch's commonest solver move is the solver's next move two
    times in three (docs/notes/findings.md, "A warm start that reads the board"), so a model cloned on it is taught
    to read the board where its moves depend on it, a cell at a time, not only through the
    moves."""

    def __init__(self, solver_probability: float = 0.75, look_around: bool = False) -> None:
        if not 0.0 <= solver_probability <= 1.0:
            raise ValueError(f"wanderer: solver_probability must be in [0, 1], got {solver_probability}")
        if not isinstance(look_around, bool):
            raise ValueError(f"wanderer: look_around must be true or false, got {look_around!r}")
        self.solver_probability = float(solver_probability)
        self.look_around = look_around

    def thought(self, episode: Any, prompt: str) -> str | None:
        """What the reply thinks before its moves, from the position they start from."""
        return surroundings(episode.level) if self.look_around else None

    def __call__(self, episode: Any, rng: np.random.Generator) -> list[int]:
        from mage.games.sokoban.game import ACTIONS

        moves = wander(episode.level, episode.game.moves_per_turn, self.solver_probability, rng)
        return [ACTIONS[name] for name in moves]


def wander(level: Any, moves_per_turn: int, solver_probability: float, rng: np.random.Generator) -> list[str]:
    """One turn of the wanderer from a Sokoban ``level``: up to ``moves_per_turn`` move names,
    each the solver's next move with probability ``solver_probability``, else a random
    direction (also where the solver finds no solution); it stops once the level is solved."""
    from mage.games.sokoban import solve
    from mage.games.sokoban.level import MOVE_NAMES

    moves: list[str] = []
    for _ in range(moves_per_turn):
        if level.is_solved:
            break
        plan = solve(level) if rng.random() < solver_probability else None
        name = plan[0] if plan else MOVE_NAMES[int(rng.integers(len(MOVE_NAMES)))]
        level, _ = level.move(name)
        moves.append(name)
    return moves


def _policy_rule(policy: Any) -> Rule:
    """An OpenSpiel policy asked for the agent's move in the agent's seat."""

    def choose(episode: Any, rng: np.random.Generator) -> list[int]:
        probs = policy.action_probabilities(episode.state, episode.agent)
        actions = sorted(probs)
        weights = np.array([probs[a] for a in actions], dtype=float)
        if getattr(policy, "deterministic", False):
            return [int(actions[int(np.argmax(weights))])]
        return [int(actions[rng.choice(len(actions), p=weights / weights.sum())])]

    return choose


SOKOBAN_RULES: dict[str, Callable[..., Rule]] = {"solver": lambda: solver_rule, "wanderer": WandererRule}

#: How a reflection states its plan: the scripted reflections' ``Next time: <plan>.``
PLAN_MARK = "Next time: "
NO_PLAN = "No plan yet."


def last_plan(prompt: str) -> str:
    """The plan of the last reflection a prompt shows (its ``Your reflection:`` line's ``Next
    time:`` sentence), or :data:`NO_PLAN` where it shows none."""
    reflections = [line for line in prompt.splitlines() if line.startswith("Your reflection: ")]
    if not reflections or PLAN_MARK not in reflections[-1]:
        return NO_PLAN
    return "My plan: " + reflections[-1].split(PLAN_MARK, 1)[1].strip()


class RecallRule:
    """Another rule's moves, after a thought that recalls the plan of the last reflection in
    the prompt (:func:`last_plan`): ``<think>My plan: play scissors, which beats paper.</think>``.
    The moves ignore the plan: a player that brings what it wrote to the point of its decision,
    and does not act on it (``{rule: <name>, recall: true}``; the tiny rock-paper-scissors warm
    start). A model cloned on it has what an earlier episode showed a few tokens before its move."""

    def __init__(self, inner: Rule) -> None:
        self.inner = inner

    def thought(self, episode: Any, prompt: str) -> str:
        return last_plan(prompt)

    def __call__(self, episode: Any, rng: np.random.Generator) -> list[int]:
        return self.inner(episode, rng)


def make_rule(game_name: str, spec: str | Mapping[str, Any], game_params: Mapping[str, Any] | None = None) -> Rule:
    """The rule ``spec`` names (see the module docstring), for the game built with
    ``game_params``; unknown names and parameters raise a ValueError that lists what is known."""
    from mage.opponents import make, opponents_of

    if isinstance(spec, Mapping):
        params = {k: v for k, v in spec.items() if k not in ("rule", "recall")}
        name = spec.get("rule")
        if spec.get("recall", False):
            if spec["recall"] is not True:
                raise ValueError(f"scripted rule {name!r}: recall must be true or false, got {spec['recall']!r}")
            return RecallRule(make_rule(game_name, {"rule": name, **params}, game_params))
    else:
        name, params = spec, {}
    if not isinstance(name, str):
        raise ValueError(f"a scripted rule is a name or {{rule: name, ...params}}, got {spec!r}")
    if name == "random":
        if params:
            raise ValueError(f"scripted rule 'random' takes no parameters, got {sorted(params)}")
        return random_rule
    if game_name == "sokoban":
        if name not in SOKOBAN_RULES:
            raise ValueError(f"unknown scripted rule {name!r} for sokoban; known: {sorted(['random', *SOKOBAN_RULES])}")
        try:
            return SOKOBAN_RULES[name](**params)
        except TypeError as error:
            raise ValueError(f"scripted rule {name!r}: {error}") from None
    if name not in opponents_of(game_name):
        known = sorted({"random", *opponents_of(game_name)})
        raise ValueError(f"unknown scripted rule {name!r} for {game_name}; known: {known}")
    return _policy_rule(make(game_name, name, game_params, **params))


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
        self._rules: dict[str, Rule] = {}  # a named rule, resolved per game (and its OpenSpiel parameters)

    # -- moves -----------------------------------------------------------------------------
    def _rule_for(self, episode: Any) -> Rule:
        if isinstance(self.rule, (str, Mapping)):
            # a game played through the adapter: its OpenSpiel parameters decide which game the rule plays
            parameters = getattr(episode.game, "parameters", None)
            game_params = None if parameters is None else {"openspiel": parameters}
            key = f"{episode.game.name}|{game_params}"
            if key not in self._rules:
                self._rules[key] = make_rule(episode.game.name, self.rule, game_params)
            return self._rules[key]
        if hasattr(self.rule, "action_probabilities"):
            return _policy_rule(self.rule)
        rule = self.rule
        return lambda episode, rng: list(rule(episode))

    def _play(self, episode: Any, prompt: str) -> str:
        rule = self._rule_for(episode)
        # the rule's own thought (before its moves are applied), else the fixed one of `think`
        own = rule.thought(episode, prompt) if hasattr(rule, "thought") else None
        moves = ", ".join(_move_names(episode, rule(episode, self.rng)))
        if own is not None:
            return f"<think>{own}</think><action>{moves}</action>"
        thought = "<think>I follow my plan.</think>\n" if self.think else ""
        return f"{thought}<action>{moves}</action>"

    @staticmethod
    def _reflect(episode: Any) -> str:
        outcome = episode.outcome().value if episode.is_terminal else "unfinished"
        mine = [m.name for m in episode.history if m.actor == "agent"]
        # a game whose moves are not all public (the adapter's Leduc or Goofspiel) shows the
        # opponent's only through the information state: the template names none
        shown = getattr(episode.game, "perfect_information", True)
        theirs = [m.name for m in episode.history if m.actor == "opponent"] if shown else ["moves I did not see"]
        if episode.game.num_players == 1:  # no opponent: the moves, and the plan for the level
            plan = "keep the same moves" if outcome == "win" else "try a different order of pushes"
            return f"<remark>Result: {outcome}. I moved {', '.join(mine) or 'nowhere'}. Next time: {plan}.</remark>"
        plan = episode.game.reflection_plan(episode) or (
            "keep the same plan" if outcome == "win" else "try a different line against this opponent")
        return (
            f"<remark>Result: {outcome}. I played {', '.join(mine) or 'nothing'}; the opponent played "
            f"{', '.join(theirs) or 'nothing'}. Next time: {plan}.</remark>"
        )

    # -- interface -------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingSection) -> list[Generation]:
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
                text = self._play(episode, request.prompt)
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
