"""Lift aten calls on parameters back into named ``torch.nn`` leaf modules.

``torch.export`` and the TorchScript converter both give a GraphModule of aten calls on ``get_attr``
tensors (``layer1.0.conv1.weight``). Quantisation, pruning and distillation work on leaf modules
named by module path (docs/spec/engine.md §1.1), so each conv / linear / batch-norm call, and each activation whose
module is known, becomes a ``call_module`` on a real ``nn.Conv2d`` / ``nn.Linear`` / … registered at
that path, holding the very tensors the call used.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from amct_engine.graph.layer_types import BN_TYPES, CONV_TRANSPOSE_TYPES, CONV_TYPES
from amct_engine.graph.lifted_modules import batch_norm_module, conv_module, linear_module, stateless_module


@dataclass(frozen=True)
class Scope:
    """The module that made a call: its path from the root and its class name (``"ReLU"``)."""

    path: str
    class_name: str


# The torch.nn classes whose calls become leaf modules again (layer_types.py defines the groups once).
CONV_CLASSES = frozenset(t.__name__ for t in CONV_TYPES + CONV_TRANSPOSE_TYPES)
BN_CLASSES = frozenset(t.__name__ for t in BN_TYPES)

_CONV_OPS = frozenset(
    {
        "conv1d",
        "conv2d",
        "conv3d",
        "convolution",
        "_convolution",
        "_convolution_mode",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
    }
)
_BN_OPS = frozenset({"batch_norm", "_native_batch_norm_legit_no_training"})

# Parameter-free aten op (trailing "_" stripped) -> module classes that call it in their forward.
# Activations are lifted for conv→BN→act groups; dropout so that a traced file's baked `train` flag
# gives way to the rebuilt module's own flag. Extend here (and in _build_stateless).
STATELESS_OPS: dict[str, frozenset[str]] = {
    "relu": frozenset({"ReLU"}),
    "relu6": frozenset({"ReLU6"}),
    "hardtanh": frozenset({"ReLU6", "Hardtanh"}),
    "leaky_relu": frozenset({"LeakyReLU"}),
    "sigmoid": frozenset({"Sigmoid"}),
    "tanh": frozenset({"Tanh"}),
    "softmax": frozenset({"Softmax"}),
    "_softmax": frozenset({"Softmax"}),
    "dropout": frozenset({"Dropout"}),
    "feature_dropout": frozenset({"Dropout2d", "Dropout3d"}),
}


def op_name(target: Any) -> str | None:
    """``"conv2d"`` for ``aten.conv2d.default`` / ``aten::conv2d``; None for anything that is not aten."""
    qualified = target._schema.name if isinstance(target, torch._ops.OpOverload) else target
    if isinstance(qualified, str) and qualified.startswith("aten::"):
        return qualified[len("aten::") :]
    return None


def op_category(target: Any) -> str | None:
    """The kind of leaf module an aten op belongs to: "conv", "linear", "bn", an activation op, or None."""
    name = op_name(target)
    if name is None:
        return None
    if name in _CONV_OPS:
        return "conv"
    if name == "linear":
        return "linear"
    if name in _BN_OPS:
        return "bn"
    stripped = name[:-1] if name.endswith("_") and not name.startswith("_") else name
    return stripped if stripped in STATELESS_OPS else None


def bind_args(node: fx.Node) -> dict[str, Any]:
    """The call's arguments by schema name, defaults filled in (traced files carry no module attributes)."""
    bound: dict[str, Any] = {}
    for i, arg in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            bound[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


class _Lifter:
    """One pass over the graph; ``lift()`` returns the rebuilt GraphModule."""

    def __init__(
        self,
        gm: fx.GraphModule,
        scope_of: Callable[[fx.Node], Scope | None],
        is_param: Callable[[str], bool],
        state: Mapping[str, torch.Tensor],
        class_name: str,
    ) -> None:
        self.gm, self.scope_of, self.is_param, self.state = gm, scope_of, is_param, state
        self.class_name = class_name
        self.graph = gm.graph
        self.modules: dict[str, nn.Module] = {}
        self.params: dict[int, nn.Parameter] = {}  # source tensor id -> Parameter: keeps sharing intact

    def tensor(self, arg: Any) -> torch.Tensor | None:
        if isinstance(arg, fx.Node) and arg.op == "get_attr":
            return _get_attr(self.gm, arg.target)
        return None

    def parameter(self, arg: Any) -> nn.Parameter | None:
        t = self.tensor(arg)
        if t is None:
            return None
        if id(t) not in self.params:
            self.params[id(t)] = t if isinstance(t, nn.Parameter) else nn.Parameter(t.detach())
        return self.params[id(t)]

    def lift(self) -> fx.GraphModule:
        for node in list(self.graph.nodes):
            if node.op == "call_module" and node.target == "_guards_fn" and not node.users:
                self.graph.erase_node(node)  # export's input-shape guard: not part of the model
            elif node.op == "call_function":
                self._lift_node(node)
        self._drop_bn_counters()
        for node in list(self.graph.nodes):
            if node.op == "get_attr" and not node.users:
                self.graph.erase_node(node)
        for path in sorted(self.modules, key=lambda p: p.count(".")):  # parents before children
            _set_path(self.gm, path, self.modules[path])
        self._restore_parameters()
        rebuilt = fx.GraphModule(self.gm, self.graph, class_name=self.class_name)
        rebuilt.graph.lint()
        return rebuilt

    def _lift_node(self, node: fx.Node) -> None:
        category = op_category(node.target)
        if category is None:
            return
        args = bind_args(node)
        scope = self.scope_of(node)
        path = self._path_for(category, args, scope)
        if path is None:
            return
        module = self._build(category, args, node, scope)
        if module is None:
            return
        if path in self.modules and not _same_module(self.modules[path], module):
            warnings.warn(
                f"{node.name}: a different {type(module).__name__} already sits at '{path}'; "
                "this call stays a plain function call and will not be quantised",
                stacklevel=4,
            )
            return
        self.modules.setdefault(path, module)
        self._replace(node, path, args["input" if "input" in args else "self"])

    def _path_for(self, category: str, args: dict, scope: Scope | None) -> str | None:
        if category in ("conv", "linear", "bn"):
            wanted = {"conv": CONV_CLASSES, "linear": {"Linear"}, "bn": BN_CLASSES}[category]
            if scope is not None:
                # the calling module is known: lift only calls a torch.nn layer made (as fx would see it)
                return scope.path if scope.class_name in wanted and scope.path else None
            weight = args.get("weight")
            if isinstance(weight, fx.Node) and weight.op == "get_attr" and weight.target.endswith(".weight"):
                return weight.target[: -len(".weight")]
            return None
        # activations and dropout carry no parameter: only a known module of theirs gives them a name
        ok = scope is not None and scope.path and scope.class_name in STATELESS_OPS[category]
        return scope.path if ok else None

    def _build(self, category: str, args: dict, node: fx.Node, scope: Scope | None) -> nn.Module | None:
        """The module of a call: its parameters (shared as they are) and its attributes from the call's arguments."""
        weight, bias = self.parameter(args.get("weight")), self.parameter(args.get("bias"))
        if category == "conv":
            return conv_module(args, op_name(node.target), weight, bias)
        if category == "linear":
            return linear_module(weight, bias)
        if category == "bn":
            mean, var = self.tensor(args.get("running_mean")), self.tensor(args.get("running_var"))
            tracked = self._batches_tracked(args["running_mean"].target) if mean is not None else None
            return batch_norm_module(args, weight, bias, mean, var, tracked)
        return stateless_module(scope.class_name, args, op_name(node.target).endswith("_"))

    def _batches_tracked(self, mean_target: str) -> torch.Tensor:
        name = mean_target.rsplit(".", 1)[0] + ".num_batches_tracked"
        found = self.state.get(name)
        return found if found is not None else torch.tensor(0, dtype=torch.long)

    def _replace(self, node: fx.Node, path: str, data: fx.Node) -> None:
        with self.graph.inserting_before(node):
            new = self.graph.create_node("call_module", path, (data,))
        new.meta = dict(node.meta)
        if op_name(node.target) == "_native_batch_norm_legit_no_training":
            # returns (out, mean, invstd); only out is ever used in inference graphs
            for user in list(node.users):
                user.replace_all_uses_with(new)
                self.graph.erase_node(user)
        node.replace_all_uses_with(new)
        self.graph.erase_node(node)

    def _drop_bn_counters(self) -> None:
        # a train-mode trace bakes `num_batches_tracked += 1`; the lifted BatchNorm now does it itself
        bns = [p for p, m in self.modules.items() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        counters = {f"{p}.num_batches_tracked" for p in bns}
        for node in list(self.graph.nodes):
            first = node.args[0] if node.op == "call_function" and node.args else None
            if (
                op_name(node.target) in ("add_", "add")
                and not node.users
                and isinstance(first, fx.Node)
                and first.op == "get_attr"
                and first.target in counters
            ):
                self.graph.erase_node(node)

    def _restore_parameters(self) -> None:
        # the converter hands parameters over as buffers; keep the un-lifted ones trainable
        for node in self.graph.nodes:
            if node.op == "get_attr" and self.is_param(node.target):
                value = _get_attr(self.gm, node.target)
                if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                    param = self.params.setdefault(id(value), nn.Parameter(value.detach()))
                    _set_path(self.gm, node.target, param)


def _same_module(a: nn.Module, b: nn.Module) -> bool:
    # a module called twice lifts to the same object twice: same class, same weight tensor
    same_weight = getattr(a, "weight", None) is getattr(b, "weight", None)
    return type(a) is type(b) and same_weight and repr(a) == repr(b)


def _get_attr(root: nn.Module, target: str) -> Any:
    obj = root
    for name in target.split("."):
        obj = getattr(obj, name)
    return obj


def _set_path(root: nn.Module, path: str, value: Any) -> None:
    """Install a module, Parameter or buffer at a dotted path, creating plain parent modules."""
    *parents, leaf = path.split(".")
    parent = root
    for name in parents:
        child = parent._modules.get(name)
        if child is None:
            child = nn.Module()
            parent.add_module(name, child)
        parent = child
    if isinstance(value, nn.Module):
        parent._buffers.pop(leaf, None)
        parent._parameters.pop(leaf, None)
        parent.add_module(leaf, value)
    elif isinstance(value, nn.Parameter):
        parent._buffers.pop(leaf, None)
        parent.register_parameter(leaf, value)
    else:
        parent.register_buffer(leaf, value)


def lift_leaf_modules(
    gm: fx.GraphModule,
    scope_of: Callable[[fx.Node], Scope | None],
    is_param: Callable[[str], bool] = lambda _: False,
    state: Mapping[str, torch.Tensor] | None = None,
    class_name: str = "GraphModule",
) -> fx.GraphModule:
    """Rebuild ``gm`` so its conv/linear/BN calls (and known activation modules) are leaf modules.

    ``scope_of(node)`` names the module that made an aten call, or None when unknown: then a
    conv/linear/BN is named after its weight (``<path>.weight``) and an activation stays a function.
    ``is_param(target)`` says which remaining ``get_attr`` tensors were trainable parameters, and
    ``state`` supplies tensors the graph does not read (``num_batches_tracked``).
    """
    return _Lifter(gm, scope_of, is_param, state or {}, class_name).lift()


@contextlib.contextmanager
def quiet_export() -> Iterator[None]:
    """Silence the warnings and shape logs that export and the TorchScript converter emit."""
    # the converter warns about every unused num_batches_tracked and logs shape specialisations
    names = ("torch._export", "torch.export", "torch.fx.experimental.symbolic_shapes")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        # a failing export also prints its partial graph to stderr; the error we raise says enough
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
