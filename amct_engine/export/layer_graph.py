"""One traced graph for every ONNX file of a model: each quantised layer a placeholder node that each
file's layer writer replaces by its own nodes (docs/spec/engine.md §5.1).

torch.onnx.export costs ~20 ms on the Fashion-MNIST CNN (the trace, the exporter's passes, the
serialisation), and PTQ wrote three files that way: the BN-folded float model of quantize_model, the
fake-quant and the deploy model. Around the quantised layers the three graphs are the same. So the
model is traced once with every quantised layer as an `amct.layer::Layer` node (its name and input
rank as attributes); each file is that graph with the placeholders replaced ("spliced") by the nodes
its writer emits through `OnnxBuilder`, which takes torch.onnx's `g.op` calling convention, so one
writer serves both.
"""

from __future__ import annotations

import io
import itertools
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from torch import nn
from torch.onnx import symbolic_helper

from amct_engine.export.aten_symbolics import register as register_symbolics
from amct_engine.export.dynamic_shapes import traceable_sizes
from amct_engine.layers import behaviour_of

# Temporary attributes a layer writer puts on the nodes it writes (the layer's name, its weight type), read
# and removed by the file's finaliser (export/qdq/boundaries.py, export/ascend.py).
LAYER_ATTR = "amct_layer"
WTS_TYPE_ATTR = "amct_wts_type"
PLACEHOLDER_DOMAIN = "amct.layer"
PLACEHOLDER_OP = "Layer"
OPSET = 17


class _ModuleRef:
    """Opaque holder: the tracer rejects an nn.Module passed straight to Function.apply."""

    def __init__(self, module: nn.Module):
        self.module = module


class _PlaceholderFunction(torch.autograd.Function):
    """Runs the layer's `compute` (so the trace sees real shapes and values) and exports as a placeholder."""

    @staticmethod
    def forward(ctx, x, ref: _ModuleRef):
        y = ref.module.compute(x)
        ref.module.traced_shape = y.shape
        return y

    @staticmethod
    def symbolic(g, x, ref: _ModuleRef):
        rank = symbolic_helper._get_tensor_rank(x)
        out = g.op(
            f"{PLACEHOLDER_DOMAIN}::{PLACEHOLDER_OP}",
            x,
            name_s=ref.module.layer_name,
            rank_i=-1 if rank is None else rank,
        )
        out.setType(x.type().with_sizes(_output_sizes(x, ref.module)))
        return out


def _output_sizes(x, module) -> list[int | None]:
    """The placeholder's output sizes as ONNX shape inference gives a Conv's or Gemm's: the traced size of
    the channel axis, and of every other axis whose input size is static; None (symbolic) where it is not.
    A symbolic size keeps the exporter from folding `y.size(0)` of a dynamic batch into a constant."""
    traced = list(module.traced_shape)
    known = x.type().varyingSizes() or [None] * len(traced)
    channel = behaviour_of(module.layer).output_channel_axis(len(traced))
    return [
        size if i == channel or (i < len(known) and known[i] is not None) else None for i, size in enumerate(traced)
    ]


class LayerPlaceholder(nn.Module):
    """A layer the traced graph leaves as a placeholder; subclasses say what it computes while tracing."""

    def __init__(self, name: str, layer: nn.Module):
        super().__init__()
        self.layer_name = name
        self.layer = layer

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _PlaceholderFunction.apply(x, _ModuleRef(self))


def export_layer_graph(
    model: nn.Module,
    input_data: tuple[torch.Tensor, ...],
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: dict | None = None,
) -> onnx.ModelProto:
    """The TorchScript export of `model` (its LayerPlaceholders as placeholder nodes), in memory."""
    if dynamic_axes and isinstance(model, torch.fx.GraphModule):
        input_names, output_names = _graph_module_names(model, input_names, output_names)
    buffer = io.BytesIO()
    # Declared only when used: torch's C++ side warns on stderr about an unused custom domain (a float model).
    has_layers = any(isinstance(m, LayerPlaceholder) for m in model.modules())
    register_symbolics(OPSET)  # aten::rms_norm and grouped-query attention (export/aten_symbolics.py)
    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript-based exporter warns that it is legacy; export/backends.py says why we use it.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            traceable_sizes(model),
            input_data,
            buffer,
            dynamo=False,
            opset_version=OPSET,
            input_names=list(input_names) if input_names else None,
            output_names=list(output_names) if output_names else None,
            dynamic_axes=dynamic_axes,
            do_constant_folding=True,
            custom_opsets={PLACEHOLDER_DOMAIN: 1} if has_layers else None,
            autograd_inlining=False,
        )
    return onnx.load_from_string(buffer.getvalue())


