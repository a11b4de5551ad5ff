"""Parsing of model replies: ``<action>...</action>`` and ``<remark>...</remark>``.

Model output is untrusted input. Every function here takes any string (empty, huge,
binary-looking, with nested or unclosed tags) and returns a result; none of them raises
or evaluates anything. Rules (docs/method.md, The meta-episode):

* Completed ``<think>...</think>`` blocks are removed first (Qwen3 thinking may quote
  tags while deliberating); an unclosed ``<think>`` swallows the rest of the reply.
* The first ``<action>`` tag counts; its content runs to the first ``</action>`` after it.
  Nested opening tags inside it, an unclosed tag, or no tag at all make the reply invalid.
* The content is matched against the legal actions' accepted spellings, which are ASCII, in
  ASCII only (:func:`normalise`): its ASCII letters are lower-cased, ASCII quotes,
  punctuation and white space around it are dropped, and runs of ASCII white space inside it
  become one space. Nothing else is changed, so a character outside ASCII (the Kelvin sign,
  a full-width letter, a no-break space) matches no spelling: no Unicode case folding or
  compatibility mapping can turn an invalid reply into a legal move. Games with several moves
  per turn (Sokoban: up to 3) take a list separated by commas, ASCII white space, or both
  (``up, left left``); no other separator.
* A reason quotes model output with control and format characters escaped (``\\u202e``):
  reasons go into tables and logs.
* A reflection is the content of the first ``<remark>`` tag; a missing or empty one gives
  an empty reflection and counts as invalid.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass

# Replies longer than this are cut before parsing: no legitimate reply is this long, and
# it bounds the work a pathological string can cause.
MAX_PARSE_CHARS = 200_000
_SHOWN_CHARS = 40  # how much of a bad action string an error reason quotes

#: The closing tag that ends a reply, per phase (every backend stops there).
PHASE_STOP_STRINGS: dict[str, tuple[str, ...]] = {"play": ("</action>",), "reflect": ("</remark>",)}
STOP_STRINGS = tuple(s for stops in PHASE_STOP_STRINGS.values() for s in stops)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# Tags are ASCII: matched case-insensitively in ASCII only, on the text itself. (Lower-casing
# the text first and using its positions on the original is wrong wherever lower-casing
# changes a length: "İ".lower() is two characters.)
_TAG_FLAGS = re.IGNORECASE | re.ASCII
_THINK_BLOCK = re.compile(r"<think>.*?(?:</think>|\Z)", _TAG_FLAGS | re.DOTALL)
_THINK_CLOSE = re.compile(re.escape("</think>"), _TAG_FLAGS)
_TAGS = {tag: (re.compile(re.escape(f"<{tag}>"), _TAG_FLAGS), re.compile(re.escape(f"</{tag}>"), _TAG_FLAGS))
         for tag in ("action", "remark", "think")}
_MOVE_SEPARATORS = re.compile(r"[ \t\r\n\f\v,]+")
_ASCII_SPACE = re.compile(r"[ \t\r\n\f\v]+")
_STRIP_CHARS = " \t\r\n\f\v\"'`.!?:*()[]{}"
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class TagContent:
    """Content of the first ``<tag>...</tag>``; ``content`` is None when ``reason`` says why."""

    content: str | None
    reason: str | None


@dataclass(frozen=True)
class ParsedAction:
    """A parsed action: the move(s) to apply, or the reason the reply is invalid."""

    actions: tuple[int, ...]
    text: str | None  # the tag's content as the model wrote it (None: no usable tag)
    reason: str | None  # None when valid

    @property
    def valid(self) -> bool:
        return self.reason is None


@dataclass(frozen=True)
class ParsedRemark:
    """A parsed reflection; ``text`` is empty when it is missing or invalid."""

    text: str
    reason: str | None

    @property
    def valid(self) -> bool:
        return self.reason is None


def strip_thinking(response: str) -> str:
    """Remove ``<think>...</think>`` blocks, an unclosed trailing one, and thinking whose
    opening tag was part of the prompt (text up to a stray ``</think>``)."""
    text = _THINK_BLOCK.sub(" ", response)
    stray = None
    for stray in _THINK_CLOSE.finditer(text):
        pass
    return text[stray.end():] if stray is not None else text


def extract_tag(response: str, tag: str) -> TagContent:
    """Content of the first ``<tag>`` up to the next ``</tag>``, thinking removed."""
    if not isinstance(response, str):
        return TagContent(None, "reply is not text")
    text = strip_thinking(response[:MAX_PARSE_CHARS])
    if tag in _TAGS:
        opening, closing = _TAGS[tag]
    else:
        opening, closing = (re.compile(re.escape(t), _TAG_FLAGS) for t in (f"<{tag}>", f"</{tag}>"))
    start = opening.search(text)
    if start is None:
        return TagContent(None, f"no <{tag}> tag")
    end = closing.search(text, start.end())
    if end is None:
        return TagContent(None, f"unclosed <{tag}> tag")
    if opening.search(text, start.end(), end.start()) is not None:
        return TagContent(None, f"nested <{tag}> tag")
    return TagContent(text[start.end():end.start()], None)


def normalise(text: str) -> str:
    """ASCII letters lower-cased, outer ASCII quotes/punctuation/white space removed, inner runs
    of ASCII white space made one space; every other character kept as it is."""
    return _ASCII_SPACE.sub(" ", text.strip(_STRIP_CHARS).translate(_ASCII_LOWER))


def _invisible(c: str) -> bool:
    category = unicodedata.category(c)
    return category[0] == "C" or (category[0] == "Z" and c != " ")


def escaped(text: str) -> str:
    """``text`` with control, format, unassigned and separator characters other than the ASCII
    space (Unicode categories C* and Z*) written as ``\\uXXXX``: safe in a table cell or a log
    line, and a no-break space is not taken for a space."""
    return "".join(c if not _invisible(c) else f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
                   for c in text)


def _shown(text: str) -> str:
    text = _ASCII_SPACE.sub(" ", text.strip(" \t\r\n\f\v"))
    return escaped(text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "...")


def parse_action(response: str, aliases: Mapping[str, int], max_moves: int = 1) -> ParsedAction:
    """Parse the first ``<action>`` of ``response`` against ``aliases`` (spelling -> id).

    With ``max_moves == 1`` the whole content must name one action. With more, the content
    is a list of 1..max_moves actions separated by commas or ASCII white space.
    """
    found = extract_tag(response, "action")
    if found.content is None:
        return ParsedAction((), None, found.reason)
    raw = found.content
    whole = normalise(raw)
    if not whole:
        return ParsedAction((), raw, "empty <action> tag")
    if whole in aliases:
        return ParsedAction((aliases[whole],), raw, None)
    if max_moves == 1:
        return ParsedAction((), raw, f"'{_shown(raw)}' is not a legal action")
    tokens = [normalise(t) for t in _MOVE_SEPARATORS.split(whole)]
    tokens = [t for t in tokens if t]
    if not tokens:
        return ParsedAction((), raw, "empty <action> tag")
    if len(tokens) > max_moves:
        return ParsedAction((), raw, f"{len(tokens)} moves given, at most {max_moves} allowed")
    unknown = [t for t in tokens if t not in aliases]
    if unknown:
        return ParsedAction((), raw, f"'{_shown(unknown[0])}' is not a legal move")
    return ParsedAction(tuple(aliases[t] for t in tokens), raw, None)


def parse_remark(response: str) -> ParsedRemark:
    """Parse the reflection in the first ``<remark>`` tag."""
    found = extract_tag(response, "remark")
    if found.content is None:
        return ParsedRemark("", found.reason)
    text = found.content.strip()
    if not text:
        return ParsedRemark("", "empty <remark> tag")
    return ParsedRemark(text, None)
