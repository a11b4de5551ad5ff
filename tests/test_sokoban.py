"""Tests of Sokoban: generator, optimal solver, deadlock tests, episodes and replay."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mage.games.base import InitialState, Outcome
from mage.games.sokoban import Level, Sokoban, SokobanEpisode, generate_level, solve
from mage.games.sokoban.level import DELTAS, MOVE_NAMES
from mage.games.sokoban.solver import dead_squares, is_deadlocked
from mage.protocol.parsing import parse_action

UP, DOWN, LEFT, RIGHT = range(4)


def episode_for(level: Level, **game_options) -> SokobanEpisode:
    """An episode on a hand-made level, through the same snapshot path as generated ones."""
    initial = InitialState("sokoban", 0, 0, {"level": level.to_data(), "optimal_moves": -1})
    return Sokoban(**game_options).new_episode(initial)


def play(episode: SokobanEpisode, moves: list[str]) -> None:
    episode.apply_agent_actions([MOVE_NAMES.index(m) for m in moves])


def deadlocked(level: Level) -> bool:
    return is_deadlocked(level.walls, level.targets, level.boxes, dead_squares(level))


# -- hand-made levels with hand-counted shortest solutions ----------------------------------
CORRIDOR = """
#####
#@$.#
#####
"""  # one push right: 1 move

WALK_AROUND = """
######
#____#
#.@$_#
#____#
######
"""  # box must go left twice; player walks round it (up, right, right, down) then pushes: 4 + 2 = 6

TWO_BOXES = """
######
#*___#
#__$_#
#_.@_#
######
"""  # right, up (2), push left (1), up, left (2), push down (1): 6; pushing down first costs 8

CORNERED = """
#####
#$__#
#__.#
#@__#
#####
"""  # box in a non-target corner: unsolvable

FROZEN_PAIR = """
######
#.$$.#
#____#
#__@_#
######
"""  # both boxes on live squares of the top row, but side by side against the wall: frozen


@pytest.mark.parametrize(("text", "length"), [(CORRIDOR, 1), (WALK_AROUND, 6), (TWO_BOXES, 6)])
def test_solver_finds_hand_counted_shortest_solution(text: str, length: int) -> None:
    level = Level.from_text(text)
    solution = solve(level)
    assert solution is not None and len(solution) == length
    assert solve(level, max_depth=length) == solution
    assert solve(level, max_depth=length - 1) is None
    # Independent check: the environment, not the solver, says the moves solve it.
    episode = episode_for(level)
    play(episode, solution)
    assert episode.is_terminal and episode.outcome() is Outcome.WIN
    assert episode.agent_return() == 10.0
    assert len(episode.history) == length


def test_corridor_solution_is_one_push_right() -> None:
    assert solve(Level.from_text(CORRIDOR)) == ["right"]


def test_solver_on_solved_and_unsolvable_levels() -> None:
    assert solve(Level.from_text("####\n#*@#\n####")) == []
    assert solve(Level.from_text(CORNERED)) is None
    assert solve(Level.from_text(FROZEN_PAIR)) is None


def naive_shortest(level: Level) -> int | None:
    """Plain BFS through the environment's own move rule, no pruning: the reference."""
    seen, frontier, depth = {level}, [level], 0
    while frontier:
        if any(state.is_solved for state in frontier):
            return depth
        depth += 1
        children = (state.move(m)[0] for state in frontier for m in MOVE_NAMES)
        frontier = [child for child in dict.fromkeys(children) if child not in seen]
        seen.update(frontier)
    return None


@pytest.mark.parametrize("num_boxes", [1, 2, 3])
def test_pruned_solver_matches_unpruned_search(num_boxes: int) -> None:
    for seed in range(100, 106):
        level, length = generate_level(seed, num_boxes=num_boxes)
        assert naive_shortest(level) == length
    for text in (WALK_AROUND, TWO_BOXES, CORNERED, FROZEN_PAIR):
        level = Level.from_text(text)
        solution = solve(level)
        assert naive_shortest(level) == (None if solution is None else len(solution))


