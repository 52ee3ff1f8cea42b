"""Capture any supported model as one IR: a ``torch.fx.GraphModule`` of named leaf modules (docs/spec/engine.md §1.1).

Every later pass (layer discovery, quantiser insertion, pruning, distill groups, export) asks the
``CapturedModel`` built here; layer names are module paths (``layer1.0.conv1``) whatever the input was:

- an ``nn.Module`` (deep-copied, DDP/DataParallel unwrapped): ``torch.fx`` symbolic tracing with the
  ``torch.nn`` modules as leaves; the GraphModule shares those very leaf objects with the copy. When
  fx cannot trace it (Python control flow on shapes, …) ``torch.export`` is tried and its aten calls
  are lifted back into named leaf modules;
- a ``torch.jit.ScriptModule`` or a TorchScript file: rebuilt by ``torchscript.py``.
"""

from __future__ import annotations

import copy
import os
import traceback
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from amct_engine.graph.empty_caches import drop_empty_cache_concats
from amct_engine.graph.errors import GraphCaptureError, first_line
from amct_engine.graph.lifting import Scope, lift_leaf_modules, quiet_export
from amct_engine.graph.symbolic_sizes import simplify_size_arithmetic, symbolic_capture, symbolic_graph
from amct_engine.graph.torchscript import graph_module_from_torchscript, load_torchscript
from amct_engine.layers import is_table_class

# docs/spec/engine.md §1.1 / CG/capacity/capacity_config.csv AMCT_OPERATIONS: a model holding one was already compressed
AMCT_MODULE_TYPE_NAMES: set[str] = {
    "IFMR",
    "HFMG",
    "Recorder",
    "AscendQuant",
    "AscendDeQuant",
    "RetrainQuant",
    "RNNRetrainQuant",
    "MarkedQuantizableModule",
    "QuantIdentity",
    "SelectiveMaskGen",
    "DMQBalancer",
    "Conv2dQAT",
    "LinearQAT",
    "LSTMQAT",
    "GRUQAT",
    "OFMRQuant",
    "ConvTranspose1dQAT",
}
# our own wrappers and quantisers live in these packages; anything defined there is an AMCT op too
_AMCT_PACKAGES = ("amct_engine.quant", "amct_engine.prune", "amct_engine.blockwise_distill")


def register_amct_module_type(cls_or_name: type | str) -> None:
    """Mark a module class (or class name) as an AMCT op: captured as a leaf, rejected by ``create_*``."""
    AMCT_MODULE_TYPE_NAMES.add(cls_or_name if isinstance(cls_or_name, str) else cls_or_name.__name__)


# User layer classes captured as one call each, like torch.nn layers (a layer the pruner table
# knows must appear in the graph as its module, not as the ops of its forward).
_USER_LEAF_TYPES: set[type] = set()


def register_leaf_module_type(cls: type) -> None:
    """Capture modules of ``cls`` (and its subclasses) as leaves: one ``call_module`` node each."""
    _USER_LEAF_TYPES.add(cls)


def unregister_leaf_module_type(cls: type) -> None:
    _USER_LEAF_TYPES.discard(cls)


def is_amct_module(module: nn.Module) -> bool:
    cls = type(module)
    return cls.__name__ in AMCT_MODULE_TYPE_NAMES or cls.__module__.startswith(_AMCT_PACKAGES)


@dataclass
class CapturedModel:
    """A model and its graph.

    ``module`` is what later passes transform and ``create_*`` returns: the deep copy of an
    ``nn.Module``, or the rebuilt GraphModule for TorchScript / ``torch.export`` input.
    ``graph_module`` is a GraphModule over ``module`` whose leaf layers are ``call_module`` nodes
    targeting their module path; its leaf module objects *are* those of ``module``.
    """

    module: nn.Module
    graph_module: fx.GraphModule
    example_inputs: tuple[torch.Tensor, ...]
    source: str  # "nn.Module" | "torch.export" | "torchscript"

    @property
    def graph(self) -> fx.Graph:
        return self.graph_module.graph

    def module_types(self) -> dict[str, str]:
        """Module path → class name of every module the graph calls, in first-call order."""
        calls = (n.target for n in self.graph.nodes if n.op == "call_module")
        return {name: type(self.get_module(name)).__name__ for name in calls}

    def get_module(self, name: str) -> nn.Module:
        return self.graph_module.get_submodule(name)

    def nodes_of(self, name: str) -> list[fx.Node]:
        """The ``call_module`` nodes of one module path; more than one means the module is reused."""
        return [n for n in self.graph.nodes if n.op == "call_module" and n.target == name]

    def call_count(self, name: str) -> int:
        return len(self.nodes_of(name))

    def consumers(self, node: fx.Node | str) -> list[fx.Node]:
        """Nodes that read the output of a node (or of every call of a module path), in graph order."""
        nodes = self.nodes_of(node) if isinstance(node, str) else [node]
        seen = {user: None for n in nodes for user in n.users}
        return sorted(seen, key=self.position)

    def producers(self, node: fx.Node | str) -> list[fx.Node]:
        """Nodes whose outputs a node (or every call of a module path) reads."""
        nodes = self.nodes_of(node) if isinstance(node, str) else [node]
        seen = {inp: None for n in nodes for inp in n.all_input_nodes}
        return sorted(seen, key=self.position)

    def position(self, node: fx.Node | str) -> int:
        """Topological index of a node (or of the first call of a module path)."""
        if isinstance(node, str):
            node = self.nodes_of(node)[0]
        return self._positions()[node]

    def _positions(self) -> dict[fx.Node, int]:
        # recomputed per call: passes may edit the graph between analyses
        return {n: i for i, n in enumerate(self.graph.nodes)}


