"""The quantisable layer types, in one table (docs/spec/engine.md §4.9; docs/architecture.md, "Add a layer type").

One `LayerTypeEntry` per torch.nn class says what the cfg side needs to know without torch (its name,
which APIs compress it, whether its weights may take per-channel scales) and names the
`amct_engine.layers` behaviour that does the rest: how capture lifts its calls, how its weight is laid
out for quantisation, what it computes with substituted integer weights, how each ONNX file writes it,
and its multiply-accumulates for reports. Pruning asks the layer-pruner table
(amct_engine/prune/layer_pruners.py), which is keyed by the same classes.

Torch-free on purpose: the cfg checks and the API's upload checks read the names; the behaviour is
loaded on first use (`LayerTypeEntry.behaviour()`), as the weight-quantiser table loads its classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from amct_engine.registry import Registry, load_object


@dataclass(frozen=True)
class LayerTypeEntry:
    name: str  # the torch.nn class name, as cfgs, JSON configs and records name the type ("Conv2d")
    module_class: str  # "torch.nn:Conv2d"
    implementation: str  # "package.module:attribute", a amct_engine.layers.LayerBehaviour
    retrain: bool = True  # QAT and PTQ quantise it
    distill: bool = False  # distillation quantises it
    # AMCT allows only per-tensor weight scales for some types; we keep that as the default but honour an
    # explicit `channel_wise: true` (config/resolve.py).
    channel_wise_default: bool = True
    selective_prune: bool = False  # 4:2 selective pruning applies (docs/spec/engine.md §4.5)

    def behaviour(self) -> Any:
        return load_object(self.implementation)

    def module_type(self) -> type:
        return load_object(self.module_class)


LAYER_TYPES: Registry[LayerTypeEntry] = Registry("layer type")


def register_layer_type(entry: LayerTypeEntry, *, replace: bool = False) -> LayerTypeEntry:
    return LAYER_TYPES.register(entry.name, entry, replace=replace)


def retrain_type_names() -> tuple[str, ...]:
    """The types QAT and PTQ quantise (AMCT's RETRAIN_TYPES, without LSTM/GRU)."""
    return tuple(name for name, entry in LAYER_TYPES.items() if entry.retrain)


def distill_type_names() -> tuple[str, ...]:
    """The types distillation quantises (AMCT's distill layer types)."""
    return tuple(name for name, entry in LAYER_TYPES.items() if entry.distill)


def selective_type_names() -> tuple[str, ...]:
    return tuple(name for name, entry in LAYER_TYPES.items() if entry.selective_prune)


def per_tensor_default_types() -> frozenset[str]:
    """The types whose weights get one scale unless a cfg asks for channel_wise."""
    return frozenset(name for name, entry in LAYER_TYPES.items() if not entry.channel_wise_default)


_CONV = "amct_engine.layers.conv:CONV"
_CONV_TRANSPOSE = "amct_engine.layers.conv:CONV_TRANSPOSE"
for _name in ("Conv1d", "Conv3d"):
    register_layer_type(LayerTypeEntry(_name, f"torch.nn:{_name}", _CONV))
register_layer_type(LayerTypeEntry("Conv2d", "torch.nn:Conv2d", _CONV, distill=True, selective_prune=True))
register_layer_type(
    LayerTypeEntry("ConvTranspose2d", "torch.nn:ConvTranspose2d", _CONV_TRANSPOSE, selective_prune=True)
)
# AMCT allows only per-tensor weight scales for a Linear; a transformer's FFN output projection has weight
# outliers (all-MiniLM-L6-v2: max|W| is 175 standard deviations) that leave most of its weights at 0 under one
# per-tensor INT8 scale, hence `channel_wise: true` is honoured (and every export back end handles it).
register_layer_type(
    LayerTypeEntry(
        "Linear",
        "torch.nn:Linear",
        "amct_engine.layers.linear:LINEAR",
        distill=True,
        channel_wise_default=False,
        selective_prune=True,
    )
)
