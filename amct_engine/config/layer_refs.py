"""Layer names and types in a ``.cfg`` that the user's model does not have: a ``ConfigError`` each.

Layer names in configs are PyTorch module paths (docs/spec/engine.md §1.1, e.g. ``layer1.0.conv1``)
and layer types are module class names (``Conv2d``). AMCT raises for a skip or override entry that
names a layer the model lacks, or a type the tool does not support (its ``_check_proto_*`` and the
distill ``check_proto``), and so do we: a typo would otherwise quietly compress the layer the user
meant to protect, or leave out the override the user wrote. The error points at the entry
(``file:line:column``) and lists the closest real names. AMCT warns only about repeated skip
entries (cfg_checks de-duplicates those), docs/spec/engine.md §2.2.

Which names count: a name entry must be a module of the model whose type the API handles (a
``distill_group`` end may be any module of the model); a type entry must be one of the types the
API handles (for distillation: one the model has, as AMCT checks it). The callers pass those types.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path

from google.protobuf.message import Message

from amct_engine.config.cfg_document import CfgDocument
from amct_engine.config.cfg_layout import layout_of
from amct_engine.config.errors import ConfigError

# (repeated message field, string field in it, holds "name" or "type") beyond the overrides; the
# third element says whether any module of the model may be named there (True) or only a supported one.
_EXTRA_ENTRIES = {
    "distill": (
        ("distill_group", "start_layer_name", "name", True),
        ("distill_group", "end_layer_name", "name", True),
    ),
}

_MAX_LISTED_TYPES = 12


def _references(doc: CfgDocument) -> Iterator[tuple[str, str, str, tuple[int, int] | None, bool]]:
    """(kind "name"/"type", value, field it is in, position, any module allowed) for every reference."""
    msg = doc.message
    layout = layout_of(msg)
    entries = tuple((o.field, o.key, o.holds, False) for o in layout.overrides) + _EXTRA_ENTRIES.get(layout.kind, ())
    for kind, lists in (("name", layout.name_lists()), ("type", layout.type_lists())):
        for list_name in lists:
            for value in dict.fromkeys(getattr(msg, list_name)):  # each value once, in order
                # By value, not index: the loader may have removed repeats from the list.
                yield kind, value, list_name, doc.position_of_value(list_name, value), False
    for list_name, key, kind, any_module in entries:
        for i, entry in enumerate(getattr(msg, list_name)):
            path = f"{list_name}[{i}].{key}"
            yield kind, getattr(entry, key), path, doc.locate(path), any_module


def _suggest(value: str, known: list[str], kind: str) -> str:
    close = difflib.get_close_matches(value, known, n=3, cutoff=0.6)
    if not close:
        # Case differences ("conv2d") are not caught by difflib's ratio on short words.
        close = [k for k in known if k.lower() == value.lower()]
    if close:
        quoted = [f'"{c}"' for c in close]
        listed = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
        return f" (did you mean {listed}?)"
    if kind == "type" and known:
        shown = ", ".join(known[:_MAX_LISTED_TYPES]) + (", ..." if len(known) > _MAX_LISTED_TYPES else "")
        return f" (supported layer types: {shown})"
    return ""


def check_layer_references(
    cfg_msg: CfgDocument | Message,
    layer_types: Mapping[str, str],
    path: str | Path | None = None,
    *,
    supported_types: Collection[str] | None = None,
) -> None:
    """Raise a ConfigError for the first layer name / type (in file order) the cfg references that
    the model lacks, with the closest real names.

    ``layer_types`` maps every module path of the model to its class name, e.g.
    ``{name: type(m).__name__ for name, m in model.named_modules()}``. ``supported_types``: the
    class names the API compresses (None: every type of the model). ``cfg_msg`` is a CfgDocument
    (errors carry positions) or a parsed AMCTRetrainConfig / AMCTDistillConfig, whose positions
    are then read from ``path`` if it is a file.
    """
    doc = CfgDocument.of(cfg_msg, path)
    types = sorted(set(supported_types) if supported_types is not None else set(layer_types.values()))
    modules = {n: t for n, t in layer_types.items() if n}  # "" is the root module
    layers = sorted(n for n, t in modules.items() if t in types)
    errors: list[ConfigError] = []
    for kind, value, field_path, pos, any_module in _references(doc):
        if not value:
            continue  # empty names are cfg_checks' business
        text = _problem(kind, value, field_path, any_module, modules, layers, types)
        if text:
            line, column = pos or (None, None)
            errors.append(ConfigError(text, doc.path, line, column, field_path))
    if errors:
        raise min(errors, key=lambda e: (e.line if e.line is not None else float("inf"), e.column or 0))


def _problem(kind, value, field_path, any_module, modules, layers, types) -> str | None:
    if kind == "type":
        if value in types:
            return None
        return f'layer type "{value}" in {field_path} is not a supported layer type{_suggest(value, types, kind)}'
    if value in modules and (any_module or value in layers):
        return None
    if value in modules:
        listed = ", ".join(types[:_MAX_LISTED_TYPES])
        return (
            f'layer "{value}" in {field_path} is a {modules[value]}, which is not a supported layer type '
            f"(supported: {listed})"
        )
    known = sorted(modules) if any_module else layers
    return f'layer "{value}" in {field_path} is not in the model{_suggest(value, known, kind)}'
