"""Every citation of the repository's own documents points at something that exists.

Scanned: the tracked (and untracked, not ignored) ``*.py``, ``*.js``, ``*.md``, ``*.cfg``,
``*.proto``, ``*.toml`` files and Makefiles, except this file.

Grammar of what is checked (anything else that looks like a citation fails the second test):

    citation     := SPEC_PATH " " SECTIONS
    SPEC_PATH    := "docs/spec/" NAME ".md"
    SECTIONS     := "§" ID { SEP "§" ID }
    SEP          := "," [" "] | "/" | "-" | "–" | " and "
    ID           := DIGITS [ "." DIGITS ] | DIGITS LETTER        e.g. 4, 4.1, 2a
                    (not followed by a letter or digit: "§4.1:" and "§4.9's" are fine)

    "§A-§B" (or "§A–§B") is a range: A, B and, when both are "N.x" or "Nx" of one N, every
    section between them must exist ("§1.2-§1.4" checks 1.2, 1.3 and 1.4).

    doc link     := "docs/" PATH ".md" [ "#" ANCHOR ]           repo-root relative; not preceded by
                                                                a word character, "/", "." or "-"
                  | "docs/" PATH ".md, \"" HEADING "\""         a heading quoted after the path
    md link      := "](" PATH ".md" [ "#" ANCHOR ] ")"          in a Markdown file, relative to it

A section ID exists when the file has a Markdown heading (outside fenced code) whose text starts
with the ID followed by "." or a space: ``## 4. Algorithms``, ``### 4.1 ULQ …``, ``### 2a. …``.
An ANCHOR is a heading's GitHub slug; a quoted HEADING must equal a heading's text.
Inside ``docs/spec/*.md`` a bare "§ID" (no path in front) cites a section of that same file.

Outside ``docs/spec/``, a "§" must start the SECTIONS of a citation: "spec §4.1", "Spec §2a" or a
bare "(§3.2)" name no file. ``DESIGN.md``, ``shared/spec`` and ``spec/<file>.md`` without the
``docs/`` in front name documents the repository does not contain.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()
SUFFIXES = (".py", ".js", ".md", ".cfg", ".proto", ".toml")
SPEC_DIR = "docs/spec/"

ID = r"\d+(?:\.\d+)?[a-z]?(?![a-z0-9])"
SEP = r"(?:, ?|/|-|–| and )"
SECTIONS = rf"§{ID}(?:{SEP}§{ID})*"
NOT_IN_A_PATH = r"(?<![\w/.-])"
CITATION = re.compile(rf"{NOT_IN_A_PATH}(docs/spec/[\w.-]+\.md) ({SECTIONS})")
BARE_SECTIONS = re.compile(SECTIONS)
ITEM = re.compile(rf"({SEP})?§({ID})")
DOC_LINK = re.compile(rf'{NOT_IN_A_PATH}(docs/[\w./-]+?\.md)(?:#([\w-]+)|, "([^"]+)")?')
MD_LINK = re.compile(r"\]\(([\w./-]+?\.md)(?:#([\w-]+))?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
HEADING_ID = re.compile(r"^(\d+(?:\.\d+)?[a-z]?)(?:\.|\s|$)")
FORBIDDEN = [
    (re.compile(r"DESIGN\.md"), "DESIGN.md is not in the repository: cite docs/architecture.md"),
    (re.compile(r"shared/spec"), "shared/spec is not in the repository: cite docs/spec/"),
    # (a Markdown link target "](spec/engine.md)" inside docs/ is relative, and checked by the first test)
    (
        re.compile(rf"{NOT_IN_A_PATH}(?<!\]\()spec/[\w.-]+\.md"),
        "spec/<file>.md is not in the repository: cite docs/spec/",
    ),
]


def scanned_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = sorted(set(out.split()))
    return [
        n for n in names if n != SELF and (n.endswith(SUFFIXES) or Path(n).name == "Makefile") and (ROOT / n).is_file()
    ]


def lines_of(name: str) -> list[str]:
    return (ROOT / name).read_text(encoding="utf-8", errors="replace").splitlines()


@cache
def headings(path: str) -> tuple[str, ...]:
    """Heading texts of a Markdown file, outside fenced code blocks, markup (backticks) removed."""
    found, fenced = [], False
    for line in lines_of(path):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            found.append(match.group(1).replace("`", "").strip())
    return tuple(found)


def section_ids(path: str) -> set[str]:
    return {m.group(1) for text in headings(path) if (m := HEADING_ID.match(text))}


def slug(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def expand(sections: str) -> list[str]:
    """The section ids a SECTIONS string names, ranges expanded."""
    ids: list[str] = []
    for match in ITEM.finditer(sections):
        sep, ident = match.groups()
        if sep in ("-", "–") and ids:
            ids.extend(_between(ids[-1], ident))
        ids.append(ident)
    return ids


def _between(first: str, last: str) -> list[str]:
    numbered = re.compile(r"(\d+)\.(\d+)$"), re.compile(r"(\d+)([a-z])$")
    for pattern in numbered:
        a, b = pattern.match(first), pattern.match(last)
        if a and b and a.group(1) == b.group(1):
            lo, hi = a.group(2), b.group(2)
            if lo.isdigit():
                return [f"{a.group(1)}.{i}" for i in range(int(lo) + 1, int(hi))]
            return [f"{a.group(1)}{chr(c)}" for c in range(ord(lo) + 1, ord(hi))]
    return []


def citations() -> list[tuple[str, int, str, str]]:
    """(file, line, cited document, section id) for every section citation."""
    found = []
    for name in scanned_files():
        in_spec = name.startswith(SPEC_DIR) and name.endswith(".md")
        for number, line in enumerate(lines_of(name), 1):
            covered = set()
            for match in CITATION.finditer(line):
                covered.update(range(match.start(2), match.end(2)))
                found.extend((name, number, match.group(1), i) for i in expand(match.group(2)))
            if in_spec:  # bare "§4.3" inside a spec file: its own section
                for match in BARE_SECTIONS.finditer(line):
                    if match.start() not in covered:
                        found.extend((name, number, name, i) for i in expand(match.group(0)))
    return found


def doc_links() -> list[tuple[str, int, str, str | None, str | None]]:
    """(file, line, linked document, anchor, quoted heading) for every link to a doc."""
    found = []
    for name in scanned_files():
        for number, line in enumerate(lines_of(name), 1):
            for match in DOC_LINK.finditer(line):
                found.append((name, number, match.group(1), match.group(2), match.group(3)))
            if name.endswith(".md"):
                for match in MD_LINK.finditer(line):
                    target = (Path(name).parent / match.group(1)).as_posix()
                    if "://" not in match.group(1):
                        found.append((name, number, _normalise(target), match.group(2), None))
    return found


def _normalise(path: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/".join(parts)


def test_every_cited_section_and_linked_doc_exists():
    problems = []
    for name, number, doc, ident in citations():
        if not (ROOT / doc).is_file():
            problems.append(f"{name}:{number}: {doc} does not exist")
        elif ident not in section_ids(doc):
            problems.append(f"{name}:{number}: {doc} has no section §{ident}")
    for name, number, doc, anchor, heading in doc_links():
        if not (ROOT / doc).is_file():
            problems.append(f"{name}:{number}: {doc} does not exist")
        elif anchor and anchor not in {slug(h) for h in headings(doc)}:
            problems.append(f"{name}:{number}: {doc} has no heading with anchor #{anchor}")
        elif heading and heading not in headings(doc):
            problems.append(f'{name}:{number}: {doc} has no heading "{heading}"')
    assert not problems, "broken citations:\n" + "\n".join(problems)


def test_the_grammar_reads_the_forms_the_code_uses():
    line = "x (docs/spec/engine.md §1.2-§1.4, §4.9's table; docs/spec/service.md §2d, §7c)."
    cited = [(m.group(1), expand(m.group(2))) for m in CITATION.finditer(line)]
    assert cited == [("docs/spec/engine.md", ["1.2", "1.3", "1.4", "4.9"]), ("docs/spec/service.md", ["2d", "7c"])]
    assert expand("§2a–§2d") == ["2a", "2b", "2c", "2d"]
    assert expand("§2.1/§2.2") == ["2.1", "2.2"]
    assert not CITATION.search("see /work/docs/spec/engine.md §4.1")  # not repo-root relative
    assert section_ids("docs/spec/engine.md") >= {"0", "4", "4.1", "7.5", "8"}
    assert section_ids("docs/spec/service.md") >= {"0", "1a", "2d", "7c", "7e"}


def test_no_citation_names_a_document_the_repository_lacks():
    problems = []
    for name in scanned_files():
        in_spec = name.startswith(SPEC_DIR) and name.endswith(".md")
        for number, line in enumerate(lines_of(name), 1):
            for pattern, why in FORBIDDEN:
                if pattern.search(line):
                    problems.append(f"{name}:{number}: {why}: {line.strip()}")
            if in_spec:
                continue
            covered = {i for m in CITATION.finditer(line) for i in range(m.start(2), m.end(2))}
            if any(ch == "§" and i not in covered for i, ch in enumerate(line)):
                problems.append(f"{name}:{number}: '§' without a docs/spec/<file>.md in front: {line.strip()}")
    assert not problems, "citations of documents outside the repository:\n" + "\n".join(problems)
