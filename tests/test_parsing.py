"""The text protocol's parsers: exact behaviour on examples, and never raising on any string."""

from __future__ import annotations

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from mage.protocol.parsing import MAX_PARSE_CHARS, extract_tag, parse_action, parse_remark

KUHN_OPEN = {"check": 0, "bet": 1, "pass": 0}
SOKOBAN = {"up": 0, "down": 1, "left": 2, "right": 3}
TTT = {"a1": 0, "b1": 1, "c1": 2, "a2": 3, "b2": 4, "c2": 5, "a3": 6, "b3": 7, "c3": 8}


def test_first_action_tag_counts():
    parsed = parse_action("<action>bet</action> then <action>check</action>", KUHN_OPEN)
    assert parsed.valid and parsed.actions == (1,)


def test_case_quotes_and_punctuation_are_ignored():
    assert parse_action('Reasoning... <ACTION> "Check." </ACTION>', KUHN_OPEN).actions == (0,)
    assert parse_action("<action>B2</action>", TTT).actions == (4,)


def test_invalid_replies_say_why():
    assert parse_action("I will bet", KUHN_OPEN).reason == "no <action> tag"
    assert parse_action("<action>bet", KUHN_OPEN).reason == "unclosed <action> tag"
    assert parse_action("<action><action>bet</action></action>", KUHN_OPEN).reason == "nested <action> tag"
    assert parse_action("<action>  </action>", KUHN_OPEN).reason == "empty <action> tag"
    assert parse_action("<action>raise</action>", KUHN_OPEN).reason == "'raise' is not a legal action"
    long = parse_action("<action>" + "x" * 500 + "</action>", KUHN_OPEN).reason
    assert long is not None and len(long) < 80  # the reason quotes a bounded excerpt


def test_thinking_is_not_parsed():
    reply = "<think>maybe <action>bet</action>? no.</think><action>check</action>"
    assert parse_action(reply, KUHN_OPEN).actions == (0,)
    # Thinking whose opening tag was in the prompt ends at a stray </think>.
    assert parse_action("hmm <action>bet</action></think> <action>check</action>", KUHN_OPEN).actions == (0,)
    # A reply cut off while thinking has no action.
    assert not parse_action("<think>let me see <action>bet</action>", KUHN_OPEN).valid


def test_sokoban_takes_up_to_three_moves():
    assert parse_action("<action>up, left,left</action>", SOKOBAN, max_moves=3).actions == (0, 2, 2)
    assert parse_action("<action>Right</action>", SOKOBAN, max_moves=3).actions == (3,)
    assert parse_action("<action>up down left right</action>", SOKOBAN, max_moves=3).reason == (
        "4 moves given, at most 3 allowed"
    )
    assert parse_action("<action>up, jump</action>", SOKOBAN, max_moves=3).reason == "'jump' is not a legal move"


def test_remark():
    assert parse_remark("ok <remark> Bet with K. </remark>").text == "Bet with K."
    missing = parse_remark("I should bet more")
    assert missing.text == "" and missing.reason == "no <remark> tag" and not missing.valid
    assert parse_remark("<remark></remark>").reason == "empty <remark> tag"
    assert parse_remark("<remark>unfinished").reason == "unclosed <remark> tag"


def test_extract_tag_non_string_input():
    assert extract_tag(None, "action").reason == "reply is not text"  # type: ignore[arg-type]


TAGGY = st.sampled_from(
    ["<action>", "</action>", "<remark>", "</remark>", "<think>", "</think>", "<", ">", "/", "bet", "up", ",", " "]
)
NOISE = st.one_of(st.text(), st.lists(TAGGY, max_size=30).map("".join))


@settings(max_examples=400, deadline=None)
@given(reply=NOISE, max_moves=st.integers(1, 3))
@example(reply="<action>" * 10_000, max_moves=1)
@example(reply="</action><action>bet</action>", max_moves=1)
@example(reply="\x00<action>\udcff</action>", max_moves=3)
def test_parse_action_never_raises_and_returns_legal_moves(reply, max_moves):
    aliases = SOKOBAN if max_moves > 1 else KUHN_OPEN
    parsed = parse_action(reply, aliases, max_moves=max_moves)
    assert parsed.valid == (parsed.reason is None)
    if parsed.valid:
        assert 1 <= len(parsed.actions) <= max_moves
        assert set(parsed.actions) <= set(aliases.values())
    else:
        assert parsed.actions == ()
        assert isinstance(parsed.reason, str)


