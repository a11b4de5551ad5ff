"""Comments as documentation: what a field of the typed settings (:mod:`mage.config.sections`) or a
key of a ``params/`` file says about itself, for :mod:`mage.settings.reference`.

Both are read as text: a module's source with :mod:`tokenize` and :mod:`ast`, a YAML file
line by line. Nothing is imported from a config file or run.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import io
import re
import sys
import tokenize
from pathlib import Path


def plain_text(text: str) -> str:
    """Docstring markup (``code``, :role:`target`) as Markdown code spans, on one line."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    return " ".join(text.replace("\\ ", "").split())


@functools.cache
def _module_comments(module: str) -> tuple[ast.Module, dict[int, str], tuple[str, ...]]:
    source = Path(sys.modules[module].__file__).read_text()
    comments = {token.start[0]: token.string.lstrip("#").strip()
                for token in tokenize.generate_tokens(io.StringIO(source).readline) if token.type == tokenize.COMMENT}
    return ast.parse(source), comments, tuple(source.splitlines())


def _class_node(kind: type) -> ast.ClassDef | None:
    tree, _, _ = _module_comments(kind.__module__)
    return next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == kind.__name__), None)


def field_comments(kind: type) -> dict[str, str]:
    """The comment of each field of a section, from its source: the comment lines right
    above the field and the comment at the end of its line."""
    found: dict[str, str] = {}
    for cls in reversed(kind.__mro__):  # a parent's fields first, a child's replace them
        node = _class_node(cls) if dataclasses.is_dataclass(cls) else None
        if node is None:
            continue
        _, comments, lines = _module_comments(cls.__module__)
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            above, number = [], item.lineno - 1
            while number >= 1 and lines[number - 1].strip().startswith("#"):
                above.insert(0, comments.get(number, ""))
                number -= 1
            inline = [comments[n] for n in range(item.lineno, item.end_lineno + 1) if n in comments]
            found[item.target.id] = plain_text(" ".join(above + inline))
    return found


def class_doc(kind: type) -> str:
    node = _class_node(kind)
    return plain_text(ast.get_docstring(node) or "") if node is not None else ""


def yaml_comments(text: str, prefix: str = "") -> dict[str, str]:
    """The comment at the end of each block-mapping key's line of a YAML text, by dotted key
    (under ``prefix``); a comment-only line in the same column continues it."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    last: tuple[str, int] | None = None  # (key, column of its comment)
    for line in text.splitlines():
        match = re.match(r"^(\s*)([A-Za-z_][\w-]*)\s*:(.*)$", line)
        if match is None:
            column = line.find("#")
            if last and line.strip().startswith("#") and column == last[1]:
                found[last[0]] += " " + line.strip().lstrip("#").strip()
            else:
                last = None
            continue
        indent, key, rest = len(match[1]), match[2], match[3]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        dotted = ".".join(part for part in (prefix, *(k for _, k in stack)) if part)
        start = _comment_start(rest)
        last = None
        if start is not None:
            found[dotted] = rest[start + 1:].strip()
            last = (dotted, len(line) - len(rest) + start)
    return found


def _comment_start(text: str) -> int | None:
    quote = None
    for index, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or text[index - 1].isspace()):
            return index
    return None


def header_comment(text: str) -> list[str]:
    """The comment lines a YAML file opens with (Hydra's ``@package`` line left out), as
    Markdown: a paragraph, and a list item for each line that starts with ``- ``."""
    blocks: list[str] = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        words = line.lstrip("#").strip()
        if line.startswith("# @package") or not words:
            continue
        if words.startswith("- ") or not blocks:
            blocks.append(words)
        else:
            blocks[-1] += " " + words
    return [(" ".join(block.split())) for block in blocks]


def is_global(text: str) -> bool:
    return any(line.strip() == "# @package _global_" for line in text.splitlines()[:3])
