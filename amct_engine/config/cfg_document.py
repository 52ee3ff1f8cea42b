"""A parsed ``.cfg``: the protobuf message plus where each of its fields was written.

Semantic checks (cfg_checks) and layer-reference warnings (layer_refs) raise and warn
through it, so their messages point at the field they complain about, as
``path:line:column`` (errors.format_location).
"""

from __future__ import annotations

import errno
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import Message

from amct_engine.config.cfg_scanner import FieldSite, parent_path, scan_fields
from amct_engine.config.errors import ConfigError, ConfigWarning, format_location


def decode_cfg_bytes(data: bytes, path: str) -> str:
    """The text of a ``.cfg`` file; a ConfigError located at the first invalid byte."""
    try:
        # utf-8-sig: editors on Windows add a BOM that protobuf would reject as a token.
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError("the file is not valid UTF-8 text", path, line, column) from None


def read_cfg_file(path: str | Path) -> str:
    """The text of the ``.cfg`` file at ``path``; FileNotFoundError / IsADirectoryError otherwise."""
    p = Path(path)
    if not p.is_file():
        if p.exists():
            raise IsADirectoryError(errno.EISDIR, "config path is not a file", str(path))
        raise FileNotFoundError(errno.ENOENT, "config file not found", str(path))
    return decode_cfg_bytes(p.read_bytes(), str(path))


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
        return cls(message, str(path), text, scan_fields(text, message.DESCRIPTOR).sites)

    @classmethod
    def of(cls, cfg: CfgDocument | Message, path: str | Path | None = None) -> CfgDocument:
        """``cfg`` itself if it is a document; for a bare message, positions are taken from
        the file at ``path`` when there is one (best effort), otherwise there are none."""
        if isinstance(cfg, CfgDocument):
            return cfg
        if path is not None and Path(path).is_file():
            try:
                return cls.from_text(cfg, decode_cfg_bytes(Path(path).read_bytes(), str(path)), str(path))
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
            field_path = parent_path(field_path)
        return None

    def position_of_value(self, field_path: str, value: str) -> tuple[int, int] | None:
        """Position of the first element of repeated string field ``field_path`` equal to
        ``value``. Independent of indices, so it still works after de-duplication."""
        for site in self.sites:
            in_list = site.path.startswith(field_path + "[") and site.parent == parent_path(field_path)
            if in_list and site.decoded_string() == value:
                return site.position
        return self.locate(field_path)

    def error(self, field_path: str | None, message: str) -> ConfigError:
        """A ConfigError located at ``field_path`` (or its closest written ancestor)."""
        pos = self.locate(field_path) if field_path else None
        line, column = pos if pos else (None, None)
        return ConfigError(message, self.path, line, column, field_path)