@settings(max_examples=300, deadline=None)
@given(prefix=st.text(), name=st.sampled_from(sorted(TTT)), suffix=st.text())
def test_a_well_formed_tag_is_found_after_any_tag_free_prefix(prefix, name, suffix):
    prefix = prefix.replace("<", "")  # no tag may open before ours
    # a stray </think> after it makes everything before it thinking (the template opened it)
    assume("</think>" not in suffix.lower())
    parsed = parse_action(f"{prefix}<action>{name.upper()}</action>{suffix}", TTT)
    assert parsed.actions == (TTT[name],)


#: Characters whose lower case has another length ("İ" lowers to "i" + a combining dot), and
#: look-alikes of the tags' letters that Unicode case folding would equate with ASCII ones.
TRICKY = st.sampled_from(["İ", "ı", "ſ", "K", "ß", "ẞ", "Σ", "ς", "ﬁ", "<", "/"])
TRICKY_TEXT = st.lists(st.one_of(TRICKY, st.characters()), max_size=20).map("".join)


def test_lower_casing_that_changes_length_does_not_shift_the_tag():
    # "İ".lower() has two characters: positions found in a lowered copy were off by one.
    assert parse_action("İ<action>bet</action>", KUHN_OPEN).actions == (1,)
    assert parse_remark("İİİ<remark>Bet with K.</remark>").text == "Bet with K."
    assert parse_action("<think>İİ</think>İ<action>check</action>", KUHN_OPEN).actions == (0,)
    # Tags are ASCII: a Kelvin sign is not a k, a dotless ı is not an i.
    assert parse_action("<actıon>bet</actıon>", KUHN_OPEN).reason == "no <action> tag"


@settings(max_examples=400, deadline=None)
@given(prefix=TRICKY_TEXT, name=st.sampled_from(sorted(TTT)), remark=TRICKY_TEXT, suffix=TRICKY_TEXT)
def test_tags_are_found_exactly_after_any_text(prefix, name, remark, suffix):
    prefix = prefix.replace("<", "")  # no tag may open before ours
    # a stray </think> after it makes everything before it thinking (the template opened it)
    assume("</think>" not in suffix.lower())
    parsed = parse_action(f"{prefix}<action>{name.upper()}</action>{suffix}", TTT)
    assert parsed.actions == (TTT[name],) and parsed.text == name.upper()
    remark = remark.replace("<", "")
    reflected = parse_remark(f"{prefix}<REMARK>{remark}</remark>{suffix}")
    assert reflected.text == remark.strip() and reflected.valid == bool(remark.strip())


@settings(max_examples=200, deadline=None)
@given(reply=NOISE)
def test_parse_remark_never_raises(reply):
    remark = parse_remark(reply)
    assert remark.valid == bool(remark.text)


def test_huge_input_is_bounded():
    reply = "a" * (MAX_PARSE_CHARS * 3) + "<action>bet</action>"
    assert parse_action(reply, KUHN_OPEN).reason == "no <action> tag"  # beyond the parsed window
    assert parse_action("<action>bet</action>" + "z" * (MAX_PARSE_CHARS * 3), KUHN_OPEN).actions == (1,)


# -- exactly the documented replies are legal (issue: Unicode letters folding into moves) ----
#: The documented rule, written again here from mage/protocol/parsing.py's docstring, as a
#: second implementation: ASCII letters lower-cased, ASCII quotes/punctuation/white space
#: stripped around, ASCII white space runs inside made one space; moves separated by commas
#: and/or ASCII white space; nothing outside ASCII changed.
ASCII_SPACE = " \t\r\n\x0b\x0c"
STRIPPED = ASCII_SPACE + "\"'`.!?:*()[]{}"


def documented(content: str, aliases: dict[str, int], max_moves: int) -> tuple[int, ...] | None:
    lowered = "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in content)
    core = lowered.strip(STRIPPED)
    words, word = [], ""
    for c in core:  # split on runs of ASCII white space
        if c in ASCII_SPACE:
            if word:
                words.append(word)
            word = ""
        else:
            word += c
    if word:
        words.append(word)
    whole = " ".join(words)
    if whole in aliases:
        return (aliases[whole],)
    if max_moves == 1:
        return None
    moves = [m.strip(STRIPPED) for m in "".join(" " if c == "," else c for c in whole).split(" ")]
    moves = [m for m in moves if m]
    if not 1 <= len(moves) <= max_moves or any(m not in aliases for m in moves):
        return None
    return tuple(aliases[m] for m in moves)


