"""Input sizes stay symbolic through capture (docs/spec/engine.md §1.8).

The two capture routes that go through torch.export (a TorchScript file through the converter, an
``nn.Module`` fx cannot trace) can bake sizes of the example into the graph in three ways:

1. **0/1 specialisation**: an example dimension of size 0 or 1 becomes that constant. A detector
   traced with one image then flattens a batch of 32 into one row (``view(x.shape[0], -1)``).
   Capture traces with a *widened* example instead (``widened_example``: the batch axis tiled to
   ``WIDE_BATCH``) and keeps that graph only when it computes what the model computes on the real
   example.
2. **Duck shaping**: dimensions of equal size in the example share one symbol, so a batch of 32
   rows of 32 tokens would read the sequence length off the batch axis. ``symbolic_capture`` turns
   it off; an equality the model really needs still comes from its ops' guards.
3. **Scalar round trips**: TorchScript computes sizes as 0-d tensors (``prim::NumToTensor``,
   ``aten::Int``), which the converter writes as ``scalar_tensor`` … ``_local_scalar_dense``. The
   ONNX exporter's tracer reads ``.item()`` as the example's number (BERT's position ids sliced to
   a constant ``[1, 32]``). ``simplify_size_arithmetic`` turns each round trip back into Python
   arithmetic on the size symbols, which export/dynamic_shapes.py keeps dynamic, and drops
   export's runtime asserts on sizes (checks of its own assumptions, not part of the model).

``symbolic_graph`` then works out which batch sizes the graph holds for (export's range constraints, and a
run at batch 1, which export assumes nothing about) and guards the rest with ``ShapeGuard``: a call at
another batch size fails with the engine's message (the input, the axis, where the model specialised
it) instead of a shape error deep inside a layer, or a wrong result from a branch taken for the example.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import fx

from amct_engine.graph.errors import GraphCaptureError

aten = torch.ops.aten

# The batch size a size-1 batch axis is traced with: not 0 or 1 (specialised), and not 2, the size
# other axes most often have by chance (a pair, a binary class axis).
WIDE_BATCH = 3

_RUNTIME_ASSERTS = frozenset(
    {
        aten._assert_scalar.default,
        aten.sym_constrain_range_for_size.default,
        aten.sym_constrain_range.default,
    }
)
# Python operators on sizes export leaves behind (comparisons feeding the asserts, arithmetic).
_SIZE_OPERATORS = frozenset(
    {
        operator.ge,
        operator.gt,
        operator.le,
        operator.lt,
        operator.eq,
        operator.ne,
        operator.and_,
        operator.or_,
        operator.add,
        operator.sub,
        operator.mul,
        operator.floordiv,
        operator.mod,
        operator.neg,
    }
)
# A 0-d integer tensor op -> the Python operator it computes on sizes.
_TENSOR_ARITHMETIC: dict[Any, Callable] = {
    aten.add.Tensor: operator.add,
    aten.add.Scalar: operator.add,
    aten.sub.Tensor: operator.sub,
    aten.sub.Scalar: operator.sub,
    aten.mul.Tensor: operator.mul,
    aten.mul.Scalar: operator.mul,
    aten.floor_divide.default: operator.floordiv,
    aten.floor_divide.Scalar: operator.floordiv,
    aten.remainder.Tensor: operator.mod,
    aten.remainder.Scalar: operator.mod,
}
_INTEGRAL = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


@contextlib.contextmanager
def symbolic_capture() -> Iterator[None]:
    """torch.export settings for capture: no duck shaping (point 2 of the module docstring)."""
    with torch.fx.experimental._config.patch(use_duck_shape=False):
        yield


def widened_example(example: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...] | None:
    """The example with every size-1 batch axis (axis 0) tiled to WIDE_BATCH; None when there is none."""
    if not any(t.dim() > 0 and t.shape[0] == 1 for t in example):
        return None
    return tuple(t.repeat(WIDE_BATCH, *[1] * (t.dim() - 1)) if t.dim() > 0 and t.shape[0] == 1 else t for t in example)


def same_outputs(expected: Any, actual: Any) -> bool:
    """Whether two forward results are the same structure of tensors with the same values."""
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        return (
            expected.shape == actual.shape
            and expected.dtype == actual.dtype
            and torch.allclose(expected.float(), actual.float(), rtol=1e-4, atol=1e-5, equal_nan=True)
        )
    if isinstance(expected, (tuple, list)) and isinstance(actual, (tuple, list)) and len(expected) == len(actual):
        return all(same_outputs(e, a) for e, a in zip(expected, actual, strict=True))
    if isinstance(expected, dict) and isinstance(actual, dict) and expected.keys() == actual.keys():
        return all(same_outputs(expected[k], actual[k]) for k in expected)
    return False


def simplify_size_arithmetic(gm: fx.GraphModule) -> None:
    """Rewrite `gm`'s scalar round trips on sizes into Python arithmetic and drop runtime asserts (in place)."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in _RUNTIME_ASSERTS:
            graph.erase_node(node)
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is aten._local_scalar_dense.default:
            with graph.inserting_before(node):
                value = _as_size(gm, node.args[0])
            if value is not None:
                node.replace_all_uses_with(value)
                graph.erase_node(node)
    _erase_dead_size_nodes(graph)
    graph.lint()
    gm.recompile()


