"""The docs against the repository and the code: README.md and every docs/**/*.md.

- every relative link resolves to a file of the repository, and its #anchor to a heading there;
- nothing points outside the repository;
- every path shown in code (`mage/preflight/placement.py`, `params/model_game/tiny/<game>.yaml`) exists;
- every command shown (`python -m flows ...`, `python -m mage ...`, `bash scripts/...`,
  `dvc ...`, `pytest ...`, `python benchmarks/...`, `python experiments/...`) runs where it is cheap (`--help`,
  `python -m mage config`, `python -m mage plan`), and otherwise names options that exist: its
  command line parser accepts it, its Hydra overrides compose with `mage.settings.load_settings`,
  the scripts and files it names exist. A transcript of a `config error:` shows the error the
  settings give;
- every section cited by name, in the docs and in the code, params, tests, benchmarks,
  experiments and scripts (`docs/gpu.md, "The memory plan"`, `BENCHMARKS.md, "Flow overhead"`,
  `docs/method.md, The metrics`), is a heading of the page it names.

A failure names the doc, the line and what is wrong. Placeholders (`<head>`, `DIR`, `N`, `...`)
stand for any value: the option or key they are given to must exist, the value is not checked.
"""

from __future__ import annotations

import bisect
import functools
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]

#: What a doc may not contain: places outside the repository.
OUTSIDE = re.compile(r"\.\./shared|MAGE-SPEC|(?<![\w.~-])/(?:work|tmp)(?![\w-])")
#: Root folders that hold what runs write (ignored by git): paths under them are not checked.
GENERATED = {"artifacts", ".venv", ".git"}
#: A placeholder in a command or a path: <anything>, ..., or an upper-case word such as DIR or N.
ANGLE = re.compile(r"<[^<>`]*>")
PLACEHOLDER = "PLACEHOLDER"


def is_placeholder(token: str) -> bool:
    return PLACEHOLDER in token or "..." in token or re.fullmatch(r"[A-Z][A-Z_]*", token) is not None


# --- reading a doc -------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """A piece of a doc: prose (code spans removed), a code span, or a line of a fenced block."""

    line: int
    text: str
    kind: str  # "prose", "code" (an inline code span) or "block:<language>"


def spans(doc: Path) -> list[Span]:
    """The doc's prose paragraphs, inline code spans and fenced code lines, each with its line."""
    found: list[Span] = []
    paragraph: list[tuple[int, str]] = []

    def flush() -> None:
        if not paragraph:
            return
        start, text = paragraph[0][0], "\n".join(line for _, line in paragraph)
        for match in re.finditer(r"(`+)(.+?)\1", text, flags=re.DOTALL):
            found.append(Span(start + text.count("\n", 0, match.start()), match.group(2).replace("\n", " ").strip(),
                              "code"))
        prose = re.sub(r"(`+)(.+?)\1", " ", text, flags=re.DOTALL)
        for number, line in enumerate(prose.split("\n")):
            found.append(Span(start + number, line, "prose"))
        paragraph.clear()

    fence: str | None = None
    language = ""
    for number, line in enumerate(doc.read_text().splitlines(), start=1):
        stripped = line.strip()
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            else:
                found.append(Span(number, line, f"block:{language}"))
            continue
        opening = re.match(r"(```+|~~~+)\s*(\S*)", stripped)
        if opening:
            flush()
            fence, language = opening.group(1), opening.group(2).lower()
        elif not stripped:
            flush()
        else:
            paragraph.append((number, line))
    flush()
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@functools.cache
def anchors(doc: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    result = set()
    in_fence = False
    for line in doc.read_text().splitlines():
        if re.match(r"\s*(```|~~~)", line):
            in_fence = not in_fence
            continue
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading and not in_fence:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f"{base}-{count}")
    return frozenset(result)


def where(doc: Path, line: int) -> str:
    return f"{doc.relative_to(REPO)}:{line}"


def in_repository(path: Path) -> bool:
    """Whether ``path``, as written (``..`` folded, links not followed), stays in the repository."""
    return Path(os.path.normpath(path)).is_relative_to(REPO)


