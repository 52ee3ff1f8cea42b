"""Load AMCT "simple config" ``.cfg`` files (protobuf text format) with precise errors.

Two schemas (spec §2.1 ``AMCTDistillConfig``, §2.2 ``AMCTRetrainConfig``). Parsing is
done by ``google.protobuf.text_format.Parse``; everything it reports is turned into a
``ConfigError`` with ``path:line:column`` and a sentence that names the field.

The Python protobuf runtime has no ``ParseInfoTree`` (that exists in C++ only), so the
positions of the fields are found by a small scanner (``_Scanner``) that walks the same
tokens as protobuf's tokenizer alongside the message descriptors. Its result is kept in a
``CfgDocument`` so semantic checks (``cfg_checks``) and layer-reference warnings
(``layer_refs``) can point at the field they complain about too.

AMCT itself reads these files with ``text_format.Merge`` (last value wins, a second oneof
member silently replaces the first). We use ``Parse`` on purpose: a field or oneof given
twice is almost always a mistake, and we report it with its position.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import re
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

from google.protobuf import descriptor as _desc
from google.protobuf import text_encoding, text_format
from google.protobuf.message import Message

from amct_engine.config.errors import ConfigError, ConfigWarning, format_location
from amct_engine.proto import distill_config_pytorch_pb2, retrain_config_pytorch_pb2

CfgKind = Literal["retrain", "distill"]

_MESSAGE_CLASSES = {
    "retrain": retrain_config_pytorch_pb2.AMCTRetrainConfig,
    "distill": distill_config_pytorch_pb2.AMCTDistillConfig,
}

# ----------------------------------------------------------------------------- tokens

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
            if m.lastgroup != "skip":
                tokens.append(_Token(m.lastgroup, m.group(), line_no, m.start() + 1))
    return tokens


# ----------------------------------------------------------------------------- scanner


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
        self.unclosed: FieldSite | None = None  # innermost block open at end of file
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
        counts: dict[str, int] = defaultdict(int)  # next index of each repeated field
        while True:
            tok = self._peek()
            if tok is None:
                if end is not None and self.unclosed is None:
                    self.unclosed = opener
                raise _Stop
            if end is not None and self._accept(end):
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


# ----------------------------------------------------------------------------- document


@dataclass
class CfgDocument:
    """A parsed ``.cfg``: the message plus where each field was written."""

    message: Message
    path: str = "<string>"
    text: str = ""
    sites: list[FieldSite] = field(default_factory=list)
    _by_path: dict[str, FieldSite] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for site in self.sites:
            self._by_path.setdefault(site.path, site)
            # A repeated field's bare name points at its first element.
            if site.path.endswith("]"):
                self._by_path.setdefault(site.path.rsplit("[", 1)[0], site)

    @classmethod
    def from_text(cls, message: Message, text: str, path: str = "<string>") -> CfgDocument:
        """Positions for ``text`` (which ``message`` was parsed from); parses nothing."""
        sites = _Scanner(_tokenize(text), message.DESCRIPTOR).sites
        return cls(message, str(path), text, sites)

    @classmethod
    def of(cls, cfg: CfgDocument | Message, path: str | Path | None = None) -> CfgDocument:
        """``cfg`` itself if it is a document; for a bare message, positions are taken from
        the file at ``path`` when there is one (best effort), otherwise there are none."""
        if isinstance(cfg, CfgDocument):
            return cfg
        if path is not None and Path(path).is_file():
            try:
                return cls.from_text(cfg, _decode(Path(path).read_bytes(), str(path)), str(path))
            except ConfigError:
                pass
        return cls(cfg, str(path) if path is not None else "<config>")

    def warn(self, field_path: str | None, message: str, position=None) -> str:
        """Emit a ConfigWarning located at ``field_path``; returns its text."""
        pos = position or (self.locate(field_path) if field_path else None)
        text = f"{format_location(self.path, *(pos or (None, None)))}: {message}"
        warnings.warn(text, ConfigWarning, stacklevel=3)
        return text

    def site(self, field_path: str) -> FieldSite | None:
        """The occurrence of the field at ``field_path`` in the text, or None."""
        return self._by_path.get(field_path)

    def position_of(self, field_path: str) -> tuple[int, int] | None:
        """(line, column) of the field at ``field_path`` as written, or None."""
        site = self.site(field_path)
        return site.position if site else None

    def locate(self, field_path: str) -> tuple[int, int] | None:
        """Like ``position_of`` but falls back to the closest written ancestor.

        Defaults are not written in the file (e.g. ``dst_type`` left at INT8), so an
        error about them points at the enclosing block instead.
        """
        while field_path:
            pos = self.position_of(field_path)
            if pos is not None:
                return pos
            field_path = _parent_path(field_path)
        return None

    def position_of_value(self, field_path: str, value: str) -> tuple[int, int] | None:
        """Position of the first element of repeated string field ``field_path`` equal to
        ``value``. Independent of indices, so it still works after de-duplication."""
        for site in self.sites:
            in_list = site.path.startswith(field_path + "[") and site.parent == _parent_path(field_path)
            if in_list and site.decoded_string() == value:
                return site.position
        return self.locate(field_path)

    def error(self, field_path: str | None, message: str) -> ConfigError:
        """A ConfigError located at ``field_path`` (or its closest written ancestor)."""
        pos = self.locate(field_path) if field_path else None
        line, column = pos if pos else (None, None)
        return ConfigError(message, self.path, line, column, field_path)


def _parent_path(field_path: str) -> str:
    if field_path.endswith("]"):
        return field_path.rsplit("[", 1)[0]
    return field_path.rpartition(".")[0]


# ----------------------------------------------------------------------------- errors


def _type_name(full_name: str) -> str:
    return full_name.rsplit(".", 1)[-1]


def _did_you_mean(word: str, candidates) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


_EXPECTED = {
    _desc.FieldDescriptor.TYPE_UINT32: "an unsigned integer (0 to 4294967295)",
    _desc.FieldDescriptor.TYPE_UINT64: "an unsigned integer",
    _desc.FieldDescriptor.TYPE_INT32: "an integer",
    _desc.FieldDescriptor.TYPE_INT64: "an integer",
    _desc.FieldDescriptor.TYPE_FLOAT: "a number",
    _desc.FieldDescriptor.TYPE_DOUBLE: "a number",
    _desc.FieldDescriptor.TYPE_BOOL: "true or false",
    _desc.FieldDescriptor.TYPE_STRING: 'a quoted string (e.g. "conv1")',
}


def _expected_value(fd: _desc.FieldDescriptor) -> str:
    if fd.type == _desc.FieldDescriptor.TYPE_ENUM:
        return "one of " + ", ".join(v.name for v in fd.enum_type.values)
    return _EXPECTED.get(fd.type, "a valid value")


def _value_reason(raw: str) -> str:
    if "out of range" in raw:
        return " (out of range)"
    if "missing ending quote" in raw:
        return " (the closing quote is missing)"
    return ""


class _ErrorContext(NamedTuple):
    raw: str  # protobuf's message without location prefixes
    line: int | None
    column: int | None
    doc: CfgDocument  # positions scanned from the (rejected) text
    unclosed: FieldSite | None
    pool: object

    def site_at_or_before(self) -> FieldSite | None:
        if self.line is None:
            return None
        before = [s for s in self.doc.sites if s.position <= (self.line, self.column or 0)]
        return before[-1] if before else None

    def site_at(self) -> FieldSite | None:
        site = self.site_at_or_before()
        return site if site and site.position == (self.line, self.column) else None

    def char_at(self) -> str:
        lines = self.doc.text.split("\n")
        if self.line is None or self.column is None or not 0 < self.line <= len(lines):
            return ""
        return lines[self.line - 1][self.column - 1 : self.column]

    def err(self, message: str, field_path: str | None = None, pos=None) -> ConfigError:
        line, column = pos if pos else (self.line, self.column)
        return ConfigError(message, self.doc.path, line, column, field_path)


def _block_parent(block_path: str) -> str:
    """Path of the message that contains the block at ``block_path``."""
    return re.sub(r"\[\d+\]$", "", block_path).rpartition(".")[0]


def _misplaced_hint(ctx: _ErrorContext, site: FieldSite) -> str:
    """A field unknown here but known to an enclosing block usually means a "}" is
    missing earlier: say which block is still open."""
    child, outer = site.parent, _block_parent(site.parent)
    while child:
        holder = ctx.doc.site(outer) if outer else None
        if outer and (holder is None or holder.field is None):
            return ""
        desc = holder.field.message_type if outer else ctx.doc.message.DESCRIPTOR
        if site.name in desc.fields_by_name and (opened := ctx.doc.site(child)) is not None:
            return (
                f' ("{site.name}" is a field of {desc.name}: is a "}}" missing to close '
                f'"{opened.name}" opened at {opened.line}:{opened.column}?)'
            )
        child, outer = outer, _block_parent(outer)
    return ""


def _unknown_field(ctx: _ErrorContext, m: re.Match) -> ConfigError:
    name, type_name = m["name"], m["type"]
    desc = ctx.pool.FindMessageTypeByName(type_name)
    site = ctx.site_at()
    hint = (_misplaced_hint(ctx, site) if site else "") or _did_you_mean(name, desc.fields_by_name)
    return ctx.err(f'unknown field "{name}" in {_type_name(type_name)}{hint}', site.path if site else name)


def _oneof_conflict(ctx: _ErrorContext, m: re.Match) -> ConfigError:
    # Parse (unlike Merge, which AMCT uses) refuses a second member of a oneof.
    site = ctx.site_at()
    return ctx.err(
        f'"{m["name"]}" cannot be set together with "{m["other"]}" in {_type_name(m["type"])}: '
        f'they are alternatives (oneof "{m["oneof"]}"); keep only one',
        site.path if site else m["name"],
    )


def _duplicate_field(ctx: _ErrorContext, m: re.Match) -> ConfigError:
    # protobuf points at the value or the "{" after the name; point at the name instead
    # and say where the first one was.
    site = ctx.site_at_or_before()
    if site is None or site.name != m["name"]:
        return ctx.err(f'field "{m["name"]}" is given more than once in {_type_name(m["type"])}', m["name"])
    first = next(s for s in ctx.doc.sites if s.parent == site.parent and s.name == site.name)
    return ctx.err(
        f'field "{site.name}" is given more than once in {_type_name(m["type"])} '
        f"(first at {first.line}:{first.column}); it may appear only once",
        site.path,
        site.position,
    )


def _bad_value(ctx: _ErrorContext, site: FieldSite) -> ConfigError:
    return ctx.err(
        f'invalid value {site.value} for field "{site.name}"{_value_reason(ctx.raw)}: '
        f"expected {_expected_value(site.field)}",
        site.path,
    )


def _expected_token(ctx: _ErrorContext, m: re.Match) -> ConfigError | None:
    token, site = m["token"], ctx.site_at_or_before()
    if token in "}>" and ctx.unclosed is not None:
        block = ctx.unclosed
        return ctx.err(
            f'block "{block.name}" is never closed: "{token}" is missing before the end of the file',
            block.path,
            block.position,
        )
    if site is None or site.field is None:
        return None
    if token == ":" and ctx.char_at() not in ("{", "<"):
        return ctx.err(f'missing ":" between field "{site.name}" and its value', site.path)
    if token == ":":
        return ctx.err(
            f'field "{site.name}" holds a single value, not a block: write {site.name}: <value>',
            site.path,
        )
    if token in "{<":
        return ctx.err(
            f'field "{site.name}" is a message ({site.field.message_type.name}): write {site.name} {{ ... }}',
            site.path,
        )
    return None


def _expected_name(ctx: _ErrorContext, m: re.Match) -> ConfigError:
    if m["got"] in ("}", ">"):
        return ctx.err(f'unexpected "{m["got"]}": there is no open block to close here')
    return ctx.err(f"expected a field name, got {m['got']}")


_REWRITES = [
    (re.compile(r'Message type "(?P<type>[\w.]+)" has no field named "(?P<name>[^"]*)"\.'), _unknown_field),
    (
        re.compile(
            r'Field "(?P<name>\w+)" is specified along with field "(?P<other>\w+)", another member '
            r'of oneof "(?P<oneof>\w+)" for message type "(?P<type>[\w.]+)"\.'
        ),
        _oneof_conflict,
    ),
    (
        re.compile(r'Message type "(?P<type>[\w.]+)" should not have multiple "(?P<name>\w+)" fields\.'),
        _duplicate_field,
    ),
    (re.compile(r'Expected "(?P<token>[{}<>:])"\.'), _expected_token),
    (re.compile(r"Expected identifier or number, got (?P<got>.*)\."), _expected_name),
]


def _strip_location(err: text_format.ParseError, lines: list[str]) -> str:
    """protobuf prefixes ``"line:col : "`` and, for errors at the current token, the whole
    source line in quotes; we render positions ourselves."""
    raw = str(err.args[0]) if err.args else "syntax error"
    raw = re.sub(r"^\d+(?::\d+)? : ", "", raw)
    line = err.GetLine()
    if line is not None and 0 < line <= len(lines):
        quoted = f"'{lines[line - 1]}': "
        if raw.startswith(quoted):
            raw = raw[len(quoted) :]
    return raw


def _convert_parse_error(err: text_format.ParseError, text: str, msg_cls, path: str) -> ConfigError:
    scanner = _Scanner(_tokenize(text), msg_cls.DESCRIPTOR)
    doc = CfgDocument(msg_cls(), path, text, scanner.sites)
    raw = _strip_location(err, text.split("\n"))
    ctx = _ErrorContext(
        raw, err.GetLine(), err.GetColumn(), doc, scanner.unclosed, msg_cls.DESCRIPTOR.file.pool
    )
    for pattern, handler in _REWRITES:
        m = pattern.fullmatch(raw)
        if m and (converted := handler(ctx, m)) is not None:
            return converted
    # Errors about a scalar value (bad enum name, not a number, out of range, missing
    # quotes...) are raised at the value token; the scanner knows whose value it is.
    site = ctx.site_at_or_before()
    if site is not None and site.field is not None and site.value_position == (ctx.line, ctx.column):
        return _bad_value(ctx, site)
    return ctx.err(raw.rstrip("."))


def _missing_required(doc: CfgDocument) -> ConfigError | None:
    """text_format.Parse does not check ``required`` fields; do it, pointing at the block
    that lacks the field (the earliest one in the file)."""
    missing = doc.message.FindInitializationErrors()
    if not missing:
        return None
    far = (float("inf"), float("inf"))
    missing.sort(key=lambda p: doc.locate(_parent_path(p)) or far)
    field_path = missing[0]
    parent = _parent_path(field_path)
    name = field_path.rsplit(".", 1)[-1]
    owner = parent.rsplit(".", 1)[-1] or doc.message.DESCRIPTOR.name
    pos = doc.locate(parent)
    line, column = pos if pos else (None, None)
    return ConfigError(f'missing required field "{name}" in {owner}', doc.path, line, column, field_path)


# ----------------------------------------------------------------------------- public API


def _decode(data: bytes, path: str) -> str:
    try:
        # utf-8-sig: editors on Windows add a BOM that protobuf would reject as a token.
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError("the file is not valid UTF-8 text", path, line, column) from None


def parse_cfg_document(
    text: str | bytes, kind: CfgKind, path: str = "<string>", check: bool = True
) -> CfgDocument:
    """Parse ``.cfg`` text of ``kind`` ("retrain" or "distill") into a CfgDocument.

    Raises ConfigError for syntax errors, unknown fields, bad values, fields or oneof
    members given twice, missing required fields and (when ``check``) the semantic
    checks of ``cfg_checks``. Warnings (e.g. repeated skip entries) go to ``warnings``.
    """
    if kind not in _MESSAGE_CLASSES:
        raise ValueError(f"kind must be 'retrain' or 'distill', got {kind!r}")
    msg_cls, path = _MESSAGE_CLASSES[kind], str(path)
    if isinstance(text, bytes):
        text = _decode(text, path)
    message = msg_cls()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as err:
        raise _convert_parse_error(err, text, msg_cls, path) from None
    doc = CfgDocument.from_text(message, text, path)
    if (missing := _missing_required(doc)) is not None:
        raise missing
    if check:
        # Imported here: cfg_checks needs CfgDocument from this module.
        from amct_engine.config import cfg_checks

        (cfg_checks.check_retrain_cfg if kind == "retrain" else cfg_checks.check_distill_cfg)(doc)
    return doc


def load_cfg_document(path: str | Path, kind: CfgKind, check: bool = True) -> CfgDocument:
    """Read and parse the ``.cfg`` file at ``path``; see ``parse_cfg_document``."""
    p = Path(path)
    if not p.is_file():
        if p.exists():
            raise IsADirectoryError(errno.EISDIR, "config path is not a file", str(path))
        raise FileNotFoundError(errno.ENOENT, "config file not found", str(path))
    return parse_cfg_document(_decode(p.read_bytes(), str(path)), kind, str(path), check)


def load_retrain_cfg(path: str | Path) -> retrain_config_pytorch_pb2.AMCTRetrainConfig:
    """Load a retrain / prune / compressed ``.cfg`` (spec §2.2), checked."""
    return load_cfg_document(path, "retrain").message


def load_distill_cfg(path: str | Path) -> distill_config_pytorch_pb2.AMCTDistillConfig:
    """Load a distillation ``.cfg`` (spec §2.1), checked."""
    return load_cfg_document(path, "distill").message


def parse_retrain_cfg_text(text: str, path: str = "<string>") -> retrain_config_pytorch_pb2.AMCTRetrainConfig:
    """Parse retrain ``.cfg`` text; ``path`` only names the source in error messages."""
    return parse_cfg_document(text, "retrain", path).message


def parse_distill_cfg_text(text: str, path: str = "<string>") -> distill_config_pytorch_pb2.AMCTDistillConfig:
    """Parse distillation ``.cfg`` text; ``path`` only names the source in error messages."""
    return parse_cfg_document(text, "distill", path).message
