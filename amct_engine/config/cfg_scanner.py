"""Where each field of a ``.cfg`` is written: a scanner over protobuf's text-format tokens.

The Python protobuf runtime has no ``ParseInfoTree`` (that exists in C++ only), so the
positions of the fields are found by a small scanner that walks the same tokens as
protobuf's tokenizer alongside the message descriptors. It records one ``FieldSite`` per
occurrence; ``CfgDocument`` (cfg_document) looks them up, and the parse-error rewriter
(cfg_parse_errors) asks them which field an error is about.
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

from google.protobuf import descriptor as _desc
from google.protobuf import text_encoding

# Same token classes as protobuf's ``text_format.Tokenizer._TOKEN`` (identifier, number,
# quoted string) so that our columns agree with the ones in protobuf's ParseErrors.
_TOKEN_RE = re.compile(
    r"""
      (?P<skip>\s+|\#[^\n]*)
    | (?P<ident>[A-Za-z_][0-9A-Za-z_+-]*)
    | (?P<num>(?:[0-9+-]|\.[0-9])[0-9A-Za-z_.+-]*)
    | (?P<str>"(?:[^"\n\\]|\\.)*(?:"|\\?$)|'(?:[^'\n\\]|\\.)*(?:'|\\?$))
    | (?P<other>.)
    """,
    re.VERBOSE,
)


class _Token(NamedTuple):
    kind: str  # ident | num | str | other
    text: str
    line: int  # 1-based
    column: int  # 1-based


def _tokenize(text: str) -> list[_Token]:
    # protobuf splits on "\n" and tokenizes line by line (strings cannot span lines).
    tokens = []
    for line_no, line in enumerate(text.split("\n"), start=1):
        for m in _TOKEN_RE.finditer(line):
            if m.lastgroup is not None and m.lastgroup != "skip":
                tokens.append(_Token(m.lastgroup, m.group(), line_no, m.start() + 1))
    return tokens


@dataclass(frozen=True)
class FieldSite:
    """One occurrence of a field in the text.

    ``path`` uses protobuf's notation (``a[0].b``, the one ``FindInitializationErrors``
    returns); ``line``/``column`` are those of the field name (for elements of the
    ``name: [x, y]`` list form: of the element). ``value`` is the scalar token as written
    (None for message fields); ``value_line``/``value_column`` locate it.
    """

    path: str
    parent: str
    name: str
    line: int
    column: int
    field: _desc.FieldDescriptor | None
    value: str | None = None
    value_line: int | None = None
    value_column: int | None = None

    @property
    def position(self) -> tuple[int, int]:
        return (self.line, self.column)

    @property
    def value_position(self) -> tuple[int | None, int | None]:
        return (self.value_line, self.value_column)

    def decoded_string(self) -> str | None:
        """The value of a string scalar, unescaped as protobuf does (None if not a string)."""
        if not self.value or self.value[0] not in "\"'":
            return None
        parts = re.findall(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'", self.value)
        try:
            raw = b"".join(text_encoding.CUnescape(p[1:-1]) for p in parts)
        except ValueError:
            return None
        return raw.decode("utf-8", errors="replace")


def parent_path(field_path: str) -> str:
    """The path of the message (or repeated field) that holds ``field_path``."""
    if field_path.endswith("]"):
        return field_path.rsplit("[", 1)[0]
    return field_path.rpartition(".")[0]


# The deepest block nesting a .cfg may have. AMCT's schemas nest four levels at most
# (override_layer_configs { prune_config { filter_pruner { balanced_l2_norm_filter_prune {);
# both protobuf's parser and this scanner recurse per level, so a hostile file of thousands
# of nested blocks would otherwise end in RecursionError instead of an error naming its line.
MAX_NESTING = 32


def nesting_too_deep(text: str, limit: int = MAX_NESTING) -> _Token | None:
    """The first block opener (``{`` or ``<``) nested deeper than ``limit``, or None.

    One flat pass over the tokens (no recursion), so it is safe on any input; quoted strings
    and comments are tokens of their own, so braces inside them do not count.
    """
    depth = 0
    for tok in _tokenize(text):
        if tok.kind != "other":
            continue
        if tok.text in "{<":
            depth += 1
            if depth > limit:
                return tok
        elif tok.text in "}>":
            depth = max(0, depth - 1)
    return None


class FieldScan(NamedTuple):
    sites: list[FieldSite]
    unclosed: FieldSite | None  # innermost block still open at the end of the text


def scan_fields(text: str, root: _desc.Descriptor) -> FieldScan:
    """Every field occurrence in ``text``, read as a ``root`` message, in file order."""
    scanner = _Scanner(_tokenize(text), root)
    return FieldScan(scanner.sites, scanner.unclosed)


class _Stop(Exception):
    """The text stops making sense here; keep what was scanned so far."""


class _Scanner:
    """Walks the tokens like ``text_format._Parser`` does, recording every field's place.

    It is tolerant: it stops quietly at the first thing it does not understand, because
    it also runs on texts that protobuf rejected (to name the field an error is about).
    """

    def __init__(self, tokens: list[_Token], root: _desc.Descriptor) -> None:
        self.tokens = tokens
        self.i = 0
        self.sites: list[FieldSite] = []
        self.unclosed: FieldSite | None = None
        self.depth = 0
        with contextlib.suppress(_Stop):
            self._block(root, "", end=None, opener=None)

    def _peek(self) -> _Token | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _accept(self, text: str) -> _Token | None:
        tok = self._peek()
        if tok is not None and tok.kind == "other" and tok.text == text:
            self.i += 1
            return tok
        return None

    def _block(self, desc, prefix: str, end: str | None, opener: FieldSite | None) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:  # a backstop: parse_cfg_document refuses such a text first
            raise _Stop
        counts: dict[str, int] = defaultdict(int)  # next index of each repeated field
        while True:
            tok = self._peek()
            if tok is None:
                if end is not None and self.unclosed is None:
                    self.unclosed = opener
                raise _Stop
            if end is not None and self._accept(end):
                self.depth -= 1
                return
            if tok.kind != "ident":
                raise _Stop
            self._field(desc, prefix, counts)

    def _field(self, desc, prefix: str, counts: dict[str, int]) -> None:
        name_tok = self.tokens[self.i]
        self.i += 1
        fd = desc.fields_by_name.get(name_tok.text) if desc is not None else None
        base = f"{prefix}.{name_tok.text}" if prefix else name_tok.text
        self._accept(":")
        tok = self._peek()
        if tok is None:
            self.sites.append(FieldSite(base, prefix, name_tok.text, *name_tok[2:], fd))
            raise _Stop
        if fd is not None and fd.is_repeated and self._accept("["):
            self._list(fd, base, prefix, name_tok.text, counts)
        else:
            self._value(fd, base, prefix, name_tok, counts)
        if not self._accept(","):
            self._accept(";")

    def _path(self, fd, base: str, counts: dict[str, int]) -> str:
        if fd is None or not fd.is_repeated:
            return base
        name = base.rsplit(".", 1)[-1]
        counts[name] += 1
        return f"{base}[{counts[name] - 1}]"

    def _list(self, fd, base: str, prefix: str, name: str, counts: dict[str, int]) -> None:
        # Short repeated form ``name: [a, b]``: each element is located at itself.
        if self._accept("]"):
            return
        while True:
            tok = self._peek()
            if tok is None:
                raise _Stop
            self._value(fd, base, prefix, tok._replace(text=name), counts)
            if self._accept("]"):
                return
            if not self._accept(","):
                raise _Stop

    def _value(self, fd, base: str, prefix: str, name_tok: _Token, counts: dict[str, int]) -> None:
        path = self._path(fd, base, counts)
        tok = self._peek()
        if tok is not None and tok.kind == "other" and tok.text in "{<":
            self.i += 1
            site = FieldSite(path, prefix, name_tok.text, name_tok.line, name_tok.column, fd)
            self.sites.append(site)
            is_msg = fd is not None and fd.cpp_type == _desc.FieldDescriptor.CPPTYPE_MESSAGE
            self._block(fd.message_type if is_msg else None, path, "}" if tok.text == "{" else ">", site)
            return
        if tok is None or tok.kind == "other":
            self.sites.append(FieldSite(path, prefix, name_tok.text, name_tok.line, name_tok.column, fd))
            raise _Stop
        value = [tok.text]
        self.i += 1
        # Adjacent string literals are concatenated, as in C.
        while tok.kind == "str" and (nxt := self._peek()) is not None and nxt.kind == "str":
            value.append(nxt.text)
            self.i += 1
        self.sites.append(
            FieldSite(
                path,
                prefix,
                name_tok.text,
                name_tok.line,
                name_tok.column,
                fd,
                " ".join(value),
                tok.line,
                tok.column,
            )
        )
