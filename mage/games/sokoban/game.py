"""Sokoban as a one-player game of the MAGE pipeline.

The initial state stores the generated level itself (and its optimal length), not just
the seed, so an episode replays the exact level without regenerating it: replay then does
not depend on the generator's code or the numpy version staying the same.

The agent gives up to ``moves_per_turn`` moves per turn; each word is one single move,
the same unit as the solver's optimal length. A blocked move (into a wall or an immovable
box) changes nothing but is still recorded, so the history shows what the agent tried.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mage.games.base import Episode, Game, InitialState, Move, Outcome, check_param
from mage.games.sokoban.generator import generate_level
from mage.games.sokoban.level import BLOCKED, MOVE_NAMES, Level
from mage.games.sokoban.solver import dead_squares, is_deadlocked

ACTIONS = {name: action for action, name in enumerate(MOVE_NAMES)}  # up 0, down 1, left 2, right 3

RULES = """\
Game: Sokoban, one player.
- Push every box onto a target. The board is a grid of cells: # wall, _ floor, $ box, \
. target, * box on a target, @ you, + you standing on a target.
- Cells are named by column letter (A, B, ... left to right) and row number (1, 2, ... top \
to bottom): A1 is the top-left corner.
- Each move takes you one cell up, down, left or right. Walking into a box pushes it one \
cell further the same way. You cannot pull boxes, and you cannot push two boxes at once.
- A move into a wall, or into a box with a wall or another box behind it, does nothing \
(it still counts as a move).
- A box pushed into a corner or against a wall may get stuck for good; plan ahead.
- You have {turn_limit} turns. In each turn give 1 to {moves_per_turn} moves, in order, \
separated by commas, for example <action>up, left, left</action>.
- Your score: {score}"""
SCORE = "+{payoff:g} if all boxes are on targets before the turns run out, otherwise 0."
# game.params.box_reward: gym-sokoban's +1 / -1 per box pushed onto / off a target, summed
# over the episode (an episode's return sits on its last step: docs/method.md, Rewards and returns)
SCORE_WITH_BOXES = ("+{box:g} for each box you push onto a target and -{box:g} for each you push off one; "
                    "+{payoff:g} more if all boxes are on targets before the turns run out.")


class Sokoban(Game):
    name = "sokoban"
    num_players = 1
    action_names = MOVE_NAMES
    training_set_params = ("levels",)

    def __init__(
        self,
        dim: tuple[int, int] = (6, 6),
        num_boxes: int = 2,
        min_moves: int = 5,
        max_moves: int = 21,
        turn_limit: int = 7,
        moves_per_turn: int = 3,
        payoff_scale: float = 10.0,
        end_on_deadlock: bool = False,
        deadlock_hint: bool = False,
        box_reward: float = 0.0,
        levels: int | None = None,
    ) -> None:
        check_param(len(dim) == 2 and all(5 <= int(d) <= 16 for d in dim), "dim", dim,
                    "two sizes in [5, 16] (the outer walls included)")
        check_param(1 <= num_boxes <= 6, "num_boxes", num_boxes, "in [1, 6]")
        check_param(1 <= min_moves <= max_moves, "min_moves", min_moves, f">= 1 and <= max_moves ({max_moves})")
        check_param(turn_limit >= 1 and moves_per_turn >= 1, "turn_limit", (turn_limit, moves_per_turn),
                    "turn_limit and moves_per_turn >= 1")
        # a level whose shortest solution does not fit in the turns could never be solved
        check_param(turn_limit * moves_per_turn >= max_moves, "max_moves", max_moves,
                    f"<= turn_limit * moves_per_turn ({turn_limit * moves_per_turn})")
        check_param(payoff_scale > 0, "payoff_scale", payoff_scale, "> 0")
        check_param(0 <= box_reward <= payoff_scale, "box_reward", box_reward,
                    f"in [0, payoff_scale ({payoff_scale})]")
        check_param(levels is None or (isinstance(levels, int) and not isinstance(levels, bool) and levels >= 1),
                    "levels", levels, "null (a new level for every seed) or an integer >= 1")
        self.dim = (int(dim[0]), int(dim[1]))
        self.num_boxes = num_boxes
        self.min_moves = min_moves
        self.max_moves = max_moves
        self.turn_limit = turn_limit
        self.moves_per_turn = moves_per_turn
        self.payoff_scale = payoff_scale
        self.end_on_deadlock = end_on_deadlock
        self.deadlock_hint = deadlock_hint
        self.box_reward = float(box_reward)
        self.levels = levels

    def initial_state(self, seed: int, agent_seat: int = 0) -> InitialState:
        if agent_seat != 0:
            raise ValueError(f"Sokoban has one player: agent_seat must be 0, got {agent_seat!r}")
        # A fixed set of levels, as Procgen's num_levels (Cobbe et al. 2019): the seed picks one
        # of them, so training sees the same levels again and an evaluation on the same setting
        # measures the levels trained on. Level i is the generator's level for seed i.
        level_seed = seed if self.levels is None else seed % self.levels
        level, optimal = generate_level(level_seed, self.dim, self.num_boxes, self.min_moves, self.max_moves)
        data: dict[str, Any] = {"level": level.to_data(), "optimal_moves": optimal}
        if self.levels is not None:
            data["level_index"] = level_seed
        return InitialState(self.name, int(seed), 0, data)

    def new_episode(self, initial: InitialState, opponent: Any | None = None) -> SokobanEpisode:
        if opponent is not None:
            raise ValueError("Sokoban is a one-player game: it takes no opponent")
        return SokobanEpisode(self, initial)

    def rules_text(self) -> str:
        score = (SCORE_WITH_BOXES if self.box_reward else SCORE).format(payoff=self.payoff_scale, box=self.box_reward)
        return RULES.format(turn_limit=self.turn_limit, moves_per_turn=self.moves_per_turn, score=score)

    def episode_return(self, solved: bool, start_on_targets: int, end_on_targets: int) -> float:
        """+payoff_scale on success; with ``box_reward``, plus that much per box left on a
        target beyond those the episode started with (fewer: minus)."""
        return (self.payoff_scale if solved else 0.0) + self.box_reward * (end_on_targets - start_on_targets)

    def solved_return(self, initial: InitialState) -> float:
        """The return of an episode that solves ``initial``'s level."""
        level = Level.from_data(initial.data["level"])
        return self.episode_return(True, level.boxes_on_targets, len(level.boxes))

    def render_initial_state(self, initial: InitialState) -> str:
        level = Level.from_data(initial.data["level"])
        return f"Starting level ({len(level.boxes)} boxes):\n{level.render()}"