# --- links and paths -----------------------------------------------------------------------

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)")


def check_link(doc: Path, line: int, target: str) -> list[str]:
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
        return []
    path_text, _, anchor = target.partition("#")
    path = (doc.parent / path_text) if path_text else doc
    if path_text.startswith("/") or not in_repository(path):
        return [f"{where(doc, line)}: the link {target!r} points outside the repository"]
    if not path.exists():
        return [f"{where(doc, line)}: the link {target!r} names {path.relative_to(REPO)}, which does not exist"]
    if anchor and path.suffix == ".md" and anchor not in anchors(path):
        known = ", ".join(sorted(anchors(path)))
        return [f"{where(doc, line)}: the link {target!r}: {path.relative_to(REPO)} has no heading #{anchor} (its anchors: {known})"]
    return []


def links(doc: Path) -> list[tuple[int, str]]:
    found = []
    for span in spans(doc):
        if span.kind != "prose":
            continue
        found += [(span.line, match.group(1)) for match in LINK.finditer(span.text)]
        reference = REFERENCE.match(span.text)
        if reference:
            found.append((span.line, reference.group(1)))
    return found


def named_path(text: str) -> str | None:
    """The repository path a code span names (`mage/preflight/memory_plan.py`, `docs/gpu.md#the-memory-plan`,
    `BENCHMARKS.md`), else None: the first folder must be one of the repository's own."""
    if re.search(r"\s", text) or "://" in text or text.startswith(("~", "-", "$", "/")):
        return None
    path = text.partition("#")[0]
    first, slash, _ = path.partition("/")
    if slash and first not in GENERATED and (REPO / first).is_dir():
        return text
    if not slash and re.fullmatch(r"[A-Z][A-Z_-]*\.md", path):  # README.md, BENCHMARKS.md
        return text
    return None


def check_named_path(doc: Path, line: int, text: str) -> list[str]:
    if "..." in text:
        return []
    path_text, _, anchor = text.partition("#")
    pattern = ANGLE.sub("*", path_text).rstrip("/")
    matches = list(REPO.glob(pattern)) if "*" in pattern else [REPO / pattern] if (REPO / pattern).exists() else []
    if not matches:
        return [f"{where(doc, line)}: `{text}` names a path that does not exist in the repository"]
    if anchor and pattern.endswith(".md") and anchor not in anchors(matches[0]):
        return [f"{where(doc, line)}: `{text}`: {pattern} has no heading #{anchor}"]
    return []


# --- commands ------------------------------------------------------------------------------

#: Programs whose commands are checked; others (prefect, ray, export) are not.
PROGRAMS = ("python -m flows.deploy", "python -m flows", "python -m mage", "python -m pytest", "pytest", "dvc",
            "bash scripts/", "scripts/", "python benchmarks/", "python experiments/", "python scripts/")


@dataclass(frozen=True)
class Command:
    doc: Path
    line: int
    text: str
    argv: tuple[str, ...]
    error_shown: str | None = None  # a transcript's `config error:` line

    def at(self) -> str:
        return f"{where(self.doc, self.line)}: `{self.text}`"


def parse_command(text: str) -> tuple[str, ...] | None:
    """The command's words, environment assignments dropped and placeholders made one word;
    None where it is not a command of :data:`PROGRAMS`."""
    text = ANGLE.sub(PLACEHOLDER, text.strip().removeprefix("$ "))
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return None
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words.pop(0)
    joined = " ".join(words)
    if not any(joined.startswith(program) and len(joined) > len(program) if program.endswith("/")
               else joined == program or joined.startswith(program + " ") for program in PROGRAMS):
        return None
    return tuple(words)