def _as_size(gm: fx.GraphModule, arg: Any) -> fx.Node | int | None:
    """`arg` (a 0-d integer tensor computed from sizes) as Python arithmetic on the size symbols; None
    when it is anything else. New nodes go where the graph's insertion point is."""
    if isinstance(arg, int) and not isinstance(arg, bool):
        return arg
    if not isinstance(arg, fx.Node):
        return None
    if arg.op == "get_attr":
        value = _attr(gm, arg.target)
        ok = isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype in _INTEGRAL
        return int(value) if ok else None
    if arg.op != "call_function":
        return None
    if arg.target is aten.sym_size.int or arg.target in _SIZE_OPERATORS:
        return arg
    if arg.target is aten.scalar_tensor.default:
        return _as_size(gm, arg.args[0])
    if arg.target is aten._to_copy.default and arg.kwargs.get("dtype") in _INTEGRAL and len(arg.args) == 1:
        return _as_size(gm, arg.args[0])
    python_op = _TENSOR_ARITHMETIC.get(arg.target)
    if python_op is None or len(arg.args) != 2 or arg.kwargs.get("alpha", 1) != 1:
        return None
    left, right = (_as_size(gm, a) for a in arg.args)
    if left is None or right is None:
        return None
    if isinstance(left, int) and isinstance(right, int):
        return python_op(left, right)
    return gm.graph.call_function(python_op, (left, right))


def _attr(root: torch.nn.Module, target: str) -> Any:
    obj: Any = root
    for name in target.split("."):
        obj = getattr(obj, name, None)
    return obj


def _erase_dead_size_nodes(graph: fx.Graph) -> None:
    # Only pure size nodes: fx's own dead-code pass would also judge the model's ops.
    removable = {
        aten.sym_size.int,
        aten.scalar_tensor.default,
        aten._to_copy.default,
        *_TENSOR_ARITHMETIC,
        *_SIZE_OPERATORS,
    }
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph.nodes)):
            if node.op == "call_function" and node.target in removable and not node.users:
                graph.erase_node(node)
                changed = True
        for node in list(graph.nodes):
            if node.op == "get_attr" and not node.users:
                graph.erase_node(node)


Build = Callable[[tuple[torch.Tensor, ...]], tuple[fx.GraphModule, dict]]


