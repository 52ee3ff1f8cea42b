"""TorchScript → IR: a ``torch.fx.GraphModule`` whose layers are real leaf modules (docs/architecture.md graph/).

``TS2EPConverter`` turns the TorchScript graph into an ``ExportedProgram`` that keeps the parameter
names (``layer1.0.conv1.weight``); ``lifting.lift_leaf_modules`` then turns each conv/linear/BN call
back into an ``nn.Conv2d``/``nn.Linear``/``nn.BatchNorm2d`` at that path. Activations carry no
parameter, so their module path comes from the TorchScript graph itself: every node of the frozen,
inlined graph knows the module hierarchy that made it (``layer1(Sequential).0(Block).relu(ReLU)``).
"""

from __future__ import annotations

import io
import os
import re
import warnings
from collections.abc import Iterator

import torch
from torch import fx

from amct_engine.graph.errors import GraphCaptureError, first_line
from amct_engine.graph.lifting import Scope, lift_leaf_modules, op_category, quiet_export
from amct_engine.graph.symbolic_sizes import simplify_size_arithmetic, symbolic_capture, symbolic_graph

_ADVICE = (
    "Data-dependent control flow (an `if` or loop on tensor values, such as `if x.sum() > 0:`) cannot "
    "become one static graph. Remove it from forward (torch.where, or decide outside the model), save "
    "the model with torch.jit.trace on representative inputs, or pass the Python nn.Module instead."
)
# docs/spec/engine.md §5.3: the usual cause is a transformers model traced with its key/value cache on
_DATA_DEPENDENT_SIZE = (
    "A size in its graph is computed from tensor values (as a transformers model's key/value cache length is "
    "when it is traced with use_cache=True, the default of Llama/Qwen configs): trace it with use_cache=False "
    "(model.config.use_cache = False), or pass the nn.Module."
)
_HOP_TO_TS = {"cond": "prim::If", "while_loop": "prim::Loop"}
_HIERARCHY_ITEM = re.compile(r"([^.()]+)\(([^()]*)\)")
_NOT_A_MODULE = {"SELF", "UNKNOWN_INSTANCE"}