def _graph_module_names(
    model: torch.fx.GraphModule, input_names: Sequence[str] | None, output_names: Sequence[str] | None
) -> tuple[Sequence[str], Sequence[str]]:
    """Names for the inputs and outputs the caller left unnamed, as torch.onnx would give them: its check of
    `dynamic_axes` reads a model's `.graph` as a TorchScript graph when a list is missing, which an fx
    GraphModule's (a model captured through torch.export) is not (AttributeError 'Graph' has no 'inputs')."""
    if not input_names:
        input_names = [node.name for node in model.graph.nodes if node.op == "placeholder"]
    if not output_names:
        output = next(node for node in model.graph.nodes if node.op == "output")
        count = len(torch.utils._pytree.tree_leaves(output.args[0]))
        output_names = ["output"] if count == 1 else [f"output_{i}" for i in range(count)]
    return input_names, output_names


def _attribute_value(key: str, value):
    """torch.onnx's typed attribute names: `_i` int(s), `_f` float(s), `_s` string, `_t` tensor."""
    kind = key[-1]
    if isinstance(value, torch.Tensor) and kind != "t":
        value = value.tolist()
    if kind == "i":
        return [int(v) for v in value] if isinstance(value, (list, tuple)) else int(value)
    if kind == "f":
        return [float(v) for v in value] if isinstance(value, (list, tuple)) else float(value)
    if kind == "t":
        return numpy_helper.from_array(value.detach().cpu().numpy())
    return str(value)


class OnnxBuilder:
    """The `g` a layer writer emits into: `op(op_type, *inputs, **attrs)` as torch.onnx's GraphContext
    (`domain::Op` names, typed attribute suffixes, `Constant` with `value_t`), building ONNX nodes;
    constants become initialisers, and a Transpose of one is folded as the exporter's constant folding did."""

    def __init__(self, names: itertools.count):
        self._names = names
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.ranks: dict[str, int] = {}
        self.scope = ""

    def _name(self, what: str) -> str:
        return f"/{self.scope}/{what}_{next(self._names)}"

    def rank(self, x: str) -> int | None:
        """The rank of a tensor the placeholder received (what symbolic_helper._get_tensor_rank gave)."""
        return self.ranks.get(x)

    def op(self, op_type: str, *inputs, **attrs) -> str:
        if op_type == "Constant":
            name = self._name("Constant")
            self.initializers[name] = attrs["value_t"].detach().cpu().numpy()
            return name
        if op_type == "Transpose" and inputs[0] in self.initializers:
            name = self._name("Constant")
            self.initializers[name] = np.ascontiguousarray(self.initializers[inputs[0]].transpose(attrs["perm_i"]))
            return name
        domain, _, op_type = op_type.rpartition("::")
        node_name = self._name(op_type)
        self.nodes.append(
            helper.make_node(
                op_type,
                [i if i is not None else "" for i in inputs],
                [node_name + "_output"],
                name=node_name,
                domain=domain or None,
                **{k[:-2]: _attribute_value(k, v) for k, v in attrs.items()},
            )
        )
        return self.nodes[-1].output[0]


def _placeholder_attributes(node: onnx.NodeProto) -> tuple[str, int | None]:
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    rank = values["rank"]
    return values["name"].decode(), None if rank < 0 else rank


def splice_layers(
    graph_model: onnx.ModelProto,
    layers: Mapping[str, nn.Module],
    writer,
    custom_opsets: Mapping[str, int] = (),
) -> onnx.ModelProto:
    """A copy of `graph_model` with each placeholder replaced by `writer.emit(g, x, layers[name])`'s nodes."""
    model = onnx.ModelProto()
    model.CopyFrom(graph_model)
    graph, builder, nodes = model.graph, OnnxBuilder(itertools.count()), []
    for node in graph.node:
        if node.domain != PLACEHOLDER_DOMAIN:
            nodes.append(node)
            continue
        name, rank = _placeholder_attributes(node)
        builder.scope, builder.ranks = name, {node.input[0]: rank}
        first = len(builder.nodes)
        result = writer.emit(builder, node.input[0], layers[name])
        emitted = builder.nodes[first:]
        for new in emitted:  # the last node writes the placeholder's output tensor
            new.output[:] = [node.output[0] if out == result else out for out in new.output]
        nodes.extend(emitted)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in builder.initializers.items())
    imports = [o for o in model.opset_import if o.domain != PLACEHOLDER_DOMAIN]
    imports += [helper.make_opsetid(domain, version) for domain, version in dict(custom_opsets).items()]
    del model.opset_import[:]
    model.opset_import.extend(imports)
    return model