# -- deadlocks -----------------------------------------------------------------------------
def test_box_in_non_target_corner_is_deadlocked() -> None:
    level = Level.from_text(CORNERED)
    assert (1, 1) in dead_squares(level)
    assert deadlocked(level)


def test_two_by_two_freeze_is_deadlocked_even_on_live_squares() -> None:
    level = Level.from_text(FROZEN_PAIR)
    assert not level.boxes & dead_squares(level)  # only the freeze rule can catch this
    assert deadlocked(level)
    # Four boxes in a square in open floor are frozen too, with no wall involved.
    square = {(2, 2), (2, 3), (3, 2), (3, 3)}
    assert is_deadlocked(frozenset(), frozenset({(2, 2)}), square, frozenset())
    # ... but a 2x2 block of boxes that are all on targets is fine.
    assert not is_deadlocked(frozenset(), frozenset(square), square, frozenset())


def test_box_on_target_in_corner_is_not_deadlocked() -> None:
    level = Level.from_text(TWO_BOXES)
    assert (1, 1) in level.boxes & level.targets
    assert not deadlocked(level)


def test_dead_squares_are_off_target_floor_only() -> None:
    level = Level.from_text(WALK_AROUND)
    dead = dead_squares(level)
    # Target (2,1) is on the left wall: the top and bottom rows can never reach it.
    assert dead == {(1, c) for c in range(1, 5)} | {(3, c) for c in range(1, 5)} | {(2, 4)}
    assert not dead & (level.targets | level.walls)


# -- generator -----------------------------------------------------------------------------
@pytest.mark.parametrize(("num_boxes", "seeds"), [(2, range(50)), (1, range(20)), (3, range(20))])
def test_generated_levels_are_solvable_within_range(num_boxes: int, seeds: range) -> None:
    for seed in seeds:
        level, length = generate_level(seed, num_boxes=num_boxes)
        assert 5 <= length <= 21
        solution = solve(level)
        assert solution is not None and len(solution) == length
        assert len(level.boxes) == len(level.targets) == num_boxes
        assert not level.is_solved and not deadlocked(level)
        assert (level.height, level.width) == (6, 6)
        border = {(r, c) for r in range(6) for c in range(6) if r in (0, 5) or c in (0, 5)}
        assert border <= level.walls
        episode = episode_for(level)
        play(episode, solution)
        assert episode.outcome() is Outcome.WIN


def test_generation_is_reproducible_and_varies_with_seed() -> None:
    assert generate_level(7) == generate_level(7)
    assert generate_level(7, num_boxes=3) == generate_level(7, num_boxes=3)
    levels = {generate_level(seed)[0] for seed in range(10)}
    assert len(levels) > 1


def test_generation_reports_unmeetable_settings() -> None:
    # A 2x2 room: every cell is a corner, so no box can start off its target.
    with pytest.raises(ValueError, match=r"4x4 .* 1 boxes .* 5\.\.21 moves in 20 attempts"):
        generate_level(0, dim=(4, 4), num_boxes=1, max_attempts=20)


# -- level data and rendering --------------------------------------------------------------
def test_level_data_round_trip_and_rendering() -> None:
    level = Level.from_text(TWO_BOXES)
    data = level.to_data()
    assert json.loads(json.dumps(data)) == data
    assert data["boxes"] == [[1, 1], [2, 3]] and data["player"] == [3, 3]
    assert Level.from_data(data) == level
    assert Level.from_text("\n".join(level.rows())) == level
    assert level.render().splitlines()[:4] == [
        "  A B C D E F",
        "1 # # # # # #",
        "2 # * _ _ _ #",
        "3 # _ _ $ _ #",
    ]
    assert level.render().splitlines()[4] == "4 # _ . @ _ #"


