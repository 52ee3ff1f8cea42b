"""What each quantisable layer type does, for every pass that asks (the torch side of amct_engine/layer_table.py).

A `LayerBehaviour` is one layer family's answers: its output channels and where they sit in its
weight, what it computes with a substituted (integer) weight and bias, its multiply-accumulates, and
how an ONNX file writes it. `behaviour_of(module)` finds the entry of the module's class (along its
MRO, so a subclass of nn.Conv2d is a Conv2d) in the layer-type table. Adding a type: docs/architecture.md,
"Add a layer type".
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from amct_engine.layer_table import LAYER_TYPES, LayerTypeEntry


class LayerBehaviour:
    """The questions the engine's passes ask of a quantisable layer; subclasses answer them per family."""

    # ORT runs it in int8 kernels (QLinearConv, QGemm, MatMulInteger) when its input is INT8
    int8_kernel = True
    # axis 0 of its weight holds one filter per output channel (pruning masks, sensitivity, importance)
    rows_are_output_channels = True
    # a matrix product: ORT runs it on its GEMM kernels (QGemm, MatMulInteger), whose selectors want every
    # zero point written and whose u8s8 form saturates without VNNI (export/backends.py)
    matmul_like = False

    def out_channels(self, module: nn.Module) -> int:
        raise NotImplementedError

    def input_channel_axis(self, module: nn.Module) -> int:
        """The axis of its weight that runs over input channels (4:2 selective pruning groups along it)."""
        return 1

    def weight_groups(self, module: nn.Module) -> int | None:
        """Groups the weight's output channels are split in across axis 1 (a transposed conv), else None."""
        return None

    def per_out_channel(self, values: torch.Tensor, module: nn.Module) -> torch.Tensor:
        """A per-output-channel vector (or a scalar) spread to the weight's shape."""
        weight = module.weight
        values = values.to(weight.device).float().reshape(-1)
        return values.reshape([-1] + [1] * (weight.dim() - 1)).expand(weight.shape)

    def output_channel_axis(self, rank: int) -> int:
        """The channel axis of its output of `rank` dimensions."""
        return 1

    def output_channel_shape(self, n: int, rank: int) -> list[int]:
        """The shape that broadcasts a per-output-channel vector of `n` (or a scalar) over its output."""
        return [] if n == 1 else [1, n] + [1] * (rank - 2)

    def call(self, module: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        """What it computes on `x` with `weight` and `bias` in place of its own."""
        raise NotImplementedError

    def macs(self, module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
        """Multiply-accumulates for one sample (`x`, `y`: its input and output for that sample)."""
        return int(y.numel() * module.weight[0].numel())

    def output_rank(self, module: nn.Module) -> int:
        """The rank of its output as the exporter sees it."""
        raise NotImplementedError

    def write(
        self, g, x, module: nn.Module, weight, bias, *, input_rank: int | None, stored: str = "torch", **attrs: Any
    ):
        """Write the layer's op on ONNX values `x`, `weight`, `bias` (None: no bias) with export.layer_graph's
        builder `g`. `stored` says how `weight` is laid out: "torch" (the module's own layout) or, for a
        matmul-like layer, "transposed" ([in, out], what a MatMul reads); `attrs` go on every node written."""
        raise NotImplementedError

    def reads_normalised_channels(self, output_rank: Callable[[], int | None]) -> bool:
        """Whether a BatchNorm (axis 1) right after it normalises its output channels; `output_rank()` (None:
        unknown) runs a shape propagation, so only a layer whose answer depends on it calls it."""
        return True


def entry_of(module: nn.Module) -> LayerTypeEntry | None:
    """The layer-type table's entry for the module's class or its nearest registered base."""
    classes = _classes(tuple(LAYER_TYPES.values()))
    return next((classes[cls] for cls in type(module).__mro__ if cls in classes), None)


@functools.lru_cache(maxsize=8)
def _classes(entries: tuple[LayerTypeEntry, ...]) -> dict[type, LayerTypeEntry]:
    # keyed by the table's contents, so a registration (a plugin, a test) is seen at once
    return {entry.module_type(): entry for entry in entries}


def behaviour_of(module: nn.Module) -> LayerBehaviour:
    """The behaviour of a quantisable layer; TypeError for a module of a type the table lacks."""
    entry = entry_of(module)
    if entry is None:
        raise TypeError(f"{type(module).__name__} is not a quantisable layer type (amct_engine/layer_table.py)")
    return entry.behaviour()


def is_table_class(module: nn.Module) -> bool:
    """Whether the module's own class is in the table (capture keeps it a leaf; a subclass with a forward of
    its own, such as a weight-standardised conv, is traced through as before)."""
    return type(module) in _classes(tuple(LAYER_TYPES.values()))
