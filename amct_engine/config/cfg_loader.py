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

from pathlib import Path

from amct_engine.config import cfg_checks
from amct_engine.config.calibration_cfg import parse_calibration_cfg
from amct_engine.config.cfg_document import CfgDocument, read_cfg_file
from amct_engine.config.cfg_layout import LAYOUTS, CfgKind
from amct_engine.config.cfg_parse_errors import parse_cfg_message
from amct_engine.config.cfg_scanner import FieldSite
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
        return parse_calibration_cfg(text, path, check)
    if kind not in LAYOUTS:
        raise ValueError(f"kind must be 'retrain', 'distill' or 'calibration', got {kind!r}")
    doc = parse_cfg_message(text, LAYOUTS[kind].message_class, str(path))
    if check:
        (cfg_checks.check_retrain_cfg if kind == "retrain" else cfg_checks.check_distill_cfg)(doc)
    return doc


def load_cfg_document(path: str | Path, kind: CfgKind | str, check: bool = True) -> CfgDocument:
    """Read and parse the ``.cfg`` file at ``path``; see ``parse_cfg_document``."""
    return parse_cfg_document(read_cfg_file(path), kind, str(path), check)


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
