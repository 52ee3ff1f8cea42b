"""Write the fake-quant and deploy ONNX models of a quantised model (spec §1.1, §5).

Pipeline: swap every QuantRetrainLayer for an ExportQuantLayer (BN folded, record factors
applied), export once per back end, then check each file with onnx.checker and onnxruntime.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from amct_engine.export.ascend import (
    ASCEND_DOMAIN,
    ascend_to_standard_onnx,
    constants_to_initializers,
    finalize_ascend_model,
    is_ascend_model,
)
from amct_engine.export.dynamic_shapes import traceable_sizes
from amct_engine.export.quant_layer import ExportQuantLayer, compute_factors, fold_batch_norm
from amct_engine.export.requant import requant_targets
from amct_engine.quant.retrain_layer import QuantRetrainLayer
from amct_engine.record import LayerQuantRecord

OPSET = 17
FILE_MODE = 0o640  # spec §1.1
DEPLOY_BACKENDS = {"onnx": "deploy", "ascend": "ascend"}


def output_paths(save_path: str) -> dict[str, str]:
    """`<dir>/<prefix>` -> `<dir>/<prefix>_fake_quant_model.onnx` etc.; a trailing `/` drops the prefix."""
    save_path = str(save_path)
    prefix = save_path if save_path.endswith(("/", os.sep)) else save_path + "_"
    return {"fake_quant": prefix + "fake_quant_model.onnx", "deploy": prefix + "deploy_model.onnx"}


def quant_layers(model: nn.Module) -> dict[str, QuantRetrainLayer]:
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantRetrainLayer)}


def build_export_model(
    model: nn.Module, records: dict[str, LayerQuantRecord], backend: str, requant: dict[str, str] | None = None
) -> nn.Module:
    """A CPU copy of `model` whose quantised layers are ExportQuantLayers for `backend`.

    Every back end folds BN and takes every factor from the record (spec §5). `requant` (layer
    path -> next quantised layer path, see export.requant) lets a layer quantise its output with
    the next layer's input quantiser.
    """
    export_model = copy.deepcopy(model).cpu().eval()
    wrappers = quant_layers(export_model)
    for path, wrapper in wrappers.items():
        layer = fold_batch_norm(wrapper.layer, wrapper.bn)
        record = records[wrapper.layer_name]
        factors = compute_factors(wrapper.layer_name, layer, record)
        new = ExportQuantLayer(wrapper.layer_name, layer, factors, backend)
        target = (requant or {}).get(path)
        if target is not None:
            following = records[wrappers[target].layer_name]
            if record.act_bits == following.act_bits == 8:
                new.output_quant = (following.scale_d, following.offset_d)
        export_model.set_submodule(path, new)
    return export_model


def export_onnx(
    model: nn.Module,
    path: str,
    input_data: tuple[torch.Tensor, ...],
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: dict | None = None,
    custom_opsets: dict | None = None,
) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript-based exporter warns that it is legacy; see backends.py for why we use it.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            traceable_sizes(model),
            input_data,
            path,
            dynamo=False,
            opset_version=OPSET,
            input_names=list(input_names) if input_names else None,
            output_names=list(output_names) if output_names else None,
            dynamic_axes=dynamic_axes,
            do_constant_folding=True,
            custom_opsets=custom_opsets,
            autograd_inlining=False,
        )
    os.chmod(path, FILE_MODE)


def compact_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """Constant nodes become initialisers and internal tensor names get short: same graph, fewer bytes.

    The exporter's names (`/layer1/conv1/Constant_4_output_0`) and one Constant node per scale cost
    ~4 KB on a 20k-parameter model, a fifth of its INT8 deploy file. Node names stay (they name layers).
    """
    constants_to_initializers(model)
    graph = model.graph
    public = {v.name for v in graph.input} | {v.name for v in graph.output}
    names: dict[str, str] = {}

    def short(name: str) -> str:
        return name if not name or name in public else names.setdefault(name, f"t{len(names)}")

    for node in graph.node:
        node.input[:] = [short(n) for n in node.input]
        node.output[:] = [short(n) for n in node.output]
    for tensor in graph.initializer:
        tensor.name = short(tensor.name)
    for info in graph.value_info:
        info.name = short(info.name)
    return model


def check_onnx(model: str | onnx.ModelProto, input_data: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
    """onnx.checker plus one onnxruntime run on the example input: a file we write always runs.

    An Ascend deploy model runs through the reference rewrite of its custom ops.
    """
    if isinstance(model, str):
        model = onnx.load(model)
    onnx.checker.check_model(model)
    if is_ascend_model(model):
        model = ascend_to_standard_onnx(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: t.detach().cpu().numpy() for i, t in zip(session.get_inputs(), input_data, strict=False)}
    return session.run(None, feeds)


def validate_dynamic_axes(dynamic_axes: dict | None) -> None:
    """spec §1.1: dict str -> list[int] or str -> dict[int, str]; axes must be >= 0."""
    if dynamic_axes is None:
        return
    if not isinstance(dynamic_axes, dict):
        raise TypeError("dynamic_axes must be a dict of input/output name -> axes")
    for name, axes in dynamic_axes.items():
        keys = axes.keys() if isinstance(axes, dict) else axes
        if not all(isinstance(a, int) and a >= 0 for a in keys):
            raise RuntimeError(f"dynamic_axes[{name!r}]: axes must be integers >= 0, got {list(keys)}")


def save_quantized_onnx(
    model: nn.Module,
    records: dict[str, LayerQuantRecord],
    save_path: str,
    input_data: tuple[torch.Tensor, ...],
    input_names=None,
    output_names=None,
    dynamic_axes=None,
    deploy_format: str = "onnx",
) -> dict[str, str]:
    """Write both models; returns {"fake_quant": path, "deploy": path}.

    deploy_format "onnx": the portable integer model onnxruntime runs; "ascend": AMCT's layout
    with AscendQuant/AscendDequant for the ATC converter (spec §5).
    """
    if deploy_format not in DEPLOY_BACKENDS:
        raise ValueError(f"deploy_format must be one of {', '.join(DEPLOY_BACKENDS)}, got {deploy_format!r}")
    validate_dynamic_axes(dynamic_axes)
    cpu_inputs = tuple(t.detach().cpu() for t in input_data)
    paths = output_paths(save_path)
    backends = {"fake_quant": "fake_quant", "deploy": DEPLOY_BACKENDS[deploy_format]}
    cpu_model = copy.deepcopy(model).cpu().eval()
    requant = requant_targets(cpu_model, cpu_inputs) if backends["deploy"] == "deploy" else None
    for kind, path in paths.items():
        backend = backends[kind]
        export_model = build_export_model(cpu_model, records, backend, requant if kind == "deploy" else None)
        opsets = {ASCEND_DOMAIN: 1} if backend == "ascend" else None
        export_onnx(export_model, path, cpu_inputs, input_names, output_names, dynamic_axes, opsets)
        if backend == "ascend":
            onnx.save(finalize_ascend_model(onnx.load(path)), path)
        elif backend == "deploy":
            onnx.save(compact_graph(onnx.load(path)), path)
        check_onnx(path, cpu_inputs)
    return paths