def capture_model(
    model: nn.Module | torch.jit.ScriptModule | str | os.PathLike,
    input_data: torch.Tensor | tuple[torch.Tensor, ...] | list[torch.Tensor],
    *,
    reject_amct_ops: bool = True,
    allow_export_fallback: bool = True,
    copy_model: bool = True,
) -> CapturedModel:
    """Capture ``model`` (nn.Module, ScriptModule or TorchScript file path) with ``input_data``.

    ``input_data`` is a tensor or a tuple/list of tensors (docs/spec/engine.md §1.1: only used for tracing).
    ``copy_model=False`` traces the model itself, for a caller that only reads the graph (the layer
    table of a config): tracing does not change a module, and the copy is most of the capture's time.
    Raises TypeError for other inputs, ValueError for a model that already holds AMCT ops, and
    GraphCaptureError when the model cannot become one static graph.
    """
    example_inputs = as_input_tuple(input_data)
    if isinstance(model, (str, os.PathLike)):
        source = f"TorchScript file {os.fspath(model)}"
        return _capture_torchscript(load_torchscript(model), example_inputs, source, True, reject_amct_ops)
    if isinstance(model, torch.jit.ScriptModule):
        return _capture_torchscript(
            model, example_inputs, f"TorchScript module {model.original_name}", False, reject_amct_ops
        )
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module, a torch.jit.ScriptModule or a path to a "
            f"TorchScript file, got {type(model).__name__}"
        )
    model = _unwrap_parallel(model)
    if reject_amct_ops:
        _reject_amct_ops((name, type(m).__name__, is_amct_module(m)) for name, m in model.named_modules())
    return _capture_module(_copy_model(model) if copy_model else model, example_inputs, allow_export_fallback)


def as_input_tuple(input_data: Any) -> tuple[torch.Tensor, ...]:
    """The example input of every API call as a tuple of tensors (a single tensor is a 1-tuple)."""
    if isinstance(input_data, torch.Tensor):
        return (input_data,)
    is_seq = isinstance(input_data, (tuple, list))
    if is_seq and input_data and all(isinstance(t, torch.Tensor) for t in input_data):
        return tuple(input_data)
    kinds = [type(t).__name__ for t in input_data] if is_seq else None
    got = f"{type(input_data).__name__} of {kinds}" if kinds is not None else type(input_data).__name__
    raise TypeError(f"input_data must be a torch.Tensor or a non-empty tuple/list of tensors, got {got}")


def _unwrap_parallel(model: nn.Module) -> nn.Module:
    # docs/spec/engine.md §1.1: a DistributedDataParallel wrapper is unwrapped; DataParallel has the same .module
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    return model


def _copy_model(model: nn.Module) -> nn.Module:
    # docs/spec/engine.md §1.1: deep-copied where possible; otherwise the original is modified, with a warning
    try:
        with warnings.catch_warnings():
            # a rebuilt GraphModule carries pytree specs whose copy trips a torch deprecation notice
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            return copy.deepcopy(model)
    except Exception as exc:
        warnings.warn(
            f"Could not deep-copy the model ({type(exc).__name__}: {exc}); the original model "
            "will be modified in place",
            stacklevel=3,
        )
        return model


def _reject_amct_ops(modules) -> None:
    found = [f"{name or '<root>'} ({cls})" for name, cls, is_amct in modules if is_amct]
    if found:
        raise ValueError(
            f"The model already contains AMCT operations: {', '.join(found[:5])}"
            f"{' …' if len(found) > 5 else ''}. Pass the original float model."
        )


def _capture_torchscript(ts, example_inputs, source, owned, reject_amct_ops) -> CapturedModel:
    if reject_amct_ops:
        _reject_amct_ops(
            (name, m.original_name, m.original_name in AMCT_MODULE_TYPE_NAMES) for name, m in ts.named_modules()
        )
    gm = graph_module_from_torchscript(ts, example_inputs, source, owned=owned)
    return CapturedModel(gm, gm, example_inputs, "torchscript")