def commands(doc: Path) -> list[Command]:
    found: list[Command] = []
    pending: list[tuple[int, str]] = []
    all_spans = spans(doc)
    for index, span in enumerate(all_spans):
        if span.kind == "code":
            argv = parse_command(span.text)
            if argv:
                found.append(Command(doc, span.line, span.text, argv))
        elif span.kind in ("block:", "block:bash", "block:sh", "block:shell", "block:console"):
            text = span.text.rstrip()
            if text.endswith("\\"):
                pending.append((span.line, text[:-1]))
                continue
            start = pending[0][0] if pending else span.line
            whole = " ".join([*(part for _, part in pending), text])
            pending.clear()
            argv = parse_command(whole)
            if not argv:
                continue
            following = all_spans[index + 1] if index + 1 < len(all_spans) else None
            shown = None
            if whole.lstrip().startswith("$ ") and following and following.kind == span.kind \
                    and following.text.strip().startswith("config error:"):
                shown = following.text.strip()
            found.append(Command(doc, start, whole.strip(), argv, shown))
    return found


class Parsed(Exception):
    """Raised in place of loading the settings: the command line parser accepted the command."""

    def __init__(self, overrides):
        super().__init__()
        self.overrides = list(overrides or [])


@dataclass(frozen=True)
class Fixtures:
    """What a command's check uses of pytest: patching, a scratch folder, the captured output
    (read through capsys, not a redirection of sys.stderr: see :func:`command_lines`)."""

    monkeypatch: pytest.MonkeyPatch
    tmp_path: Path
    capsys: pytest.CaptureFixture

    def said(self) -> str:
        """The last line written to stderr since the last call."""
        lines = self.capsys.readouterr().err.strip().splitlines()
        return lines[-1] if lines else ""


def parses(main, argv: list[str], fixtures: Fixtures, module) -> tuple[list[str] | None, str]:
    """Run a command line's ``main`` until it would load the settings: (its overrides, '') where
    its parser accepts ``argv``, else (None, what the parser said)."""
    def stop(overrides=(), config_file=None):
        raise Parsed(overrides)

    fixtures.said()
    with fixtures.monkeypatch.context() as patch:
        patch.setattr(module, "load_settings", stop)
        try:
            main(argv)
        except Parsed as parsed:
            return parsed.overrides, ""
        except SystemExit as exit:
            return None, fixtures.said() or f"exit status {exit.code}"
    return None, "the command ran past its parser without loading the settings"


@functools.cache
def composed(overrides: tuple[str, ...]):
    from mage.settings import load_settings

    return load_settings(list(overrides))


def check_overrides(overrides: list[str]) -> str | None:
    """None where every Hydra override names a real key or group option (a placeholder value:
    the key alone), else what is wrong."""
    from mage.settings import SettingsError

    overrides = [o for o in overrides if not (is_placeholder(o) and "=" not in o)]
    concrete = tuple(o for o in overrides if not is_placeholder(o.partition("=")[2]))
    try:
        settings = composed(concrete)
    except SettingsError as error:
        return f"its overrides {list(concrete)} do not compose: {error}"
    for override in overrides:
        key, equals, _ = override.partition("=")
        if not equals:
            return f"{override!r} is not a Hydra override (key=value)"
        if override in concrete:
            continue
        if override.startswith("+") or (REPO / "params" / key.lstrip("~")).is_dir():
            continue  # a key it adds, or a config group's option
        key = key.lstrip("~")
        node = settings.raw
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return f"{key!r} (given a placeholder) is not a key of the composed config"
            node = node[part]
    return None


@functools.cache
def pytest_help() -> str:
    return subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=True).stdout


