"""Tic-Tac-Toe: episodes, replay, rendering and the opponents' moves."""

from __future__ import annotations

import pytest

from mage.games import InitialState, Outcome, make_game
from mage.games.tic_tac_toe import cell_name
from mage.opponents import make
from mage.opponents.tic_tac_toe import PATTERNS

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


#: OpenSpiel's action of each cell (row * 3 + column), named as the board is drawn
CELL = {name: action for action, name in enumerate(["A1", "B1", "C1", "A2", "B2", "C2", "A3", "B3", "C3"])}


def state_after(*cells: str):
    game = make_game("tic_tac_toe").openspiel_game
    state = game.new_initial_state()
    for cell in cells:
        state.apply_action(CELL[cell])
    return state


def winning_cells(marks: set[str], empty: list[str]) -> list[str]:
    """The empty cells that complete a line of ``marks``, from the lines listed by hand."""
    owned = {CELL[m] for m in marks}
    return [c for c in empty if any(CELL[c] in line and set(line) - {CELL[c]} <= owned for line in LINES)]


def test_cell_names_follow_the_drawn_board():
    assert [cell_name(a) for a in range(9)] == ["A1", "B1", "C1", "A2", "B2", "C2", "A3", "B3", "C3"]
    episode = make_game("tic_tac_toe").new_episode(
        InitialState("tic_tac_toe", 0, 0, {"opening": []}), make("tic_tac_toe", "random")
    )
    episode.apply_agent_actions([2])  # C1: top row, right column
    board = episode.render_state().split("Board:\n")[1].split("\n")[:4]
    assert board[0] == "  A B C"
    assert board[1].startswith("1 ") and board[1].split()[3] == "X"


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_preferred_pattern_takes_first_empty_cell_else_random(pattern):
    opponent = make("tic_tac_toe", "preferred_pattern", pattern=pattern)
    priority = PATTERNS[pattern]
    # Fill the first half of the list: it must take the next cell in the list.
    taken = list(priority[: len(priority) // 2])
    state = make_game("tic_tac_toe").openspiel_game.new_initial_state()
    for cell in taken:
        state.apply_action(cell)
    probs = opponent.action_probabilities(state)
    assert probs[priority[len(priority) // 2]] == 1.0
    # With every listed cell taken, it plays uniformly over the rest.
    if len(priority) < 9:
        state = make_game("tic_tac_toe").openspiel_game.new_initial_state()
        filler = [c for c in range(9) if c not in priority]
        for cell in list(priority) + filler[: max(0, 4 - len(priority))]:
            if state.is_terminal() or cell not in state.legal_actions():
                continue
            state.apply_action(cell)
        if not state.is_terminal() and not set(priority) & set(state.legal_actions()):
            legal = state.legal_actions()
            assert opponent.action_probabilities(state) == {a: 1 / len(legal) for a in legal}


def test_explicit_priority_list_by_cell_names():
    opponent = make("tic_tac_toe", "preferred_pattern", priority=["C3", "A1"])
    assert opponent.priority == (8, 0)
    with pytest.raises(ValueError, match="exactly one of"):
        make("tic_tac_toe", "preferred_pattern")
    with pytest.raises(ValueError, match="unknown pattern"):
        make("tic_tac_toe", "preferred_pattern", pattern="spiral")


def _value(board: tuple, to_move: str) -> int:
    """Independent negamax value for the player to move (1 win, 0 draw, -1 loss)."""
    for a, b, c in LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return 1 if board[a] == to_move else -1
    empty = [i for i, v in enumerate(board) if v == "."]
    if not empty:
        return 0
    other = "O" if to_move == "X" else "X"
    return max(-_value(board[:i] + (to_move,) + board[i + 1 :], other) for i in empty)


def test_minimax_plays_only_optimal_moves():
    opponent = make("tic_tac_toe", "minimax")
    for cells in [(), ("A1",), ("B2", "A1"), ("A1", "B2", "C3"), ("A1", "A2", "B1")]:
        state = state_after(*cells)
        board = tuple(c.upper() if c in "xo" else "." for c in str(state).replace("\n", ""))
        mover = "X" if state.current_player() == 0 else "O"
        other = "O" if mover == "X" else "X"
        values = {a: -_value(board[:a] + (mover,) + board[a + 1 :], other) for a in state.legal_actions()}
        optimal = {a for a, v in values.items() if v == max(values.values())}
        probs = opponent.action_probabilities(state)
        assert {a for a, p in probs.items() if p > 0} == optimal
        assert all(p == pytest.approx(1 / len(optimal)) for p in probs.values() if p > 0)


def test_mcts_is_a_real_seeded_search():
    opponent = make("tic_tac_toe", "mcts", max_simulations=100)
    # X to move can win at C1 (A1, B1 taken): a search finds it.
    win_now = state_after("A1", "A2", "B1", "B2")
    # O to move must block X's A1-B1-C1 line at C1.
    block = state_after("A1", "B2", "B1")
    for seed in range(5):
        opponent.reset(seed)
        assert opponent.act(win_now) == 2
        assert opponent.act(block) == 2
    # Same seed, same moves; the estimated policy is a distribution over legal moves.
    empty = state_after()
    opponent.reset(3)
    first = [opponent.act(empty) for _ in range(10)]
    opponent.reset(3)
    assert [opponent.act(empty) for _ in range(10)] == first
    probs = opponent.action_probabilities(empty)
    assert sorted(probs) == list(range(9)) and sum(probs.values()) == pytest.approx(1.0)
    assert not opponent.explicit


def test_episode_outcome_payoff_and_replay():
    game = make_game("tic_tac_toe")
    initial = game.initial_state(seed=5, agent_seat=1)
    assert initial == InitialState.from_json(initial.to_json())
    # Agent is O; the opponent (reading order: A1, B1, C1, ...) moves first.
    opponent = make("tic_tac_toe", "preferred_pattern", pattern="reading_order")
    episode = game.new_episode(initial, opponent)
    assert [m.name for m in episode.history] == ["X at A1"]
    episode.apply_agent_actions([4])  # O at B2; X takes B1
    episode.apply_agent_actions([2])  # O at C1 blocks; X takes A2
    episode.apply_agent_actions([6])  # O at A3 wins the anti-diagonal C1-B2-A3
    assert episode.outcome() == Outcome.WIN and episode.agent_return() == 10.0
    assert episode.render_result().startswith("You won.")
    again = game.new_episode(InitialState.from_json(initial.to_json()), opponent)
    again.apply_agent_actions([4])
    again.apply_agent_actions([2])
    again.apply_agent_actions([6])
    assert again.state.history() == episode.state.history()


def test_opening_moves_are_part_of_the_snapshot():
    game = make_game("tic_tac_toe", opening_moves=2)
    initial = game.initial_state(seed=11)
    assert len(initial.data["opening"]) == 2
    assert game.initial_state(seed=11) == initial
    episode = game.new_episode(initial, make("tic_tac_toe", "random"))
    assert episode.state.history()[:2] == initial.data["opening"]


def test_the_beginner_takes_wins_and_blocks_only_sometimes():
    beginner = make("tic_tac_toe", "beginner", p_win=0.5, p_block=0.4)
    # X to move (X at A1, B1; O at B2, C3): C1 wins. By hand: 0.5 on the win, the other 0.5
    # spread over all five empty cells (the win included), and no block is needed.
    state = state_after("A1", "B2", "B1", "C3")
    empty = ["C1", "A2", "C2", "A3", "B3"]
    assert state.current_player() == 0 and sorted(cell_name(a) for a in state.legal_actions()) == sorted(empty)
    # C1 is X's only winning cell, by the lines listed by hand and by OpenSpiel's own ending;
    # O has no line to complete
    assert winning_cells({"A1", "B1"}, empty) == ["C1"] and winning_cells({"B2", "C3"}, empty) == []
    for name in empty:
        after = state.clone()
        after.apply_action(CELL[name])
        assert (after.is_terminal() and after.returns()[0] == 1.0) == (name == "C1"), name
    probs = beginner.action_probabilities(state, 0)
    assert probs == pytest.approx({CELL[c]: (0.5 if c == "C1" else 0.0) + 0.5 / len(empty) for c in empty})
    # O to move (X at A1, B1; O at B2) facing X's threat at C1, with no line of its own to
    # complete: 0.4 on the block, 0.6 spread over the six empty cells.
    state = state_after("A1", "B2", "B1")
    empty = ["C1", "A2", "C2", "A3", "B3", "C3"]
    assert state.current_player() == 1 and sorted(cell_name(a) for a in state.legal_actions()) == sorted(empty)
    assert winning_cells({"A1", "B1"}, empty) == ["C1"] and winning_cells({"B2"}, empty) == []
    probs = beginner.action_probabilities(state, 1)
    assert probs == pytest.approx({CELL[c]: (0.4 if c == "C1" else 0.0) + 0.6 / len(empty) for c in empty})
    # Both a win and a threat: the win first (0.5), then the block (0.5 * 0.4), the rest uniform.
    state = state_after("A1", "A2", "B1", "B2")  # X: A1 B1 (threat C1); O: A2 B2 (threat C2); X to move
    probs = beginner.action_probabilities(state, 0)
    rest = 0.5 * 0.6 / 5
    assert probs[2] == pytest.approx(0.5 + rest) and probs[5] == pytest.approx(0.5 * 0.4 + rest)
    assert sum(probs.values()) == pytest.approx(1.0) and set(probs) == set(state.legal_actions())


def test_the_beginner_checks_its_probabilities():
    with pytest.raises(ValueError, match="p_win and p_block must be in"):
        make("tic_tac_toe", "beginner", p_win=1.5)