class _LeafTracer(fx.Tracer):
    """fx tracer: torch.nn modules, AMCT ops and registered user layers are leaves; control flow stops
    with the node it hit."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return (
            is_amct_module(m)
            or isinstance(m, tuple(_USER_LEAF_TYPES))
            or is_table_class(m)  # a quantisable layer type (amct_engine/layer_table.py)
            or super().is_leaf_module(m, module_qualified_name)
        )

    def to_bool(self, obj: fx.Proxy) -> bool:
        raise _TraceStop(
            obj.node, "a traced tensor decides Python control flow (`if`/`while` on a tensor or on its shape)"
        )

    def iter(self, obj: fx.Proxy):
        raise _TraceStop(obj.node, "a traced tensor is iterated over (a loop over a tensor, or *args unpacking of one)")


class _TraceStop(Exception):
    def __init__(self, node: fx.Node, reason: str) -> None:
        super().__init__(reason)
        self.node, self.reason = node, reason


def _capture_module(module: nn.Module, example_inputs, allow_export_fallback: bool) -> CapturedModel:
    tracer = _LeafTracer()
    try:
        graph = tracer.trace(module)
    except Exception as exc:
        message = _trace_failure_message(module, tracer, exc)
        if not allow_export_fallback:
            raise GraphCaptureError(message) from exc
        gm = _export_fallback(module, example_inputs, message)
        return CapturedModel(gm, gm, example_inputs, "torch.export")
    gm = fx.GraphModule(tracer.root, graph, class_name=type(module).__name__)
    return CapturedModel(module, gm, example_inputs, "nn.Module")


def _trace_failure_message(module: nn.Module, tracer: fx.Tracer, exc: Exception) -> str:
    """Where fx stopped: the fx node, and the line of the user's forward that was running."""
    if isinstance(exc, _TraceStop):
        node, reason = exc.node, exc.reason
    else:
        nodes = list(tracer.graph.nodes) if getattr(tracer, "graph", None) is not None else []
        node, reason = (nodes[-1] if nodes else None), f"{type(exc).__name__}: {exc}"
    after = f", at fx node `{node.name}` ({node.op} {_target_name(node)})" if node is not None else ""
    return f"Could not trace {type(module).__name__} with torch.fx{_user_frame(exc)}{after}: {reason}."


def _target_name(node: fx.Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _user_frame(exc: BaseException) -> str:
    # the innermost frame outside torch and this package is the user's forward that was running
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _is_library_file(f.filename)]
    if not frames:
        return ""
    f = frames[-1]
    return f" in {f.name}() at {f.filename}:{f.lineno} `{(f.line or '').strip()}`"


def _is_library_file(filename: str) -> bool:
    parts = os.path.normpath(filename).split(os.sep)
    return "torch" in parts or os.path.dirname(os.path.abspath(filename)) == os.path.dirname(__file__)


def _export_fallback(module: nn.Module, example_inputs, fx_message: str) -> fx.GraphModule:
    """torch.export + lifting; export specialises Python control flow to the example shapes, and the graph
    is guarded at the batch sizes it does not hold for (graph/symbolic_sizes.py)."""
    modes = {name: m.training for name, m in module.named_modules()}

    def build(example: tuple[torch.Tensor, ...]) -> tuple[fx.GraphModule, dict]:
        ep = _export_auto_dynamic(module, example)
        params = {name for name, _ in module.named_parameters(remove_duplicate=False)}
        gm = lift_leaf_modules(
            ep.module(), _export_scope, params.__contains__, module.state_dict(), class_name=type(module).__name__
        )
        simplify_size_arithmetic(gm)
        drop_empty_cache_concats(gm)  # a transformers model's use_cache=True (docs/spec/engine.md §5.3)
        return gm, dict(ep.range_constraints)

    try:
        gm = symbolic_graph(build, module, tuple(example_inputs), fx_message, modes)
    except Exception as exc:
        raise GraphCaptureError(
            f"{fx_message} torch.export failed as well: {first_line(exc)}. Make forward static (no "
            "Python `if`/loop on tensor values; torch.where instead), or wrap the dynamic part in a "
            "submodule of its own, or pass a TorchScript file traced with representative inputs."
        ) from exc
    warnings.warn(
        f"{fx_message} Captured with torch.export instead: control flow is fixed to the "
        "input_data shapes, and the compressed model is a GraphModule.",
        stacklevel=4,
    )
    return gm


def _export_auto_dynamic(module: nn.Module, example_inputs) -> torch.export.ExportedProgram:
    """Export with every input dimension `Dim.AUTO` (export keeps what may vary, specialises the
    rest), so the captured model takes other batch sizes and sequence lengths than input_data; a
    static export when that fails."""
    auto = tuple({axis: torch.export.Dim.AUTO for axis in range(t.dim())} for t in example_inputs)
    with quiet_export(), symbolic_capture():
        try:
            return torch.export.export(module, example_inputs, dynamic_shapes=auto, strict=False)
        except Exception:
            return torch.export.export(module, example_inputs, strict=False)


def _export_scope(node: fx.Node) -> Scope | None:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path, cls = list(stack.values())[-1]
    cls_name = cls if isinstance(cls, str) else cls.__name__
    return Scope(path.split("@")[0], cls_name.rsplit(".", 1)[-1])