def symbolic_graph(
    build: Build, reference: torch.nn.Module, example: tuple[torch.Tensor, ...], why: str, modes: dict[str, bool]
) -> fx.GraphModule:
    """The capture of both torch.export routes: `build(inputs)` exports and lifts the model, returning the
    GraphModule and export's range constraints; `reference` is the original model and `modes` its modules'
    training flags by path, in which both run when compared (`set_modes`).

    Tries the widened example first (kept when the graph computes what the model computes on the real
    example), then works out which batch sizes the graph holds for and guards the others (ShapeGuard,
    whose message ends with `why`: where the model specialised the batch). Returns the graph in `modes`."""
    gm, ranges = None, {}
    wide = widened_example(example)
    if wide is not None:
        with contextlib.suppress(Exception):  # any failure of the widened try: the example's own size
            gm, ranges = build(wide)
            if not _same_runs(reference, gm, example, modes):
                gm = None
    if gm is None:
        gm, ranges = build(example)
    limits = batch_limits(gm, ranges)
    if any(lo == 2 for lo, _ in limits) and _holds_at_batch_one(gm, reference, example, limits, modes):
        limits = [(1 if lo == 2 else lo, hi) for lo, hi in limits]
    if any(limit != (1, None) for limit in limits):
        ShapeGuard(limits, why).install(gm)
    set_modes(gm, modes)
    return gm


def set_modes(module: torch.nn.Module, modes: dict[str, bool]) -> None:
    """Give every submodule the training flag `modes` has for its path, or the root's."""
    for name, sub in module.named_modules():
        sub.training = modes.get(name, modes.get("", False))


def _same_runs(
    reference: torch.nn.Module, gm: fx.GraphModule, inputs: tuple[torch.Tensor, ...], modes: dict[str, bool]
) -> bool:
    """Whether both compute the same on `inputs`, each in the original's modes, from the same random state
    (a dropout draws the same mask), with their buffers as they were before (a train-mode BatchNorm)."""
    outputs = []
    for model in (reference, gm):
        set_modes(model, modes)
        saved = [(b, b.clone()) for b in model.buffers()]
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(0)
                outputs.append(model(*inputs))
        finally:
            for buffer, value in saved:
                buffer.copy_(value)
    return same_outputs(*outputs)


def batch_limits(gm: fx.GraphModule, ranges: dict) -> list[tuple[int, int | None]]:
    """Per graph input, the batch sizes (axis 0) the graph holds for by export's reasoning: (n, n) when it
    fixed the axis, the range of its symbol otherwise (low 2: export assumes nothing about 1), (1, None)
    for an input without a batch axis. None: no upper bound."""
    limits = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() == 0:
            limits.append((1, None))
            continue
        size = val.shape[0]
        if isinstance(size, int):
            limits.append((size, size))
            continue
        bounds = ranges.get(size.node.expr)
        # (torch's int_oo claims is_finite; is_Integer tells a bound from it)
        lower = max(2, int(bounds.lower)) if bounds is not None and bounds.lower.is_Integer else 2
        upper = int(bounds.upper) if bounds is not None and bounds.upper.is_Integer else None
        limits.append((lower, upper))
    return limits


def _holds_at_batch_one(
    gm: fx.GraphModule,
    reference: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    limits: list[tuple[int, int | None]],
    modes: dict[str, bool],
) -> bool:
    """Whether the graph computes what the model computes at batch 1 (export's ranges leave 1 open)."""
    ones = tuple(t[:1] if lo == 2 and t.dim() > 0 else t for t, (lo, _) in zip(example, limits, strict=False))
    try:
        return _same_runs(reference, gm, ones, modes)
    except Exception:
        return False


class ShapeGuard:
    """A forward pre-hook: an input whose batch axis is outside the sizes the captured graph holds for is the
    engine's error, naming the input, the axis and the reason (a class, so the model deep-copies and pickles)."""

    def __init__(self, limits: list[tuple[int, int | None]], why: str) -> None:
        self.limits, self.why = limits, why

    def install(self, gm: fx.GraphModule) -> None:
        """Register on `gm` and on every deep copy of it (GraphModule's deepcopy keeps no forward hooks)."""
        gm.register_forward_pre_hook(self)
        gm._register_deepcopy_hook(self.install)

    def __call__(self, module: torch.nn.Module, args: tuple) -> None:
        for index, (x, (lo, hi)) in enumerate(zip(args, self.limits, strict=False)):
            if not isinstance(x, torch.Tensor) or x.dim() == 0:
                continue
            size = x.shape[0]
            if size < lo or (hi is not None and size > hi):
                span = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi is not None else f"{lo} and up"
                raise GraphCaptureError(
                    f"the captured graph holds for batch sizes {span} only (input {index} "
                    f"has {size} on axis 0): {self.why}"
                )
