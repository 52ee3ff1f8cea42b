"""Which quantised layers may hand their output on already quantised (integer kernels end to end).

AMCT quantises layer inputs only; its deploy graph dequantises every layer output to float. When
a layer's output reaches the next quantised layer only through ReLU, max-pooling, flattening or
identities, quantising that output with the *next* layer's input quantiser changes nothing:
those ops commute with a monotone quantiser (relu(q(y)) = q(relu(y)) because 0 is always
representable; max(q(a), q(b)) = q(max(a, b))). Writing that quantiser right after the layer lets
onnxruntime fuse DequantizeLinear -> Conv -> QuantizeLinear into one QLinearConv.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import fx, nn

from amct_engine.graph.capture import capture_model
from amct_engine.quant.retrain_layer import QuantRetrainLayer

COMMUTING_MODULES = (nn.ReLU, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.Flatten, nn.Identity, nn.Dropout)
COMMUTING_FUNCTIONS = {torch.relu, F.relu, torch.flatten, F.max_pool1d, F.max_pool2d, F.max_pool3d,
                       operator.getitem}
COMMUTING_METHODS = {"relu", "flatten", "view", "reshape"}


def _commutes(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    if node.op == "call_module":
        return isinstance(modules[node.target], COMMUTING_MODULES)
    if node.op == "call_function":
        # getitem only on a max-pool's (values, indices) pair would matter; we never see one
        # because max_pool with return_indices is not in the list.
        return node.target in COMMUTING_FUNCTIONS and node.target is not operator.getitem
    return node.op == "call_method" and node.target in COMMUTING_METHODS


def requant_targets(model: nn.Module, input_data: tuple[torch.Tensor, ...]) -> dict[str, str]:
    """Quantised layer path -> the quantised layer whose input quantiser may requantise its output."""
    captured = capture_model(model, input_data, reject_amct_ops=False)
    modules = dict(captured.graph_module.named_modules())
    targets = {}
    for node in captured.graph.nodes:
        if node.op != "call_module" or not isinstance(modules[node.target], QuantRetrainLayer):
            continue
        current = node
        while len(current.users) == 1:
            user = next(iter(current.users))
            if user.op == "call_module" and isinstance(modules[user.target], QuantRetrainLayer):
                if user.args and user.args[0] is current and captured.call_count(user.target) == 1 \
                        and captured.call_count(node.target) == 1:
                    targets[node.target] = user.target
                break
            if not _commutes(user, modules) or not user.args or user.args[0] is not current:
                break
            current = user
    return targets
