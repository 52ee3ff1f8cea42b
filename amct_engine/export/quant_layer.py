"""Export form of one quantised layer: BN folded, record factors applied, integer weights ready.

`ExportQuantLayer` computes the deployed result in PyTorch, so tracing sees real shapes and values,
and is a placeholder in the traced graph (export.layer_graph); each file's layer writer (an
`OnnxFormat`'s `layer_writer`, amct_engine.export.backends) then writes its nodes there, which is
how one traced graph gives several formats.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from amct_engine.export.layer_graph import LayerPlaceholder
from amct_engine.quant.deployed import (
    QuantFactors,
    compute_factors,  # noqa: F401  (its import path before quant.deployed)
    deployed_forward,
)


class LayerWriter(Protocol):
    """Writes one layer into a graph (`g` is an export.layer_graph.OnnxBuilder, `x` the input tensor's name)."""

    def emit(self, g, x, module: nn.Module): ...


class ExportQuantLayer(LayerPlaceholder):
    """Eval-only stand-in for a QuantRetrainLayer while exporting: BN folded, factors fixed.

    The factors are plain tensors, not parameters: the TorchScript tracer fails on parameters
    read inside an autograd Function's forward.
    """

    def __init__(self, name: str, layer: nn.Module, factors: QuantFactors):
        super().__init__(name, layer)
        self.factors = factors

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        return deployed_forward(self.layer, self.factors, x)
