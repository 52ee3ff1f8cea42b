"""Export form of one quantised layer: BN folded, record factors applied, integer weights ready.

`ExportQuantLayer.forward` computes the deployed result in PyTorch (so tracing sees real shapes
and values); its autograd function's `symbolic` hands the ONNX emission to the layer writer the
layer was built with (an `OnnxFormat`'s `layer_writer`, amct_engine.export.backends), which is
how one export pipeline writes several formats.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from amct_engine.quant.deployed import (
    QuantFactors,
    compute_factors,  # noqa: F401  (its import path before quant.deployed)
    deployed_forward,
)


class LayerWriter(Protocol):
    """Writes one quantised layer into the graph being exported (a torch.onnx symbolic)."""

    def emit(self, g, x, module: ExportQuantLayer): ...


class _ModuleRef:
    """Opaque holder: the tracer rejects an nn.Module passed straight to Function.apply."""

    def __init__(self, module: ExportQuantLayer):
        self.module = module


class _QuantLayerFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ref: _ModuleRef):
        module = ref.module
        return deployed_forward(module.layer, module.factors, x)

    @staticmethod
    def symbolic(g, x, ref: _ModuleRef):
        return ref.module.writer.emit(g, x, ref.module)


class ExportQuantLayer(nn.Module):
    """Eval-only stand-in for a QuantRetrainLayer while exporting: BN folded, factors fixed.

    The factors are plain tensors, not parameters: the TorchScript tracer fails on parameters
    read inside an autograd Function's forward.
    """

    def __init__(self, name: str, layer: nn.Module, factors: QuantFactors, writer: LayerWriter):
        super().__init__()
        self.layer_name = name
        self.layer = layer
        self.writer = writer
        self.factors = factors

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _QuantLayerFunction.apply(x, _ModuleRef(self))