@functools.cache
def markers() -> frozenset[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return frozenset(m.split(":")[0].strip() for m in config["tool"]["pytest"]["ini_options"]["markers"])


def check_pytest(args: list[str]) -> str | None:
    words = iter(args)
    for word in words:
        if word == "-m":
            expression = next(words, "")
            unknown = set(re.findall(r"\w+", expression)) - {"and", "or", "not"} - markers()
            if unknown:
                return f"-m {expression!r}: {sorted(unknown)} are not registered markers (pyproject.toml)"
        elif word.startswith("-"):
            option = word.split("=")[0]
            if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", pytest_help()):
                return f"pytest has no option {option}"
        elif ("/" in word or word.endswith(".py")) and not is_placeholder(word) \
                and not (REPO / word.split("::")[0]).exists():
            return f"{word} does not exist"
    return None


#: Parses dvc command lines in a process of its own: importing dvc wraps sys.stdout and
#: sys.stderr (colorama) and adds its logging handlers, which then outlive a test's capture.
DVC_PARSER = """
import contextlib, io, json, sys
from dvc.cli import DvcParserError, parse_args
results = []
for args in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parsed = parse_args(args)
        results.append({"set_param": list(getattr(parsed, "set_param", None) or [])})
    except (DvcParserError, SystemExit):
        lines = err.getvalue().strip().splitlines()
        results.append({"error": lines[-1] if lines else "a parser error"})
print(json.dumps(results))
"""
_dvc_parsed: dict[tuple[str, ...], dict] = {}


def dvc_arguments(command: tuple[str, ...]) -> list[str] | None:
    """The arguments the command gives dvc, if it runs dvc."""
    words = list(command)
    if words[:1] == ["dvc"]:
        return words[1:]
    if words[:2] == ["bash", "scripts/run.sh"] or words[:1] == ["scripts/run.sh"]:
        return ["exp", "run", *words[(2 if words[0] == "bash" else 1):]]
    return None


def dvc_parse(args: list[str]) -> dict:
    """dvc's parser on ``args``: {"set_param": [...]} or {"error": ...}. The first call parses
    every dvc command of the docs at once (one process)."""
    if tuple(args) not in _dvc_parsed:
        wanted = {tuple(args)} | {tuple(a) for doc in DOCS for c in commands(doc)
                                  if (a := dvc_arguments(c.argv)) is not None}
        wanted = sorted(wanted - _dvc_parsed.keys())
        done = subprocess.run([sys.executable, "-c", DVC_PARSER], input=json.dumps(wanted), cwd=REPO,
                              capture_output=True, text=True, timeout=300, check=True)
        _dvc_parsed.update(zip(wanted, json.loads(done.stdout), strict=True))
    return _dvc_parsed[tuple(args)]


def check_dvc(args: list[str]) -> str | None:
    if not args:
        return None
    parsed = dvc_parse(args)
    if "error" in parsed:
        return f"dvc does not accept it: {parsed['error']}"
    return check_overrides(parsed["set_param"])


def check_flags_in_source(args: list[str], *sources: Path) -> str | None:
    text = "".join(source.read_text() for source in sources if source.exists())
    for word in args:
        flag = word.split("=")[0]
        negated = "--" + flag.removeprefix("--no-")  # argparse.BooleanOptionalAction's --no-X
        if word.startswith("--") and f'"{flag}"' not in text \
                and not (flag.startswith("--no-") and f'"{negated}", action=argparse.BooleanOptionalAction' in text):
            return f"{word.split('=')[0]} is not an option of {', '.join(str(s.relative_to(REPO)) for s in sources)}"
    return None


def parsed_command_line(main, args: list[str], fixtures: Fixtures) -> tuple[list[str] | None, str | None]:
    """A ``python -m flows``/``mage`` command line as its own parser reads it: its overrides, or
    (None, None) where there is nothing to check (a placeholder, ``--help`` that exits 0), or
    (None, what is wrong)."""
    import mage.settings

    if not args or is_placeholder(args[0]):
        return None, None
    if args in (["--help"], ["-h"]):
        with pytest.raises(SystemExit) as exit:
            main(args)
        return None, None if exit.value.code == 0 else f"exit status {exit.value.code}"
    return parses(main, args, fixtures, mage.settings)


def check_command(command: Command, fixtures: Fixtures) -> str | None:
    """None where the command runs or names options that exist, else what is wrong."""
    argv = list(command.argv)
    if argv[:3] == ["python", "-m", "pytest"]:
        argv = ["pytest", *argv[3:]]
    if argv[:3] == ["python", "-m", "flows"]:
        import flows.__main__

        args = argv[3:]
        overrides, said = parsed_command_line(flows.__main__.main, args, fixtures)
        if overrides is None:
            return said and f"python -m flows does not accept it: {said}"
        if command.error_shown:
            return check_error_shown(command, overrides)
        return check_overrides(overrides)
    if argv[:3] == ["python", "-m", "flows.deploy"]:  # its parser is overrides and --limit N (importing it
        args = argv[3:]                                # imports every flow: read, not imported)
        return check_flags_in_source(args, REPO / "flows" / "deploy.py") or check_overrides(
            [a for a in args if not a.startswith("-") and not re.fullmatch(r"\d+", a)])
    if argv[:3] == ["python", "-m", "mage"]:
        import mage.__main__

        args = argv[3:]
        overrides, said = parsed_command_line(mage.__main__.main, args, fixtures)
        if overrides is None:
            return said and f"python -m mage does not accept it: {said}"
        problem = check_overrides(overrides)
        options = {a.split("=")[0] for a in args if a.startswith("-")}
        if problem or args[0] not in ("config", "plan") or any(is_placeholder(a) for a in args) \
                or not options <= {"--output", "--gpu-gib"}:
            return problem  # only parsed: it is not cheap, or it would write where a test may not
        # cheap: run it (--output goes to a temporary folder)
        args = [str(fixtures.tmp_path / "config.yaml") if previous == "--output" else a
                for previous, a in zip(["", *args[:-1]], args, strict=True)]
        fixtures.said()
        status = mage.__main__.main(args)
        return None if status == 0 else f"exit status {status}: {fixtures.said()}"
    if argv[0] == "pytest":
        return check_pytest(argv[1:])
    if argv[0] == "dvc":
        return check_dvc(argv[1:])
    if argv[0] in ("bash", "python") or argv[0].startswith("scripts/"):
        words = argv[1:] if argv[0] in ("bash", "python") else argv
        script, args = REPO / words[0], words[1:]
        if not script.is_file():
            return f"{words[0]} does not exist"
        if script.name == "run.sh":
            return check_dvc(["exp", "run", *args])
        if script.name == "test.sh":
            return check_pytest(args)
        if script.suffix == ".sh":
            return check_flags_in_source(args, script, script.with_suffix(".py"))
        return check_flags_in_source(args, script)
    return None


def check_error_shown(command: Command, overrides: list[str]) -> str | None:
    """A transcript's `config error:` line is the one the settings give for its overrides."""
    from mage.settings import SettingsError, load_settings

    try:
        load_settings(overrides)
    except SettingsError as error:
        given = f"config error: {error}"
        return None if given == command.error_shown else f"the settings now say {given!r}, not what is shown"
    return "the shown config error does not happen: the overrides compose"


# --- sections cited by name ----------------------------------------------------------------

#: Where sections of a page are cited by name: the code, params, tests, benchmarks, experiments,
#: scripts and the docs themselves.
CITING_FOLDERS = ("mage", "tasks", "flows", "params", "tests", "benchmarks", "experiments", "scripts")
CITING_SUFFIXES = (".py", ".yaml", ".yml", ".sh", ".md")

#: A page named in the text: README or BENCHMARKS (with or without .md) or a page under docs/,
#: in backticks or not (not README's, a possessive).
_PAGE = r"(?<![\w/.-])`?(?P<page>README(?:\.md)?|BENCHMARKS(?:\.md)?|docs/[\w/-]+\.md)`?(?!['\u2019]s\b)"
#: A Markdown link to a page: a citation of the linked page.
_LINKED = r"\[[^\]\n]*\]\((?P<link>[^)#\s]+\.md)(?:#[^)\s]*)?\)"
#: The section in quotes after a comma, a colon or a space: "...", '...' or \"...\" (in an
#: f-string); it starts with a letter or a backtick.
_QUOTED = (r"(?:\s*[,:]\s*|\s+)(?:\\?\"(?P<double>[A-Za-z`][^\"\\\n]*)\\?\"|'(?P<single>[A-Za-z`][^'\n]*)'"
           r"|\u201c(?P<curly>[^\u201d\n]+)\u201d)")
#: (README, "Two commands"), BENCHMARKS.md "Flow overhead", [results](../results.md), "Open".
QUOTED_CITATION = re.compile(f"(?:{_PAGE}|{_LINKED}){_QUOTED}")
#: A docs page's section named without quotes: (docs/method.md, The policy update), (docs/method.md:
#: Rewards and returns, Advantages): the text after the page starts with one of its headings.
BARE_CITATION = re.compile(r"(?<![\w/.-])`?(?P<page>docs/[\w/-]+\.md)`?\s*[,:]\s+(?=(?P<bare>[A-Z][^\n]*))")


def citing_files() -> list[Path]:
    """The files whose citations are checked; not this one, whose examples are not citations."""
    files = {REPO / "README.md", REPO / "BENCHMARKS.md", REPO / "dvc.yaml", *DOCS}
    for folder in CITING_FOLDERS:
        files |= {path for path in (REPO / folder).rglob("*")
                  if path.suffix in CITING_SUFFIXES and path.is_file() and "__pycache__" not in path.parts}
    return sorted(files - {Path(__file__).resolve()})


def folded(text: str) -> tuple[str, list[int]]:
    """The text with each line break, and what continues a comment or a docstring on the next
    line (indentation, `#`, `#:`, `*`, `>`), folded to one space, so that a citation may break across
    lines; and the offset where each line starts in it."""
    parts: list[str] = []
    starts: list[int] = []
    offset = 0
    for number, line in enumerate(text.split("\n")):
        if number:
            line = re.sub(r"^[ \t]*(?:#+:?|\*|>)?[ \t]*", "", line)
            parts.append(" ")
            offset += 1
        starts.append(offset)
        parts.append(line)
        offset += len(line)
    return "".join(parts), starts


def normal(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("`", "").replace("\u2019", "'")).strip().lower()


@functools.cache
def headings(page: Path) -> tuple[str, ...]:
    """The page's headings, normalised (:func:`normal`), fenced blocks left out."""
    found = []
    in_fence = False
    for line in page.read_text().splitlines():
        if re.match(r"\s*(```|~~~)", line):
            in_fence = not in_fence
        elif not in_fence and (heading := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            found.append(normal(heading.group(1)))
    return tuple(found)


def names_a_heading(cited: str, page: Path) -> bool:
    """Whether ``cited`` is a heading of the page, or the start of one up to a word's end
    ("Rollout throughput" for "Rollout throughput: batched, sequential, ...")."""
    cited = normal(cited)
    return any(h == cited or (h.startswith(cited) and not h[len(cited)].isalnum()) for h in headings(page))


def cited_page(source: Path, match: re.Match) -> Path:
    if match.groupdict().get("link"):
        return Path(os.path.normpath(source.parent / match.group("link")))
    name = match.group("page")
    return REPO / (name if name.endswith(".md") else f"{name}.md")


def citation_problems(source: Path) -> list[str]:
    """Each citation of a section in ``source`` whose page lacks that heading, with its line."""
    text, starts = folded(source.read_text())

    def at(match: re.Match) -> str:
        return f"{source.relative_to(REPO)}:{bisect.bisect_right(starts, match.start())}"

    problems = []
    for match in QUOTED_CITATION.finditer(text):
        page = cited_page(source, match)
        section = match.group("double") or match.group("single") or match.group("curly")
        if not page.is_file():
            problems.append(f"{at(match)}: {match.group(0).strip()!r} cites {page}, which does not exist")
        elif not names_a_heading(section, page):
            problems.append(f"{at(match)}: {match.group(0).strip()!r}: {page.relative_to(REPO)} has no "
                            f"heading {section!r}")
    for match in BARE_CITATION.finditer(text):
        page = REPO / match.group("page")
        bare = normal(match.group("bare"))
        if not page.is_file():
            problems.append(f"{at(match)}: {match.group('page')} cites a page that does not exist")
        elif not any(bare == h or (bare.startswith(h) and not bare[len(h)].isalnum()) for h in headings(page)):
            problems.append(f"{at(match)}: {match.group('page')}, {match.group('bare')[:60]!r}...: no heading of "
                            f"{match.group('page')} starts the text after it")
    return problems


# --- the tests -----------------------------------------------------------------------------

IDS = [str(doc.relative_to(REPO)) for doc in DOCS]


def test_the_docs_include_the_readme_and_the_reference_pages():
    names = {doc.relative_to(REPO).as_posix() for doc in DOCS}
    assert {"README.md", "docs/gpu.md", "docs/pipeline.md", "docs/trajectory-table.md"} <= names


def test_the_readme_is_a_guide_of_at_most_300_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 300


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_link_resolves_inside_the_repository(doc):
    problems = [problem for line, target in links(doc) for problem in check_link(doc, line, target)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_nothing_points_outside_the_repository(doc):
    problems = []
    for number, line in enumerate(doc.read_text().splitlines(), start=1):
        problems += [f"{where(doc, number)}: {match.group(0)!r} is outside the repository"
                     for match in OUTSIDE.finditer(line)]
        for match in re.finditer(r"(?:\.\./)+[\w.\-/]*", line):
            if not in_repository(doc.parent / match.group(0)):
                problems.append(f"{where(doc, number)}: {match.group(0)!r} leaves the repository")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_path_named_in_code_exists(doc):
    problems = []
    for span in spans(doc):
        if span.kind == "code" and (text := named_path(span.text)):
            problems += check_named_path(doc, span.line, text)
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def command_lines():
    """The command lines' imports, before a test's capsys: Prefect's first import reconfigures
    logging, closing every handler, and absl's (OpenSpiel's) closes its stream unless that is
    sys.stderr at the time, which under capsys it is not: pytest's own capture would be closed
    under it."""
    import flows.__main__
    import flows.common
    import mage.__main__

    assert flows.common and flows.__main__ and mage.__main__


@pytest.mark.usefixtures("command_lines")
@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_command_runs_or_names_options_that_exist(doc, monkeypatch, tmp_path, capsys):
    problems = []
    for command in commands(doc):
        problem = check_command(command, Fixtures(monkeypatch, tmp_path, capsys))
        if problem:
            problems.append(f"{command.at()}: {problem}")
    assert not problems, "\n".join(problems)


# --- the checks themselves ------------------------------------------------------------------


@pytest.mark.usefixtures("command_lines")
def test_the_checks_find_what_is_wrong(tmp_path, monkeypatch, capsys):
    """A broken link, a missing anchor, a link outside, a missing file, an unknown key or option,
    options after the overrides: each is reported, with the doc and the line. The page lives in
    a copy of the repository's layout (its code folders linked, its docs copied)."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    for name in ("mage", "params", "scripts", "tests", "flows", "pyproject.toml"):
        (root / name).symlink_to(REPO / name)
    for name in ("README.md", "docs/gpu.md"):
        (root / name).write_text((REPO / name).read_text())
    page = root / "docs" / "page.md"
    page.write_text(
        "# A page\n\n"
        "[gone](missing.md) and [no heading](gpu.md#no-such-heading) and [here](#a-page) and\n"
        "[up](../README.md#two-commands) and [out](../../elsewhere.md) and [web](https://example.org)\n\n"
        "`mage/no_such_module.py` and `params/model_game/tiny/<game>.yaml` and `docs/gpu.md#the-memory-plan`\n\n"
        "```bash\n"
        "python -m flows train algo=nonesuch\n"
        "python -m flows train --no-such-flag\n"
        "python -m flows evaluate train.iterations=<N> --split held_out --out-dir DIR  # fine\n"
        "python -m flows evaluate --split held_out train.iterations=2\n"
        "dvc exp run -S train.no_such_key=1\n"
        "bash scripts/gpu_check.sh --no-such-flag\n"
        "pytest -m 'not e2e' tests/no_such_test.py\n"
        "bash scripts/run.sh -S flow.no_such_key=<K>\n"
        "```\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO", root)
    broken = [problem for line, target in links(page) for problem in check_link(page, line, target)]
    assert [p.split(": ")[0] for p in broken] == ["docs/page.md:3", "docs/page.md:3", "docs/page.md:4"], broken
    assert "missing.md" in broken[0] and "#no-such-heading" in broken[1] and "outside" in broken[2]
    paths = [p for s in spans(page) if s.kind == "code" and (text := named_path(s.text))
             for p in check_named_path(page, s.line, text)]
    assert len(paths) == 1 and paths[0].startswith("docs/page.md:6: `mage/no_such_module.py`"), paths
    found = {c.line: check_command(c, Fixtures(monkeypatch, tmp_path, capsys)) for c in commands(page)}
    assert sorted(found) == list(range(9, 17))
    assert "algo" in found[9] and "--no-such-flag" in found[10] and found[11] is None
    assert "unrecognized arguments" in found[12] and "no_such_key" in found[13]
    assert "--no-such-flag" in found[14] and "no_such_test.py" in found[15] and "no_such_key" in found[16]
    assert OUTSIDE.search("see ../shared/MAGE-SPEC.md") and OUTSIDE.search("cd /work/main")
    assert not OUTSIDE.search("artifacts/work/x and docs/method.md")


@pytest.mark.usefixtures("command_lines")
def test_a_transcript_s_config_error_is_the_one_the_settings_give(monkeypatch, tmp_path, capsys):
    doc = REPO / "docs" / "pipeline.md"
    shown = [c for doc in DOCS for c in commands(doc) if c.error_shown]
    assert shown, "a doc shows a config error"
    wrong = Command(doc, 1, "x", shown[0].argv, shown[0].error_shown.replace("must be", "should be"))
    assert "not what is shown" in check_command(wrong, Fixtures(monkeypatch, tmp_path, capsys))


def test_every_cited_section_is_a_heading_of_its_page():
    """A section cited by name in the code, params, tests, benchmarks, experiments, scripts or docs, such as
    (docs/gpu.md, "The memory plan"), (BENCHMARKS.md, "Flow overhead") or (docs/method.md, The
    metrics): its page exists and has that heading, or one that starts with it."""
    problems = [problem for source in citing_files() for problem in citation_problems(source)]
    assert not problems, "\n".join(problems)


def test_the_citation_check_finds_what_is_wrong(tmp_path, monkeypatch):
    """A missing heading, a missing page, a bare docs citation that starts no heading, in every
    quote style, across comment lines and through a Markdown link: each is reported with its
    line; what names a heading, a possessive and a page without a section are not."""
    root = tmp_path / "repo"
    (root / "mage").mkdir(parents=True)
    for name in ("README.md", "BENCHMARKS.md", "docs"):
        (root / name).symlink_to(REPO / name)
    source = root / "mage" / "cited.py"
    source.write_text(r'''"""Cited: (README, "Two commands"), (BENCHMARKS.md, "The test
suite"), (`BENCHMARKS.md`, "Rollout throughput"), docs/method.md, The policy update.
Broken: (README, 'Scaling out'), BENCHMARKS.md "vLLM on this CPU", (docs/gpu.md, "No such heading"),
(docs/nosuch.md, "Anything"), (docs/method.md, Nothing of the kind).
"""
# as measured (docs/notes/findings.md, "Why Tic-Tac-Toe
# unlearned") and [the log](../docs/notes/findings.md), "No such finding"
raise SystemExit(f"set flow.runner=ray (docs/gpu.md, \"A Ray cluster\") or (README, \"Scaling out\")")
# README's "Two commands" is no citation; (BENCHMARKS.md) alone names no section
''')
    monkeypatch.setattr(sys.modules[__name__], "REPO", root)
    problems = citation_problems(source)
    assert [p.split(": ")[0] for p in problems] == ["mage/cited.py:3"] * 3 + ["mage/cited.py:4"] + \
        ["mage/cited.py:7", "mage/cited.py:8", "mage/cited.py:4"], problems
    assert "'Scaling out'" in problems[0] and "'vLLM on this CPU'" in problems[1] and "No such heading" in problems[2]
    assert "does not exist" in problems[3] and "No such finding" in problems[4] and "Scaling out" in problems[5]
    assert "Nothing of the kind" in problems[6]
