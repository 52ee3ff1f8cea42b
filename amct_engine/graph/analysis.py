"""Analyses over a ``CapturedModel``: which layers can be compressed (docs/spec/engine.md §4.9), conv→BN→activation
chains, and distillation groups (docs/spec/engine.md §6.1).

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
from amct_engine.layer_table import distill_type_names, retrain_type_names
from amct_engine.layers import behaviour_of

DISTILL_BN_TYPES: tuple[str, ...] = ("BatchNorm2d",)
# ONNX Relu, LeakyRelu, Sigmoid, Tanh, Softmax (DISTILL_ACTIVATION_ONNX_TYPES) as modules
DISTILL_ACTIVATION_TYPES: tuple[str, ...] = ("ReLU", "LeakyReLU", "Sigmoid", "Tanh", "Softmax")
BN_TYPES: tuple[str, ...] = tuple(t.__name__ for t in layer_types.BN_TYPES)


def _distill_module_types() -> tuple[str, ...]:
    return distill_type_names() + DISTILL_BN_TYPES + DISTILL_ACTIVATION_TYPES


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
        bn = _single_consumer(node)
        if not (
            _is_module_of(cm, bn, BN_TYPES)
            and cm.call_count(bn.target) == 1
            and _bn_reads_layer_channels(info.module, cm.get_module(bn.target), ranks(node))
        ):
            bn = None
        act = _single_consumer(bn or node)
        act_type = _activation_type(cm, act)
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


def input_from_relu(cm: CapturedModel, name: str) -> bool:
    """True when every call of ``name`` reads a ReLU's output, directly or through ops that keep it non-negative.

    Decides the ULQ ``fixed_min`` default: a ReLU output is never negative. AMCT looks at the direct producer
    only; we also look through pooling, flatten/reshape and dropout (``_SIGN_KEEPING``), so the first Linear
    after ReLU → max-pool → flatten gets clip_min 0 too: twice the codes for its range, and a deploy graph in
    which onnxruntime folds the ReLU into the int8 conv instead of a Clip on codes (docs/spec/engine.md §4.1).
    """
    nodes = cm.nodes_of(name)
    if not nodes:
        raise ValueError(f"Layer '{name}' is not called in the model's forward")
    return all(_reads_relu(cm, node.args[0] if node.args else None) for node in nodes)


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
)


def _reads_relu(cm: CapturedModel, node: Any) -> bool:
    while isinstance(node, fx.Node):
        if _is_relu(cm, node):
            return True
        if not _keeps_sign(cm, node) or not node.args:
            return False
        node = node.args[0]
    return False


def _keeps_sign(cm: CapturedModel, node: fx.Node) -> bool:
    if node.op == "call_module":
        return type(cm.get_module(node.target)).__name__ in _SIGN_KEEPING_MODULES
    if node.op in ("call_function", "call_method"):
        return _function_name(node) in _SIGN_KEEPING_FUNCTIONS
    return False


def _is_relu(cm: CapturedModel, node: Any) -> bool:
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_module":
        return type(cm.get_module(node.target)).__name__ == "ReLU"
    return node.op in ("call_function", "call_method") and _function_name(node) in ("relu", "relu_")


def distill_groups(
    cm: CapturedModel,
    group_size: int = 1,
    user_groups: Iterable[Any] = (),
) -> list[list[str]]:
    """Distillation groups per docs/spec/engine.md §6.1, sorted by the position of each group's first module.

    ``user_groups`` holds (start, end) layer-name pairs, or objects with ``start_layer_name`` and
    ``end_layer_name`` (the cfg's ``distill_group``).
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    fixed = [_expand_user_group(cm, start, end) for start, end in _pairs(user_groups)]
    _check_disjoint(cm, fixed)
    taken = {name for group in fixed for name in group}
    groups = fixed + _cascade(_distill_units(cm, taken), group_size)
    if not groups:
        raise ValueError(
            "Not found distill group: the model has no Conv2d or Linear layer that can be "
            f"distilled (excluded: {excluded_layers(cm, distill_type_names()) or 'none'})"
        )
    return sorted(groups, key=lambda group: cm.position(group[0]))


def _distill_units(cm: CapturedModel, taken: set[str]) -> list[list[fx.Node]]:
    """docs/spec/engine.md §6.1 step 1: [layer, BatchNorm2d, activation], [layer, activation] or [layer]."""
    units = []
    for info in quantizable_layers(cm, distill_type_names()):
        if info.name in taken:
            continue
        unit = [cm.nodes_of(info.name)[0]]
        nxt = _single_consumer(unit[-1])
        bn_ok = _is_module_of(cm, nxt, DISTILL_BN_TYPES) and cm.call_count(nxt.target) == 1
        if bn_ok and nxt.target not in taken:
            unit.append(nxt)
            nxt = _single_consumer(nxt)
        if _is_module_of(cm, nxt, DISTILL_ACTIVATION_TYPES) and _free(cm, nxt.target, taken):
            unit.append(nxt)
        units.append(unit)
    return units


def _cascade(units: list[list[fx.Node]], group_size: int) -> list[list[str]]:
    """docs/spec/engine.md §6.1 step 2: join a unit to the next while its last node feeds only that unit's layer."""
    index_of_start = {unit[0]: i for i, unit in enumerate(units)}
    used: set[int] = set()
    groups = []
    for i in range(len(units)):  # units come in topological order of their layer
        if i in used:
            continue
        chain = [i]
        used.add(i)
        while len(chain) < group_size:
            j = index_of_start.get(_single_consumer(units[chain[-1]][-1]))
            if j is None or j in used:
                break
            chain.append(j)
            used.add(j)
        groups.append(_dedupe(node.target for k in chain for node in units[k]))
    return groups


def _expand_user_group(cm: CapturedModel, start: str, end: str) -> list[str]:
    """docs/spec/engine.md §6.1 step 3: the modules on the only route from ``start`` to ``end``."""
    label = f"Distill group {start} → {end}"
    for name in (start, end):
        if not cm.nodes_of(name):
            raise ValueError(f"{label}: layer '{name}' is not called in the model's forward (check the module path)")
    if cm.call_count(start) > 1:
        raise ValueError(f"{label}: the start layer '{start}' is reused (called {cm.call_count(start)} times)")
    route = _only_route(cm.nodes_of(start)[0], set(cm.nodes_of(end)), start, end)
    for node in route:
        if not _is_module_of(cm, node, _distill_module_types()):
            raise ValueError(
                f"{label}: the route passes through {_describe(cm, node)}, which is not one "
                f"of the distill module types {', '.join(_distill_module_types())}"
            )
        if _is_module_of(cm, node, BN_TYPES) and cm.call_count(node.target) > 1:
            raise ValueError(
                f"{label}: the BatchNorm '{node.target}' on the route is reused "
                f"(called {cm.call_count(node.target)} times)"
            )
    return _dedupe(node.target for node in route)


def _only_route(start: fx.Node, ends: set[fx.Node], start_name: str, end_name: str) -> list[fx.Node]:
    """DFS over the paths from start to an end node; exactly one must exist."""
    reaches_end = _ancestors(ends)  # prune the DFS to nodes that lead to an end: it stops at 2 routes
    routes: list[list[fx.Node]] = []
    stack = [[start]] if start in reaches_end else []
    while stack and len(routes) < 2:
        path = stack.pop()
        if path[-1] in ends:
            routes.append(path)
            continue
        stack.extend(path + [user] for user in path[-1].users if user in reaches_end)
    if len(routes) == 1:
        return routes[0]
    why = (
        f"'{end_name}' cannot be reached from '{start_name}'"
        if not routes
        else "the data can flow between them along more than one path (a branch or a residual add)"
    )
    raise ValueError(
        f"Can not find an only route from {start_name} to {end_name}: {why}. "
        "Choose a start and an end layer on one straight chain of modules."
    )


def _ancestors(nodes: set[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(node.all_input_nodes)
    return seen


def _check_disjoint(cm: CapturedModel, groups: list[list[str]]) -> None:
    # docs/spec/engine.md §6.1: groups must not intersect; a reused activation module may sit in several
    for i, first in enumerate(groups):
        for second in groups[i + 1 :]:
            common = [name for name in first if name in second and not _shareable(cm, name)]
            if common:
                raise ValueError(
                    f"Distill groups {first[0]} → {first[-1]} and {second[0]} → {second[-1]} "
                    f"share {', '.join(common)}; distill groups must not intersect"
                )


def _free(cm: CapturedModel, name: str, taken: set[str]) -> bool:
    """Not in another group yet, or shareable."""
    return name not in taken or _shareable(cm, name)


def _shareable(cm: CapturedModel, name: str) -> bool:
    # docs/spec/engine.md §6.1: a reused activation module may sit in several groups (it holds no state to train)
    return cm.call_count(name) > 1 and _module_type(cm, name) in DISTILL_ACTIVATION_TYPES


def _pairs(user_groups: Iterable[Any]) -> list[tuple[str, str]]:
    pairs = []
    for group in user_groups:
        if hasattr(group, "start_layer_name"):
            pairs.append((group.start_layer_name, group.end_layer_name))
        elif isinstance(group, (tuple, list)) and len(group) == 2 and all(isinstance(g, str) for g in group):
            pairs.append((group[0], group[1]))
        else:
            raise TypeError(f"a user distill group must be a (start_layer_name, end_layer_name) pair, got {group!r}")
    return pairs


def _single_consumer(node: fx.Node | None) -> fx.Node | None:
    if node is None or len(node.users) != 1:
        return None
    return next(iter(node.users))


def _module_type(cm: CapturedModel, name: str) -> str:
    return type(cm.get_module(name)).__name__


def _is_module_of(cm: CapturedModel, node: fx.Node | None, types: Sequence[str]) -> bool:
    return node is not None and node.op == "call_module" and _module_type(cm, node.target) in types


def _activation_type(cm: CapturedModel, node: fx.Node | None) -> str | None:
    if node is None:
        return None
    if node.op == "call_module":
        type_name = _module_type(cm, node.target)
        return type_name if type_name in ACTIVATION_TYPES else None
    if node.op in ("call_function", "call_method"):
        return ACTIVATION_FUNCTIONS.get(_function_name(node))
    return None


def _function_name(node: fx.Node) -> str | None:
    if node.op == "call_method":
        return node.target
    return op_name(node.target) or getattr(node.target, "__name__", None)


def _describe(cm: CapturedModel, node: fx.Node) -> str:
    if node.op == "call_module":
        return f"'{node.target}' ({_module_type(cm, node.target)})"
    return f"`{node.name}` ({node.op} {_function_name(node) or node.target})"


def _dedupe(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))
