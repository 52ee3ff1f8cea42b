"""Every `amct …` command and `make` target the README and docs/*.md name exists, with the options they give it
(issue 39: docs/service.md named `amct jobs report`, which did not exist).

Commands are read from code blocks and `code spans`; a line ending in a backslash goes on to the next. Words after
`amct` walk the CLI's command tree (typer's click groups) while they name a command; every `--option` on the
line must be one that command takes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from service.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_SPAN = re.compile(r"`([^`\n]+)`")
_FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)


def _code(text: str) -> list[str]:
    """Lines of the code blocks (continuations joined) and the code spans of the prose."""
    blocks = [m.group(1) for m in _FENCE.finditer(text)]
    lines = [ln for block in blocks for ln in block.replace("\\\n", " ").splitlines()]
    prose = _FENCE.sub("", text)
    return lines + _SPAN.findall(prose)


def _uses(pattern: str) -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for line in _code(doc.read_text()):
            for match in re.finditer(pattern, line):
                found.append((f"{doc.relative_to(ROOT)}: {line.strip()[:100]}", line[match.start() :]))
    return found


def _resolve(words: list[str]):
    """The command the words name (as far as they name one) and the words that named it. (A group is what has
    `commands`: typer's command classes need not be click's.)"""
    command = typer.main.get_command(app)
    path: list[str] = []
    for word in words:
        if word not in getattr(command, "commands", {}):
            break
        command, path = command.commands[word], [*path, word]
    return command, path


AMCT_USES = _uses(r"(?<![\w/.-])amct (?=[a-z])")


def test_the_docs_name_amct_commands():
    assert len(AMCT_USES) > 20  # the reader works: the README alone has a dozen


@pytest.mark.parametrize(("where", "text"), AMCT_USES, ids=[w for w, _ in AMCT_USES])
def test_each_amct_command_in_the_docs_exists_with_its_options(where, text):
    words = [w for w in re.split(r"[\s|;:,)`]+", text.split("#", 1)[0].strip())[1:] if w]
    command, path = _resolve(words)
    assert path, f"{where}: `amct {words[0]}` is not a command"
    after = words[len(path)] if len(path) < len(words) else ""
    if hasattr(command, "commands"):  # a group named without a subcommand is fine; a wrong one is not
        assert not re.fullmatch(r"[a-z][a-z-]+", after) or after in command.commands, (
            f"{where}: `amct {' '.join(path)} {after}` is not a command"
        )
        return
    options = {opt for param in command.params for opt in param.opts}
    given = {w.split("=", 1)[0] for w in words[len(path) :] if w.startswith("--")}
    assert given <= options, f"{where}: `amct {' '.join(path)}` takes no {sorted(given - options)}"


def test_each_make_target_in_the_docs_exists():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    named = {
        (where, m) for where, text in _uses(r"(?<![\w-])make [a-z]") for m in re.findall(r"^make ([a-z][a-z-]*)", text)
    }
    assert named, "no make target found in the docs"
    missing = sorted(f"{where}: make {target}" for where, target in named if target not in targets)
    assert not missing, missing
