"""Warn about layer names and types in a ``.cfg`` that the user's model does not have.

Layer names in configs are PyTorch module paths (docs/spec/engine.md §1.1, e.g. ``layer1.0.conv1``) and
layer types are module class names (``Conv2d``). A name that matches nothing is silently
ignored by AMCT, so a typo quietly disables a skip or an override; we say so, with the
closest real names. These are warnings, not errors: shared example cfgs use placeholders
such as "Optype", and a cfg may be written for several models.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from pathlib import Path

from google.protobuf.message import Message

from amct_engine.config.cfg_document import CfgDocument
from amct_engine.config.cfg_layout import layout_of

# (repeated message field, string field in it, holds "name" or "type") beyond the overrides.
_EXTRA_ENTRIES = {
    "distill": (
        ("distill_group", "start_layer_name", "name"),
        ("distill_group", "end_layer_name", "name"),
    ),
}

_MAX_LISTED_TYPES = 12


def _references(doc: CfgDocument) -> Iterator[tuple[str, str, str, tuple[int, int] | None]]:
    """(kind "name"/"type", value, field it is in, position) for every reference."""
    msg = doc.message
    layout = layout_of(msg)
    name_lists, type_lists = layout.name_lists(), layout.type_lists()
    entries = tuple((o.field, o.key, o.holds) for o in layout.overrides) + _EXTRA_ENTRIES.get(layout.kind, ())
    for kind, lists in (("name", name_lists), ("type", type_lists)):
        for list_name in lists:
            for value in dict.fromkeys(getattr(msg, list_name)):  # each value once, in order
                # By value, not index: the loader may have removed repeats from the list.
                yield kind, value, list_name, doc.position_of_value(list_name, value)
    for list_name, key, kind in entries:
        for i, entry in enumerate(getattr(msg, list_name)):
            yield kind, getattr(entry, key), f"{list_name}[{i}].{key}", doc.locate(f"{list_name}[{i}].{key}")


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
        return f" (the model's layer types are: {shown})"
    return ""


def check_layer_references(
    cfg_msg: CfgDocument | Message,
    layer_types: Mapping[str, str],
    path: str | Path | None = None,
) -> list[str]:
    """Warn (ConfigWarning, a UserWarning) for each layer name / type the cfg references
    that the model lacks; return the warning texts.

    ``layer_types`` maps every module path of the model to its class name, e.g.
    ``{name: type(m).__name__ for name, m in model.named_modules()}``. ``cfg_msg`` is a
    CfgDocument (warnings carry positions) or a parsed AMCTRetrainConfig /
    AMCTDistillConfig, whose positions are then read from ``path`` if it is a file.
    """
    doc = CfgDocument.of(cfg_msg, path)
    names = sorted(n for n in layer_types if n)  # "" is the root module
    types = sorted(set(layer_types.values()))
    known = {"name": set(names), "type": set(types)}
    texts = []
    for kind, value, field_path, pos in _references(doc):
        if not value or value in known[kind]:
            continue  # empty names are cfg_checks' business
        if kind == "name":
            text = f'layer "{value}" in {field_path} is not in the model{_suggest(value, names, kind)}'
        else:
            hint = _suggest(value, types, kind)
            text = f'layer type "{value}" in {field_path} matches no layer of the model{hint}'
        texts.append(doc.warn(field_path, text, position=pos))
    return texts