def load_torchscript(path: str | os.PathLike) -> torch.jit.ScriptModule:
    """``torch.jit.load`` onto the CPU, with errors that say what kind of file was expected."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"TorchScript model file not found: {path}")
    try:
        return torch.jit.load(path, map_location="cpu")
    except Exception as exc:
        raise GraphCaptureError(
            f"{path} is not a TorchScript file (torch.jit.save): {first_line(exc)}. A state_dict or a "
            "pickled nn.Module (torch.save) cannot be loaded without its Python class; pass the nn.Module."
        ) from exc


def graph_module_from_torchscript(
    ts_module: torch.jit.ScriptModule,
    example_inputs: tuple[torch.Tensor, ...],
    source: str = "the TorchScript model",
    *,
    owned: bool = False,
) -> fx.GraphModule:
    """Rebuild a scripted or traced module as a GraphModule of named leaf modules, on the CPU.

    ``owned=True`` means the caller's module may be changed (it was loaded for this call); otherwise a
    private copy is made. Each rebuilt module gets the ``training`` flag of its TorchScript original.
    """
    ts = ts_module if owned else _private_copy(ts_module)
    modes = {name: m.training for name, m in ts.named_modules()}
    inputs = tuple(t.cpu() for t in example_inputs)

    def build(example: tuple[torch.Tensor, ...]) -> tuple[fx.GraphModule, dict]:
        # Freezing folds `if self.training`; a train-mode BatchNorm branch (its batch-size loop) does not
        # convert. The rebuilt nn modules get the flags back, so train-mode semantics survive.
        ts.eval()
        converter, ep = _convert(ts, example, source)
        flat = ep.module()
        scopes = _align_scopes(converter.ts_graph, flat, source, {name for name, _ in ts.named_modules()})
        params = {name for name, _ in ts.named_parameters()}
        gm = lift_leaf_modules(flat, scopes.get, params.__contains__, ts.state_dict(), class_name=ts.original_name)
        simplify_size_arithmetic(gm)
        return gm, dict(ep.range_constraints)

    # sizes symbolic where the TorchScript model's are (graph/symbolic_sizes.py); where a batch size is
    # fixed, a scripted `if` on it is the likely reason
    flow = _first_control_flow(ts.inlined_graph)
    at = f" (control flow at node {flow.kind()}{_where(ts.inlined_graph, flow.kind())})" if flow is not None else ""
    return symbolic_graph(build, ts, inputs, f"{source} fixes it in its graph{at}", modes)


def _private_copy(ts_module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    # a save/load round trip: we may call .eval() on it, and an in-memory traced module only gets the
    # module hierarchy on its graph nodes once it has been serialised
    buffer = io.BytesIO()
    torch.jit.save(ts_module, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer, map_location="cpu")


def _convert(ts, inputs, source):
    # Imported here: the converter pulls in dynamo and costs seconds at `import amct_engine`.
    from torch._export.converter import TS2EPConverter

    with quiet_export(), symbolic_capture():
        try:
            converter = TS2EPConverter(ts, inputs)
        except Exception as exc:
            shapes = ", ".join(str(list(t.shape)) for t in inputs)
            raise GraphCaptureError(
                f"Could not read the graph of {source} with input_data of shapes ({shapes}): "
                f"{first_line(exc)}. Check that input_data matches the model's forward()."
            ) from exc
        try:
            ep = converter.convert()
        except Exception as exc:
            raise GraphCaptureError(_conversion_message(converter.ts_graph, exc, source)) from exc
    _reject_control_flow(ep.graph, converter.ts_graph, source)
    return converter, ep


def _conversion_message(ts_graph: torch.Graph, exc: BaseException, source: str) -> str:
    chain = _exception_chain(exc)
    kinds = [m.group(1) for e in chain if (m := re.search(r"failed for node (\S+)", str(e)))]
    reason = first_line(chain[-1])
    if kinds:
        inner = f" (inside it: {' → '.join(kinds[1:])})" if len(kinds) > 1 else ""
        return (
            f"Could not convert {source} to a graph: the TorchScript converter failed on node "
            f"{kinds[0]}{_where(ts_graph, kinds[0])}{inner}: {reason}. {_ADVICE}"
        )
    flow = _first_control_flow(ts_graph)
    if flow is not None:
        return (
            f"Could not convert {source} to a graph: retracing the converted graph failed ({reason}); "
            f"its TorchScript graph has data-dependent control flow at node {flow.kind()}"
            f"{_where(ts_graph, flow.kind())}. {_ADVICE}"
        )
    if "data-dependent" in reason:
        return f"Could not convert {source} to a graph: {reason}. {_DATA_DEPENDENT_SIZE}"
    return f"Could not convert {source} to a graph: {reason}"


def _reject_control_flow(graph: fx.Graph, ts_graph: torch.Graph, source: str) -> None:
    # a converted `if` becomes torch.cond: its layers hide in subgraphs no pass can see or rewrite
    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            kind = _HOP_TO_TS.get(node.target.__name__, node.target.__name__)
            raise GraphCaptureError(
                f"Could not convert {source} to a static graph: node {kind}{_where(ts_graph, kind)} became "
                f"torch.{node.target.__name__}, whose branches hide their layers from compression. {_ADVICE}"
            )


def _align_scopes(
    ts_graph: torch.Graph, gm: fx.GraphModule, source: str, module_paths: set[str]
) -> dict[fx.Node, Scope]:
    """Pair the layer/activation calls of the converted graph with the TorchScript nodes they came from.

    Both graphs list the calls of one kind (conv, relu, …) in program order, so they pair by position;
    a kind is only trusted when both graphs hold the same number of its calls.
    """
    ts_calls: dict[str, list[Scope]] = {}
    for node in ts_graph.nodes():
        if category := op_category(node.kind()):
            ts_calls.setdefault(category, []).append(_full_path(_scope(node), module_paths))
    fx_calls: dict[str, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and (category := op_category(node.target)):
            fx_calls.setdefault(category, []).append(node)
    scopes: dict[fx.Node, Scope] = {}
    for category, nodes in fx_calls.items():
        found = ts_calls.get(category, [])
        if len(found) == len(nodes):
            scopes.update(zip(nodes, found, strict=True))
        else:
            warnings.warn(
                f"{source}: {len(nodes)} {category} calls after conversion but {len(found)} in the "
                "TorchScript graph; they are named after their weights, activations stay functions",
                stacklevel=3,
            )
    return scopes


def _scope(node: torch.Node) -> Scope:
    """``layer1(Sequential).0(Block).relu(ReLU).UNKNOWN_INSTANCE(UNKNOWN_TYPE)`` → layer1.0.relu, ReLU."""
    items = [(n, t) for n, t in _HIERARCHY_ITEM.findall(node.getModuleHierarchy()) if n not in _NOT_A_MODULE]
    if not items:
        return Scope("", "")
    return Scope(".".join(n for n, _ in items), items[-1][1])


def _full_path(scope: Scope, module_paths: set[str]) -> Scope:
    """The scope with its module's real path: a module held in an `nn.ModuleList` (a transformer's
    `model.layers.0`) is called by a loop of its parent, so TorchScript's hierarchy leaves the list out
    (`model.0.self_attn.q_proj`); the one module path that holds those names in that order is the module's
    (docs/spec/engine.md §5.3)."""
    if not scope.path or scope.path in module_paths:
        return scope
    parts = scope.path.split(".")
    found = sorted((len(p.split(".")), p) for p in module_paths if _holds_in_order(p.split("."), parts))
    # The fewest names inserted: `encoder.0.output.dense` is `encoder.layer.0.output.dense`, not
    # `encoder.layer.0.attention.output.dense` (TorchScript leaves out only the list's own name).
    unique = found and (len(found) == 1 or found[0][0] < found[1][0])
    return Scope(found[0][1], scope.class_name) if unique else scope


def _holds_in_order(path: list[str], parts: list[str]) -> bool:
    """Whether `path` is `parts` with names inserted (never after the last)."""
    if not path or path[-1] != parts[-1]:
        return False
    names = iter(path)
    return all(any(name == part for name in names) for part in parts)


def _walk(block) -> Iterator[torch.Node]:
    for node in block.nodes():
        yield node
        for sub in node.blocks():
            yield from _walk(sub)


def _first_control_flow(ts_graph: torch.Graph) -> torch.Node | None:
    return next((n for n in _walk(ts_graph) if n.kind() in ("prim::If", "prim::Loop")), None)


def _where(ts_graph: torch.Graph, kind: str) -> str:
    """`` at models.py:121 `if x.sum() > 0:` `` for the first node of that kind, or ``""``."""
    node = next((n for n in _walk(ts_graph) if n.kind() == kind), None)
    if node is None:
        return ""
    lines = node.sourceRange().splitlines()
    head = re.match(r'\s*File "(.+)", line (\d+)', lines[0]) if lines else None
    if head is None:
        return ""
    code = next((lines[i - 1].strip() for i in range(2, len(lines)) if lines[i].strip().startswith("~")), "")
    code = re.sub(r"\s+#.*$", "", code)  # the user's trailing comment is noise in an error message
    snippet = f" `{code}`" if code else ""
    return f" at {head.group(1)}:{head.group(2)}{snippet}"


def _exception_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain
