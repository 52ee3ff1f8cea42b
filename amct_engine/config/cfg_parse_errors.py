"""protobuf's text_format errors, rewritten as ``ConfigError``s in the user's words.

protobuf reports ``line:col : Message type "AMCTPytorchProto.X" has no field named "y".``;
we say ``file:line:column: unknown field "y" in X (did you mean "z"?)``, name the field,
point at its name rather than at the token after it, and say which block a missing "}"
left open. The positions come from the scanner (cfg_scanner), which also runs on the text
protobuf rejected.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, NamedTuple

from google.protobuf import descriptor as _desc
from google.protobuf import text_format

from amct_engine.config.cfg_document import CfgDocument, decode_cfg_bytes
from amct_engine.config.cfg_scanner import MAX_NESTING, FieldSite, nesting_too_deep, parent_path, scan_fields
from amct_engine.config.errors import ConfigError


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
    pool: Any  # a protobuf DescriptorPool

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
        desc = (
            holder.field.message_type if holder is not None and holder.field is not None else ctx.doc.message.DESCRIPTOR
        )
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


def convert_parse_error(err: text_format.ParseError, text: str, msg_cls, path: str) -> ConfigError:
    """The ConfigError for protobuf's ``err`` on ``text`` (parsed as a ``msg_cls``)."""
    scan = scan_fields(text, msg_cls.DESCRIPTOR)
    doc = CfgDocument(msg_cls(), path, text, scan.sites)
    raw = _strip_location(err, text.split("\n"))
    ctx = _ErrorContext(raw, err.GetLine(), err.GetColumn(), doc, scan.unclosed, msg_cls.DESCRIPTOR.file.pool)
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


def missing_required_error(doc: CfgDocument) -> ConfigError | None:
    """text_format.Parse does not check ``required`` fields; do it, pointing at the block
    that lacks the field (the earliest one in the file)."""
    missing = doc.message.FindInitializationErrors()
    if not missing:
        return None
    far = (float("inf"), float("inf"))
    missing.sort(key=lambda p: doc.locate(parent_path(p)) or far)
    field_path = missing[0]
    parent = parent_path(field_path)
    name = field_path.rsplit(".", 1)[-1]
    owner = parent.rsplit(".", 1)[-1] or doc.message.DESCRIPTOR.name
    pos = doc.locate(parent)
    line, column = pos if pos else (None, None)
    return ConfigError(f'missing required field "{name}" in {owner}', doc.path, line, column, field_path)


def parse_cfg_message(text: str | bytes, msg_cls, path: str) -> CfgDocument:
    """Every cfg kind's syntax pass: decode, refuse blocks nested too deep, parse into ``msg_cls``, and turn
    protobuf's errors and missing required fields into positioned ConfigErrors. The kind's own checks follow."""
    if isinstance(text, bytes):
        text = decode_cfg_bytes(text, path)
    if (opener := nesting_too_deep(text)) is not None:
        raise ConfigError(
            f"blocks are nested more than {MAX_NESTING} levels deep here; no AMCT cfg field nests that far",
            path,
            opener.line,
            opener.column,
        )
    message = msg_cls()
    try:
        # The recursion limit too: protobuf's own guard, should a text slip past the one above.
        text_format.Parse(text, message, max_recursion_depth=MAX_NESTING + 1)
    except text_format.ParseError as err:
        raise convert_parse_error(err, text, msg_cls, path) from None
    doc = CfgDocument.from_text(message, text, path)
    if (missing := missing_required_error(doc)) is not None:
        raise missing
    return doc