class SokobanEpisode(Episode):
    def __init__(self, game: Sokoban, initial: InitialState) -> None:
        self.game = game
        self.initial = initial
        self.history = []
        self.level = Level.from_data(initial.data["level"])
        self.start_on_targets = self.level.boxes_on_targets
        # Dead squares depend only on walls and targets, so they are computed once.
        self._dead = dead_squares(self.level)

    def apply_agent_actions(self, actions: Sequence[int]) -> None:
        for action in actions:
            if self.is_terminal:
                break
            if action not in ACTIONS.values():
                raise ValueError(f"illegal Sokoban action {action!r}")
            name = MOVE_NAMES[action]
            self.level, effect = self.level.move(name)
            self.history.append(Move("agent", int(action), f"{name} (blocked)" if effect == BLOCKED else name))

    # -- queries -----------------------------------------------------------------------
    @property
    def solved(self) -> bool:
        return self.level.is_solved

    @property
    def deadlocked(self) -> bool:
        """Whether a box is provably stuck (dead square or 2x2 freeze): no win is possible."""
        level = self.level
        return is_deadlocked(level.walls, level.targets, level.boxes, self._dead)

    @property
    def is_terminal(self) -> bool:
        return self.solved or (self.game.end_on_deadlock and self.deadlocked)

    def legal_actions(self) -> dict[str, int]:
        # Every direction is always allowed: a blocked move is a legal no-op.
        return {} if self.is_terminal else dict(ACTIONS)

    def outcome(self) -> Outcome:
        if self.solved:
            return Outcome.WIN
        return Outcome.LOSS if self.is_terminal else Outcome.ONGOING

    def agent_return(self) -> float:
        return self.game.episode_return(self.solved, self.start_on_targets, self.level.boxes_on_targets)

    def observation(self) -> str:
        """The board and the boxes on targets: the step anchor. The move counter is left out,
        so the same board reached after a different number of moves shares its anchor."""
        level = self.level
        return f"Board:\n{level.render()}\nBoxes on targets: {level.boxes_on_targets} of {len(level.boxes)}."

    def render_state(self) -> str:
        lines = [f"{self.observation()} Moves made: {len(self.history)}."]
        # The paper's environment does not tell the agent that it is stuck; the solver's
        # verdict is an option (game.params.deadlock_hint).
        if self.game.deadlock_hint and self.deadlocked:
            lines.append("A box is stuck where it can never reach a target: the level can no longer be solved.")
        return "\n".join(lines)

    def render_result(self) -> str:
        moves = len(self.history)
        if self.solved:
            head = f"Solved: all boxes on targets in {moves} move{'s' if moves != 1 else ''}."
        else:
            head = f"Stuck after {moves} moves: a box can never reach a target, so the level could not be solved."
        return f"{head} Final board:\n{self.level.render()}"
