"""Load AMCT "simple config" ``.cfg`` files (protobuf text format) with precise errors.

Two schemas (docs/spec/engine.md §2.1 ``AMCTDistillConfig``, docs/spec/engine.md §2.2 ``AMCTRetrainConfig``). Parsing is
done by ``google.protobuf.text_format.Parse``; everything it reports is turned into a
``ConfigError`` with ``path:line:column`` and a sentence that names the field
(cfg_parse_errors). The result is a ``CfgDocument`` (cfg_document): the message plus the
position of every field (cfg_scanner), so the semantic checks (cfg_checks) and the
layer-reference warnings (layer_refs) can point at the field they complain about too.

AMCT itself reads these files with ``text_format.Merge`` (last value wins, a second oneof
member silently replaces the first). We use ``Parse`` on purpose: a field or oneof given
twice is almost always a mistake, and we report it with its position.
"""

from __future__ import annotations

import errno
from pathlib import Path

from google.protobuf import text_format

from amct_engine.config import cfg_checks
from amct_engine.config.calibration_cfg import parse_calibration_cfg
from amct_engine.config.cfg_document import CfgDocument, decode_cfg_bytes
from amct_engine.config.cfg_layout import LAYOUTS, CfgKind
from amct_engine.config.cfg_parse_errors import convert_parse_error, missing_required_error
from amct_engine.config.cfg_scanner import MAX_NESTING, FieldSite, nesting_too_deep
from amct_engine.config.errors import ConfigError
from amct_engine.proto import distill_config_pytorch_pb2, retrain_config_pytorch_pb2

__all__ = [
    "CfgDocument",
    "CfgKind",
    "FieldSite",
    "load_cfg_document",
    "load_distill_cfg",
    "load_retrain_cfg",
    "parse_cfg_document",
    "parse_distill_cfg_text",
    "parse_retrain_cfg_text",
]



def parse_cfg_document(
    text: str | bytes, kind: CfgKind | str, path: str = "<string>", check: bool = True
) -> CfgDocument:
    """Parse ``.cfg`` text of ``kind`` ("retrain", "distill" or "calibration") into a CfgDocument.

    Raises ConfigError for syntax errors, unknown fields, bad values, fields or oneof
    members given twice, missing required fields and (when ``check``) the semantic
    checks of ``cfg_checks``. Warnings (e.g. repeated skip entries) go to ``warnings``.
    """
    if kind == "calibration":  # the PTQ cfg (docs/spec/engine.md §2.5) has its own checks and resolver
        return parse_calibration_cfg(text, path)
    if kind not in LAYOUTS:
        raise ValueError(f"kind must be 'retrain', 'distill' or 'calibration', got {kind!r}")
    msg_cls, path = LAYOUTS[kind].message_class, str(path)
    if isinstance(text, bytes):
        text = decode_cfg_bytes(text, path)
    if (opener := nesting_too_deep(text)) is not None:
        raise ConfigError(f"blocks are nested more than {MAX_NESTING} levels deep here; no AMCT cfg field "
                          "nests that far", path, opener.line, opener.column)
    message = msg_cls()
    try:
        # The recursion limit too: protobuf's own guard, should a text slip past the one above.
        text_format.Parse(text, message, max_recursion_depth=MAX_NESTING + 1)
    except text_format.ParseError as err:
        raise convert_parse_error(err, text, msg_cls, path) from None
    doc = CfgDocument.from_text(message, text, path)
    if (missing := missing_required_error(doc)) is not None:
        raise missing
    if check:
        (cfg_checks.check_retrain_cfg if kind == "retrain" else cfg_checks.check_distill_cfg)(doc)
    return doc


def load_cfg_document(path: str | Path, kind: CfgKind | str, check: bool = True) -> CfgDocument:
    """Read and parse the ``.cfg`` file at ``path``; see ``parse_cfg_document``."""
    p = Path(path)
    if not p.is_file():
        if p.exists():
            raise IsADirectoryError(errno.EISDIR, "config path is not a file", str(path))
        raise FileNotFoundError(errno.ENOENT, "config file not found", str(path))
    return parse_cfg_document(decode_cfg_bytes(p.read_bytes(), str(path)), kind, str(path), check)


def load_retrain_cfg(path: str | Path) -> retrain_config_pytorch_pb2.AMCTRetrainConfig:
    """Load a retrain / prune / compressed ``.cfg`` (docs/spec/engine.md §2.2), checked."""
    return load_cfg_document(path, "retrain").message


def load_distill_cfg(path: str | Path) -> distill_config_pytorch_pb2.AMCTDistillConfig:
    """Load a distillation ``.cfg`` (docs/spec/engine.md §2.1), checked."""
    return load_cfg_document(path, "distill").message


def parse_retrain_cfg_text(text: str, path: str = "<string>") -> retrain_config_pytorch_pb2.AMCTRetrainConfig:
    """Parse retrain ``.cfg`` text; ``path`` only names the source in error messages."""
    return parse_cfg_document(text, "retrain", path).message


def parse_distill_cfg_text(text: str, path: str = "<string>") -> distill_config_pytorch_pb2.AMCTDistillConfig:
    """Parse distillation ``.cfg`` text; ``path`` only names the source in error messages."""
    return parse_cfg_document(text, "distill", path).message