#: Look-alikes of the letters of every game's spellings: compatibility and case-folding
#: variants outside ASCII (Kelvin sign, long s, dotless i, fullwidth and mathematical letters,
#: ligatures), invisible characters and non-ASCII spaces.
LOOKALIKES = ["\u212a", "\u017f", "\u0131", "\u0130", "\uff43", "\uff25", "\U0001d41c", "\ufb00", "\u00a0", "\u2003",
              "\u200b", "\u202e", "\u3000", "\u1e9e", "\u00df"]
SPELLING_PARTS = st.sampled_from(["c", "h", "e", "k", "b", "t", "u", "p", "l", "f", "r", "i", "g", "d", "o", "w", "n",
                                  "s", "a", "1", "2", "3", "C", "K", "B", ",", " ", "\t", ".", "'", *LOOKALIKES])
CONTENT = st.one_of(st.text(max_size=30), st.lists(SPELLING_PARTS, max_size=24).map("".join),
                    st.sampled_from(sorted(KUHN_OPEN) + sorted(SOKOBAN) + sorted(TTT)).flatmap(
                        lambda word: st.lists(st.sampled_from(list(word) + LOOKALIKES), min_size=1, max_size=8)
                        .map("".join)))


@settings(max_examples=500, deadline=None)
@given(content=CONTENT, game=st.sampled_from([(KUHN_OPEN, 1), (TTT, 1), (SOKOBAN, 3)]))
@example(content="chec\u212a", game=(KUHN_OPEN, 1))
@example(content="\uff43heck", game=(KUHN_OPEN, 1))
@example(content="check\u00a0", game=(KUHN_OPEN, 1))
@example(content="up>left", game=(SOKOBAN, 3))
@example(content="up;left|down", game=(SOKOBAN, 3))
def test_the_replies_that_parse_as_legal_are_exactly_the_documented_ones(content, game):
    aliases, max_moves = game
    assume("<" not in content)  # the tag's own rules are tested above
    parsed = parse_action(f"<action>{content}</action>", aliases, max_moves=max_moves)
    expected = documented(content, aliases, max_moves)
    assert (parsed.actions if parsed.valid else None) == expected
    if parsed.valid:  # whatever is legal is ASCII around its spellings: no letter outside ASCII got in
        assert all(ord(c) < 128 for c in content)


def test_letters_outside_ascii_never_become_moves():
    assert not parse_action("<action>chec\u212a</action>", KUHN_OPEN).valid  # Kelvin sign: 'K'.lower() == 'k'
    assert not parse_action("<action>\uff42et</action>", KUHN_OPEN).valid  # fullwidth b
    assert not parse_action("<action>pa\u017fs</action>", KUHN_OPEN).valid  # long s casefolds to s
    assert not parse_action("<action>A\u0131</action>", TTT).valid
    assert not parse_action("<action>up,\u00a0left</action>", SOKOBAN, max_moves=3).valid


def test_sokoban_moves_are_separated_by_commas_and_spaces_only():
    assert parse_action("<action>up,left  down</action>", SOKOBAN, max_moves=3).actions == (0, 2, 1)
    for separator in (">", "/", "-", ";", "|", "->"):
        parsed = parse_action(f"<action>up{separator}left</action>", SOKOBAN, max_moves=3)
        assert not parsed.valid, separator


@settings(max_examples=500, deadline=None)
@given(content=st.text(max_size=60), max_moves=st.integers(1, 3))
@example(content="x\u202ey\x00z\u2028\x1b[31m", max_moves=1)
def test_a_reason_quotes_no_control_character(content, max_moves):
    import unicodedata

    reason = parse_action(f"<action>{content}</action>", SOKOBAN if max_moves > 1 else KUHN_OPEN,
                          max_moves=max_moves).reason
    if reason is not None:
        assert not [c for c in reason if unicodedata.category(c)[0] == "C" or (unicodedata.category(c)[0] == "Z"
                                                                            and c != " ")], reason


def test_every_game_s_spellings_are_ascii():
    """The rule above relies on it: a spelling outside ASCII could never be matched. (Every
    seat and a few starts; an opponent's first move is made, where it moves first, by the
    game's default opponent.)"""
    from mage.games import make_game
    from mage.opponents import REGISTRY, make

    for name in ("kuhn_poker", "tic_tac_toe", "sokoban"):
        game = make_game(name)
        for seed in range(4):
            for seat in (0, 1) if name != "sokoban" else (0,):
                opponent = make(name, sorted(REGISTRY[name])[0])
                episode = game.new_episode(game.initial_state(seed, agent_seat=seat), opponent)
                spellings = episode.action_aliases()
                assert spellings and all(word.isascii() for word in spellings), (name, spellings)
