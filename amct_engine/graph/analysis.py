"""Analyses over a ``CapturedModel``: which layers can be compressed (docs/spec/engine.md §4.9), conv→BN→activation
chains, and whether a layer reads a ReLU's output. Distillation groups: graph/distill_groups.py.

"Consumer" always means an fx user of a node. A ``call_function``/``call_method`` user (flatten, view,
add) is not a module, so it ends a chain: the module after it is not a single consumer of the one
before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import fx, nn

from amct_engine.graph import layer_types
from amct_engine.graph.capture import CapturedModel
from amct_engine.graph.lifting import op_name
from amct_engine.graph.shapes import node_shapes
from amct_engine.layer_table import retrain_type_names
from amct_engine.layers import behaviour_of

BN_TYPES: tuple[str, ...] = tuple(t.__name__ for t in layer_types.BN_TYPES)


ACTIVATION_TYPES: tuple[str, ...] = ("ReLU", "ReLU6", "LeakyReLU", "Sigmoid", "Tanh", "Softmax")
# functional spellings (F.relu, torch.relu, x.relu_(), aten.relu.default …) → the module they equal
ACTIVATION_FUNCTIONS: dict[str, str] = {
    "relu": "ReLU",
    "relu_": "ReLU",
    "relu6": "ReLU6",
    "leaky_relu": "LeakyReLU",
    "leaky_relu_": "LeakyReLU",
    "sigmoid": "Sigmoid",
    "sigmoid_": "Sigmoid",
    "tanh": "Tanh",
    "tanh_": "Tanh",
    "softmax": "Softmax",
    "_softmax": "Softmax",
}


@dataclass(frozen=True)
class LayerInfo:
    name: str
    type_name: str
    module: nn.Module


@dataclass(frozen=True)
class Chain:
    """A conv/linear layer and the BN and activation right after it.

    ``act`` is the activation *module* path (None when there is none or it is a function call);
    ``act_type`` names the activation either way (``"ReLU"`` for ``nn.ReLU`` and ``F.relu`` alike).
    """

    layer: str
    bn: str | None = None
    act: str | None = None
    act_type: str | None = None

    @property
    def members(self) -> list[str]:
        return [m for m in (self.layer, self.bn, self.act) if m]


def quantizable_layers(cm: CapturedModel, types: Sequence[str] | None = None) -> list[LayerInfo]:
    """Layers of the given class names (default: the types QAT and PTQ quantise) that pass the
    docs/spec/engine.md §4.9 exclusions, in topological order."""
    types = retrain_type_names() if types is None else types
    excluded = excluded_layers(cm, types)
    return [
        LayerInfo(name, type_name, cm.get_module(name))
        for name, type_name in cm.module_types().items()
        if type_name in types and name not in excluded
    ]


def excluded_layers(cm: CapturedModel, types: Sequence[str] | None = None) -> dict[str, str]:
    """Layer name → why a layer of a supported type cannot be compressed (docs/spec/engine.md §4.9)."""
    types = retrain_type_names() if types is None else types
    shared = shared_weights(cm.module)
    reasons = {}
    for name, type_name in cm.module_types().items():
        reason = _exclusion_reason(cm, name, shared) if type_name in types else None
        if reason:
            reasons[name] = reason
    return reasons


def _exclusion_reason(cm: CapturedModel, name: str, shared: dict[str, list[str]]) -> str | None:
    module = cm.get_module(name)
    padding_mode = getattr(module, "padding_mode", "zeros")
    if padding_mode != "zeros":
        return f"padding_mode is '{padding_mode}'; only 'zeros' is supported (docs/spec/engine.md §4.9)"
    if type(module).__name__ == "Conv3d" and module.dilation[0] != 1:
        return f"Conv3d with dilation[0] = {module.dilation[0]}; only 1 is supported (docs/spec/engine.md §4.9)"
    calls = cm.call_count(name)
    if calls > 1:
        return (
            f"the module is called {calls} times in forward; reused modules are not supported "
            "(docs/spec/engine.md §4.9)"
        )
    sharers = shared.get(name)
    if sharers:
        return (
            f"its weight Parameter is shared with {', '.join(sharers)}; shared weights are not "
            "supported (docs/spec/engine.md §4.9)"
        )
    return None


def shared_weights(root: nn.Module) -> dict[str, list[str]]:
    """Module path → the other paths holding the same weight Parameter (compression and pruning skip them)."""
    owners: dict[int, list[str]] = {}
    for name, module in root.named_modules(remove_duplicate=False):
        weight = module._parameters.get("weight")
        if weight is not None:
            owners.setdefault(id(weight), []).append(name)
    return {name: [o for o in names if o != name] for names in owners.values() if len(names) > 1 for name in names}


def conv_bn_act_chains(cm: CapturedModel, types: Sequence[str] | None = None) -> list[Chain]:
    """For every quantizable layer: the BN that is its single consumer and the activation after that.

    A BN counts only when it normalises the layer's output channels: a BatchNorm reads axis 1, a
    Linear writes its features on the last axis, so a Linear on a 3-D/4-D input followed by a
    BatchNorm of another axis (AMCT's LinearIn3/LinearIn4, Conv2dLinear) keeps its BN apart; folding
    it would scale the Linear's rows with another axis's factors.
    """
    types = retrain_type_names() if types is None else types
    chains = []
    ranks = _OutputRanks(cm)
    for info in quantizable_layers(cm, types):
        node = cm.nodes_of(info.name)[0]
        bn = single_consumer(node)
        if not (
            is_module_of(cm, bn, BN_TYPES)
            and cm.call_count(bn.target) == 1
            and _bn_reads_layer_channels(info.module, cm.get_module(bn.target), ranks(node))
        ):
            bn = None
        act = single_consumer(bn or node)
        act_type = activation_type(cm, act)
        act_module = act.target if act_type and act.op == "call_module" else None
        chains.append(Chain(info.name, bn.target if bn else None, act_module, act_type))
    return chains


class _OutputRanks:
    """Output rank of a node, from one shape propagation run only when a Linear asks."""

    def __init__(self, cm: CapturedModel) -> None:
        self.cm, self.shapes = cm, None

    def __call__(self, node: fx.Node):
        return lambda: self._rank(node)

    def _rank(self, node: fx.Node) -> int | None:
        if self.shapes is None:
            try:
                self.shapes = node_shapes(self.cm)[0]
            except Exception:  # a graph shape propagation cannot run: decide by the feature count alone
                self.shapes = {}
        shape = self.shapes.get(node.name)
        return None if shape is None else len(shape)


def _bn_reads_layer_channels(layer: nn.Module, bn: nn.Module, output_rank) -> bool:
    """True when ``bn`` (axis 1) normalises the output channels of ``layer``."""
    channels = getattr(layer, "out_channels", getattr(layer, "out_features", None))
    if getattr(bn, "num_features", None) != channels:
        return False
    return behaviour_of(layer).reads_normalised_channels(output_rank)


def input_non_negative(cm: CapturedModel, name: str) -> bool:
    """True when every call of ``name`` reads a non-negative activation's output (ReLU, ReLU6, a sigmoid gate,
    softplus), directly or through ops that keep it non-negative.

    Decides the ULQ ``fixed_min`` default. AMCT looks for a direct ReLU producer only; we also take ReLU6 and
    the other activations that never go below 0, and look through pooling, flatten/reshape and dropout
    (``_SIGN_KEEPING``), so the first Linear after ReLU → max-pool → flatten gets clip_min 0 too: twice the
    codes for its range, and a deploy graph in which onnxruntime folds the ReLU into the int8 conv instead of a
    Clip on codes (docs/spec/engine.md §4.1).
    """
    return _every_call_reads(cm, name, _is_non_negative)


def input_bounded_below(cm: CapturedModel, name: str) -> bool:
    """True when every call of ``name`` reads an activation with a small negative minimum (SiLU -0.28, hardswish
    -0.375, GELU -0.17, Mish, ELU...), directly or through sign-keeping ops: its ULQ quantiser starts from the
    asymmetric IFMR search, which keeps the data's minimum, instead of AMCT's symmetric one, which spends half of
    the codes on values below that minimum (docs/spec/engine.md §4.1)."""
    return _every_call_reads(cm, name, _is_bounded_below)


def _every_call_reads(cm: CapturedModel, name: str, producer_test) -> bool:
    nodes = cm.nodes_of(name)
    if not nodes:
        raise ValueError(f"Layer '{name}' is not called in the model's forward")
    return all(_reads(cm, node.args[0] if node.args else None, producer_test) for node in nodes)


# Ops whose output is non-negative wherever their (first) input is: a max or mean of non-negative values
# (max-pooling pads with -inf, average pooling with zeros), a new shape, dropout's scaled copy.
_SIGN_KEEPING_MODULES = (
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "Flatten",
    "Dropout",
    "Dropout2d",
    "Identity",
)
_SIGN_KEEPING_FUNCTIONS = (
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "max_pool1d_with_indices",
    "max_pool2d_with_indices",
    "adaptive_max_pool1d",
    "adaptive_max_pool2d",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_avg_pool3d",
    "flatten",
    "view",
    "reshape",
    "_unsafe_view",
    "contiguous",
    "dropout",
    "clone",
    "split",  # a C2f block's halves: each part of a tensor has its sign
    "split_with_sizes",
    "chunk",
    "getitem",
    "narrow",
    "slice",
)


def _reads(cm: CapturedModel, node: Any, producer_test) -> bool:
    while isinstance(node, fx.Node):
        if producer_test(cm, node):
            return True
        gated = _gated_input(cm, node)
        if gated is not None:
            node = gated
            continue
        if not _keeps_sign(cm, node) or not node.args:
            return False
        node = node.args[0]
    return False


_GATES = ({"Sigmoid", "Hardsigmoid"}, {"sigmoid", "hardsigmoid"})
_MULS = {"mul", "mul_", "__mul__", "<built-in function mul>"}


def _gated_input(cm: CapturedModel, node: fx.Node) -> fx.Node | None:
    """x of x * gate with a gate in [0, 1] (a squeeze-excite block's sigmoid): the product keeps x's sign and
    lies no lower than x's minimum, so what holds of x's producer holds of it."""
    name = function_name(node) if node.op in ("call_function", "call_method") else None
    if name not in _MULS and str(node.target) not in _MULS:
        return None
    args = [a for a in node.args[:2] if isinstance(a, fx.Node)]
    if len(args) != 2:
        return None
    for x, gate in (args, args[::-1]):
        if _activation_in(cm, gate, _GATES):
            return x
    return None


def _keeps_sign(cm: CapturedModel, node: fx.Node) -> bool:
    if node.op == "call_module":
        return type(cm.get_module(node.target)).__name__ in _SIGN_KEEPING_MODULES
    if node.op in ("call_function", "call_method"):
        return function_name(node) in _SIGN_KEEPING_FUNCTIONS
    return False


# Activations whose output is never negative, and those whose minimum is small and negative, as modules and as
# functions (F.*, torch.*; the captures keep activation modules as modules).
_NON_NEGATIVE = (
    {"ReLU", "ReLU6", "Sigmoid", "Hardsigmoid", "Softplus"},
    {"relu", "relu_", "relu6", "sigmoid", "sigmoid_", "hardsigmoid", "hardsigmoid_", "softplus"},
)
_BOUNDED_BELOW = (
    {"SiLU", "Hardswish", "GELU", "Mish", "ELU", "CELU", "SELU"},
    {"silu", "silu_", "hardswish", "hardswish_", "gelu", "mish", "elu", "elu_", "celu", "selu"},
)


def _activation_in(cm: CapturedModel, node: Any, kinds: tuple[set[str], set[str]]) -> bool:
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_module":
        return type(cm.get_module(node.target)).__name__ in kinds[0]
    return node.op in ("call_function", "call_method") and function_name(node) in kinds[1]


def _is_non_negative(cm: CapturedModel, node: Any) -> bool:
    return _activation_in(cm, node, _NON_NEGATIVE)


def _is_bounded_below(cm: CapturedModel, node: Any) -> bool:
    return _activation_in(cm, node, _BOUNDED_BELOW)


def single_consumer(node: fx.Node | None) -> fx.Node | None:
    if node is None or len(node.users) != 1:
        return None
    return next(iter(node.users))


def module_type_name(cm: CapturedModel, name: str) -> str:
    return type(cm.get_module(name)).__name__


def is_module_of(cm: CapturedModel, node: fx.Node | None, types: Sequence[str]) -> bool:
    return node is not None and node.op == "call_module" and module_type_name(cm, node.target) in types


def activation_type(cm: CapturedModel, node: fx.Node | None) -> str | None:
    if node is None:
        return None
    if node.op == "call_module":
        type_name = module_type_name(cm, node.target)
        return type_name if type_name in ACTIVATION_TYPES else None
    if node.op in ("call_function", "call_method"):
        return ACTIVATION_FUNCTIONS.get(function_name(node))
    return None


def function_name(node: fx.Node) -> str | None:
    if node.op == "call_method":
        return node.target
    return op_name(node.target) or getattr(node.target, "__name__", None)


def describe_node(cm: CapturedModel, node: fx.Node) -> str:
    if node.op == "call_module":
        return f"'{node.target}' ({module_type_name(cm, node.target)})"
    return f"`{node.name}` ({node.op} {function_name(node) or node.target})"


def dedupe(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))