# -- game and episodes ---------------------------------------------------------------------
def test_game_contract() -> None:
    game = Sokoban()
    initial = game.initial_state(3)
    assert initial.game == "sokoban" and initial.agent_seat == 0
    level, length = generate_level(3)
    assert initial.data == {"level": level.to_data(), "optimal_moves": length}
    assert level.render() in game.render_initial_state(initial)
    assert "<action>up, left, left</action>" in game.rules_text()
    with pytest.raises(ValueError):
        game.initial_state(3, agent_seat=1)
    with pytest.raises(ValueError):
        game.new_episode(initial, opponent=object())
    episode = game.new_episode(initial)
    assert episode.legal_actions() == {"up": 0, "down": 1, "left": 2, "right": 3}
    assert parse_action("<action>Up, left,left</action>", episode.action_aliases(), max_moves=3).actions == (0, 2, 2)
    assert episode.outcome() is Outcome.ONGOING and episode.agent_return() == 0.0
    assert game.forfeit_return(episode) == 0.0


def test_blocked_moves_are_recorded_and_change_nothing() -> None:
    episode = episode_for(Level.from_text(WALK_AROUND))
    before = episode.level
    episode.apply_agent_actions([RIGHT, RIGHT])  # box, then wall behind the box after one push
    assert [m.name for m in episode.history] == ["right", "right (blocked)"]
    assert episode.level.boxes == {(2, 4)} and episode.level.player == (2, 3)
    episode.apply_agent_actions([DOWN, DOWN])  # floor, then the outer wall
    assert [m.name for m in episode.history][2:] == ["down", "down (blocked)"]
    assert before.walls == episode.level.walls
    assert episode.render_history().splitlines()[1] == "2. You: right (blocked)"


def test_deadlock_ends_episode_only_when_asked() -> None:
    level = Level.from_text(WALK_AROUND)
    for end_on_deadlock in (False, True):
        episode = episode_for(level, end_on_deadlock=end_on_deadlock)
        episode.apply_agent_actions([RIGHT, UP])  # box pushed onto the dead right wall
        assert episode.deadlocked
        assert "stuck" not in episode.render_state()  # the paper's prompt: no solver verdict
        assert episode.agent_return() == 0.0
        if end_on_deadlock:
            assert episode.is_terminal and episode.outcome() is Outcome.LOSS
            assert episode.legal_actions() == {}
            assert len(episode.history) == 1  # stopped at the deadlock
            assert "Stuck" in episode.render_result()
        else:
            assert not episode.is_terminal and episode.outcome() is Outcome.ONGOING
            assert len(episode.history) == 2


def test_the_deadlock_hint_is_an_option() -> None:
    hinted = episode_for(Level.from_text(WALK_AROUND), deadlock_hint=True)
    assert "stuck" not in hinted.render_state()
    hinted.apply_agent_actions([RIGHT, UP])  # box pushed onto the dead right wall
    assert "stuck" in hinted.render_state()


PUSH_OFF = """
#######
#@*_$.#
#######
"""  # one box already on its target: a push right takes it off; the other is one push from its target


def test_box_reward_is_an_option_counting_boxes_pushed_onto_and_off_targets() -> None:
    # Hand-counted returns (payoff 10): CORRIDOR starts with no box on a target and is solved by
    # one push; TWO_BOXES starts with one and is solved in 6; PUSH_OFF loses its placed box.
    cases = [(CORRIDOR, [RIGHT], 10.0, 11.0), (TWO_BOXES, [RIGHT, UP, LEFT, UP, LEFT, DOWN], 10.0, 11.0),
             (PUSH_OFF, [RIGHT], 0.0, -1.0), (PUSH_OFF, [RIGHT, LEFT, LEFT], 0.0, -1.0),
             (WALK_AROUND, [UP, RIGHT, RIGHT, DOWN, LEFT], 0.0, 0.0)]
    for text, moves, paper, shaped in cases:
        for box_reward, expected in ((0.0, paper), (1.0, shaped), (0.5, paper + (shaped - paper) / 2)):
            episode = episode_for(Level.from_text(text), box_reward=box_reward)
            episode.apply_agent_actions(moves)
            assert episode.agent_return() == expected, (text, moves, box_reward)
    assert "push off" not in Sokoban().rules_text() and "otherwise 0" in Sokoban().rules_text()
    assert "+1 for each box you push onto a target and -1 for each you push off one; +10 more" in \
        Sokoban(box_reward=1.0).rules_text()
    with pytest.raises(ValueError, match="box_reward must be in"):
        Sokoban(box_reward=-0.5)


