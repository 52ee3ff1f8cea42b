"""Tensor shapes of a captured graph: one eval forward with the captured example inputs (``ShapeProp``).

The channel dependency builder (amct_engine.prune.dependency) needs every node's shape to follow
channels through reshapes; the conv→BN chain analysis (analysis.py) needs a Linear's output rank to
know whether a following BatchNorm normalises the Linear's features or another axis.
"""

from __future__ import annotations

import copy

import torch
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from amct_engine.graph.capture import CapturedModel


def node_shapes(cm: CapturedModel) -> tuple[dict[str, tuple[int, ...] | None], list[tuple[int, ...]]]:
    """Node name → output shape (None when not one tensor), and the model's output shapes."""
    gm = copy.deepcopy(cm.graph_module).eval()
    with torch.no_grad():
        result = ShapeProp(gm).propagate(*cm.example_inputs)
    shapes = {}
    for node in gm.graph.nodes:
        meta = node.meta.get("tensor_meta")
        shapes[node.name] = tuple(meta.shape) if isinstance(meta, TensorMetadata) else None
    outputs = []
    fx.node.map_aggregate(result, lambda v: outputs.append(tuple(v.shape)) if isinstance(v, torch.Tensor) else v)
    return shapes, outputs