def test_the_step_anchor_leaves_out_the_move_counter() -> None:
    # The same board reached after 0 and after 2 moves (right then left: the player walks
    # back): one anchor, while the prompt still shows how many moves were made.
    episode = episode_for(Level.from_text(WALK_AROUND))
    start_anchor, start_prompt = episode.observation(), episode.render_state()
    episode.apply_agent_actions([UP, DOWN])
    assert episode.observation() == start_anchor
    assert episode.render_state() != start_prompt
    assert "Moves made: 0." in start_prompt and "Moves made: 2." in episode.render_state()
    assert "Moves made" not in episode.observation()


def test_moves_after_solving_are_ignored() -> None:
    episode = episode_for(Level.from_text(CORRIDOR))
    episode.apply_agent_actions([RIGHT, LEFT, LEFT])
    assert len(episode.history) == 1 and episode.outcome() is Outcome.WIN
    assert episode.legal_actions() == {}
    assert "Solved" in episode.render_result() and "1 move." in episode.render_result()
    assert "Boxes on targets: 1 of 1." in episode.render_state()


def test_a_fixed_set_of_levels_is_what_the_seeds_draw_from() -> None:
    # game.params.levels=K: every seed plays one of K levels, the seeds cover all of them, and
    # a new level for every seed (the default) repeats none over the same seeds
    seeds = [7 * s + 1_000_003 for s in range(60)]
    pooled, fresh = Sokoban(levels=3), Sokoban()
    pooled_levels = {json.dumps(pooled.initial_state(s).data["level"], sort_keys=True) for s in seeds}
    fresh_levels = {json.dumps(fresh.initial_state(s).data["level"], sort_keys=True) for s in seeds}
    assert len(pooled_levels) == 3 and len(fresh_levels) == len(seeds)
    for s in seeds:
        assert pooled.initial_state(s).data["level"] == pooled.initial_state(s + 3).data["level"]
        assert pooled.initial_state(s).data["level_index"] == s % 3
        assert pooled.initial_state(s).seed == s  # the group's seed stays what the table pairs by
    # the set holds the generator's levels 0..K-1
    assert {json.dumps(generate_level(i)[0].to_data(), sort_keys=True) for i in range(3)} == pooled_levels
    with pytest.raises(ValueError, match="levels must be null"):
        Sokoban(levels=0)


def test_initial_state_replays_exactly() -> None:
    game = Sokoban()
    initial = game.initial_state(11)
    replayed = InitialState.from_json(initial.to_json())
    assert replayed == initial
    first, second = game.new_episode(initial), game.new_episode(replayed)
    assert first.render_state() == second.render_state()
    moves = [UP, LEFT, LEFT, DOWN, RIGHT, RIGHT, UP, DOWN, LEFT, RIGHT, UP, UP]
    for turn in range(0, len(moves), 3):
        first.apply_agent_actions(moves[turn:turn + 3])
        second.apply_agent_actions(moves[turn:turn + 3])
        assert first.render_state() == second.render_state()
        assert first.history == second.history


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10_000), moves=st.lists(st.integers(0, 3), max_size=60))
def test_random_play_keeps_the_board_consistent(seed: int, moves: list[int]) -> None:
    game = Sokoban()
    episode = game.new_episode(game.initial_state(seed))
    start = episode.level
    for action in moves:
        if episode.is_terminal:
            break
        before = episode.level
        episode.apply_agent_actions([action])
        after = episode.level
        assert after.walls == start.walls and after.targets == start.targets
        assert len(after.boxes) == len(start.boxes)  # boxes never merge (a frozenset would shrink)
        assert not after.boxes & after.walls
        assert after.player not in after.walls and after.player not in after.boxes
        assert after.in_bounds(after.player) and all(after.in_bounds(b) for b in after.boxes)
        # The player moves at most one cell, in the chosen direction; at most one box moves.
        dr, dc = DELTAS[MOVE_NAMES[action]]
        assert after.player in (before.player, (before.player[0] + dr, before.player[1] + dc))
        assert len(before.boxes - after.boxes) <= 1
