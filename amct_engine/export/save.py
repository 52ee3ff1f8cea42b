"""Write the fake-quant and deploy ONNX models of a quantised model (docs/spec/engine.md §1.1, §5).

Pipeline: make an ExportQuantLayer (BN folded, record factors applied) of every QuantRetrainLayer,
once for both files; trace the model with them as placeholders, once (export.layer_graph), unless
PTQ's quantize_model traced it already; then per file, splice in the layers as the file's
`OnnxFormat` writer writes them, apply the format's finaliser, and check the file with onnx.checker
and onnxruntime (through the format's reference rewrite).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence

import onnx
import onnxruntime as ort
import torch
from torch import nn

from amct_engine.export.deploy_target import DEFAULT_DEPLOY_TARGET, TARGETS, resolve_deploy_target
from amct_engine.export.formats import DEFAULT_DEPLOY_FORMAT, check_deploy_format
from amct_engine.export.layer_graph import export_layer_graph, splice_layers
from amct_engine.export.onnx_formats import FAKE_QUANT, OnnxFormat
from amct_engine.export.quant_layer import ExportQuantLayer
from amct_engine.export.size_checks import check_file_sizes, record_size_checks, session_runner
from amct_engine.layers import behaviour_of
from amct_engine.quant.deployed import compute_factors, fold_batch_norm
from amct_engine.quant.retrain_layer import QuantRetrainLayer
from amct_engine.record import LayerQuantRecord

FILE_MODE = 0o640  # docs/spec/engine.md §1.1


def output_paths(save_path: str) -> dict[str, str]:
    """`<dir>/<prefix>` -> `<dir>/<prefix>_fake_quant_model.onnx` etc.; a trailing `/` drops the prefix."""
    save_path = str(save_path)
    prefix = save_path if save_path.endswith(("/", os.sep)) else save_path + "_"
    return {"fake_quant": prefix + "fake_quant_model.onnx", "deploy": prefix + "deploy_model.onnx"}


def quant_layers(model: nn.Module) -> dict[str, QuantRetrainLayer]:
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantRetrainLayer)}


def weight_codes(layer: nn.Module, record: LayerQuantRecord, deploy_target: str | None) -> tuple[int, bool]:
    """(width, signed) of a layer's weight codes in the file written for `deploy_target` (None: the record's
    8-bit codes, signed: the fake-quant and Ascend files). A target whose kernels add pairs of products in 16
    bits (`weight_bits` 7: x86_avx2) gets 7-bit codes on the convs that run on those kernels, which sum them
    exactly and measured as accurate as 8 bits on the mobile nets of docs/benchmarks.md; there a depthwise
    conv keeps 8 signed bits (its int8 kernel sums in 32 bits: ±127 weights on 255 codes came out exact), a
    Linear / MatMul keeps the record's 8 bits as uint8 + 128 on the exact u8u8 kernels unless the target
    reduces them too (x86_avx2_reduce_range: faster, 0.45 pt of a transformer task's accuracy in
    export/deploy_target.py's measurement), and a layer without an int8 kernel (INT16 inputs, transposed
    convs) runs float."""
    if deploy_target is None:
        return 8, True
    target = TARGETS[resolve_deploy_target(deploy_target)]
    behaviour = behaviour_of(layer)
    if target.weight_bits == 8 or record.act_bits != 8 or not behaviour.int8_kernel:
        return 8, target.signed_weights
    if behaviour.matmul_like:
        return (target.weight_bits, True) if target.reduce_linear else (8, False)
    groups = getattr(layer, "groups", 1)
    depthwise = groups > 1 and layer.in_channels == groups == layer.out_channels
    return (8 if depthwise else target.weight_bits), target.signed_weights


def export_layers(
    model: nn.Module, records: dict[str, LayerQuantRecord], deploy_target: str | None = None
) -> dict[str, ExportQuantLayer]:
    """Module path -> the ExportQuantLayer of each quantised layer of `model`, on the CPU.

    Every format folds BN and takes every factor from the record (docs/spec/engine.md §5). A `deploy_target`
    (export.deploy_target: the "onnx" deploy model's) picks each layer's weight codes (`weight_codes`: int8
    or uint8 + 128, 7 bits for AVX2's convs); None: the record's codes as they are (the fake-quant and Ascend
    files).
    """
    layers = {}
    for path, wrapper in quant_layers(model).items():
        layer = fold_batch_norm(wrapper.layer, wrapper.bn).cpu()  # a copy
        record = records[wrapper.layer_name]
        bits, signed = weight_codes(layer, record, deploy_target)
        layers[path] = ExportQuantLayer(
            wrapper.layer_name, layer, compute_factors(wrapper.layer_name, layer, record, bits)
        )
        layers[path].signed_weights = signed
    return layers


def build_export_model(model: nn.Module, layers: dict[str, ExportQuantLayer]) -> nn.Module:
    """A CPU copy of `model` with `layers` (export_layers) in place of its QuantRetrainLayers, to trace."""
    # The copy shares the wrappers instead of copying their quantisers, observers and caches (most of
    # the copy's time): each is replaced below.
    export_model = copy.deepcopy(model, memo={id(w): w for w in quant_layers(model).values()})
    for path, layer in layers.items():
        export_model.set_submodule(path, layer)
    return export_model.cpu().eval()


def export_onnx(
    model: nn.Module,
    path: str,
    input_data: tuple[torch.Tensor, ...],
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: dict | None = None,
) -> None:
    """torch.onnx.export of a float model to `path` (the exporter and settings of export.layer_graph),
    checked against `model` at the example and at other sizes of its dynamic axes."""
    graph = export_layer_graph(model, input_data, input_names, output_names, dynamic_axes)
    write_checked_onnx(graph, path, input_data, model)


def check_onnx(
    model: str | onnx.ModelProto,
    input_data: tuple[torch.Tensor, ...],
    onnx_format: OnnxFormat | None = None,
    reference: nn.Module | None = None,
) -> dict | None:
    """onnx.checker plus one onnxruntime run on the example input: a file we write always runs. With a
    `reference` (the PyTorch model the file computes), also the size checks of export.size_checks, whose
    record this returns.

    A format with custom ops (Ascend) runs through its `to_reference_onnx` rewrite; None: standard ONNX.
    """
    if isinstance(model, str):
        model = onnx.load(model)
    onnx.checker.check_model(model)
    if onnx_format is not None:
        model = onnx_format.to_reference_onnx(model)
    options = ort.SessionOptions()
    options.log_severity_level = 3  # onnxruntime's notes on unused initialisers are not the user's concern
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    session_runner(session)(input_data)
    if reference is None:
        return None
    return check_file_sizes(model, session, input_data, reference, "the exported ONNX model")


def write_checked_onnx(
    model: onnx.ModelProto,
    path: str,
    input_data: tuple[torch.Tensor, ...],
    reference: nn.Module,
    onnx_format: OnnxFormat | None = None,
) -> None:
    """Check `model` (check_onnx, with the size checks against `reference`), record the sizes checked in its
    metadata (export.size_checks) and write it: a file that fails a check is never written."""
    checks = check_onnx(model, input_data, onnx_format, reference)
    record_size_checks(model, checks)
    write_onnx_file(model, path)


def validate_dynamic_axes(dynamic_axes: dict | None) -> None:
    """docs/spec/engine.md §1.1: dict str -> list[int] or str -> dict[int, str]; axes must be >= 0."""
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
    deploy_format: str = DEFAULT_DEPLOY_FORMAT,
    deploy_target: str = DEFAULT_DEPLOY_TARGET,
    layer_graph: onnx.ModelProto | None = None,
) -> dict[str, str]:
    """Write both models; returns {"fake_quant": path, "deploy": path}.

    `deploy_format` names the deploy model's format in `amct_engine.export.formats.DEPLOY_FORMATS`:
    "onnx", the portable integer model onnxruntime runs; "ascend", AMCT's layout with
    AscendQuant/AscendDequant for the ATC converter (docs/spec/engine.md §5). `deploy_target`
    (a name of export.deploy_target, "auto" the exporting machine's kind) is the CPU the "onnx" deploy model
    is written for, and the deploy file's report says which. Its weights are the record's codes, except on
    "x86_avx2" and "x86_avx2_reduce_range" (7-bit codes: export.deploy_target).
    `layer_graph`: the model traced with its quantised layers as placeholders (export.layer_graph), when
    the caller has it (PTQ's quantize_model); by default traced here.
    """
    deploy = check_deploy_format(deploy_format).load()
    deploy_target = resolve_deploy_target(deploy_target)
    validate_dynamic_axes(dynamic_axes)
    cpu_inputs = tuple(t.detach().cpu() for t in input_data)
    paths = output_paths(save_path)
    # The export layers (BN folded, factors computed) and the traced graph, once for both files where the
    # deploy file stores the record's codes; the model they make is what a file computes, the reference of
    # its size checks.
    layers = export_layers(model, records)
    export_model = build_export_model(model, layers)
    if layer_graph is None:
        layer_graph = export_layer_graph(export_model, cpu_inputs, input_names, output_names, dynamic_axes)
    write_format(layer_graph, layers, FAKE_QUANT, paths["fake_quant"], cpu_inputs, export_model)
    if deploy.stores_for_target:
        layers = export_layers(model, records, deploy_target)
        if any(layer.factors.wts_bits != records[layer.layer_name].wts_bits for layer in layers.values()):
            export_model = build_export_model(model, layers)
    write_format(layer_graph, layers, deploy, paths["deploy"], cpu_inputs, export_model, deploy_target)
    return paths


def write_onnx_file(model: onnx.ModelProto, path: str) -> None:
    """Save `model` at `path` with the mode of our files (docs/spec/engine.md §1.1)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    onnx.save(model, path)
    os.chmod(path, FILE_MODE)


def write_format(
    layer_graph: onnx.ModelProto,
    layers: dict[str, ExportQuantLayer],
    onnx_format: OnnxFormat,
    path: str,
    input_data: tuple[torch.Tensor, ...],
    reference: nn.Module,
    deploy_target: str = DEFAULT_DEPLOY_TARGET,
) -> None:
    """Write the traced graph with `layers` (export_layers) spliced in by `onnx_format`'s writer: splice,
    finalise, check (against `reference`, the export model), save. `deploy_target` must be resolved (the one
    the layers were made for)."""
    by_name = {layer.layer_name: layer for layer in layers.values()}
    written = splice_layers(layer_graph, by_name, onnx_format.layer_writer, onnx_format.custom_opsets)
    if onnx_format.finalize is not None:
        written = onnx_format.finalize(written)
    if onnx_format.finalize_with_inputs is not None:
        names = [i.name for i in written.graph.input]
        feeds = {n: t.numpy() for n, t in zip(names, input_data, strict=False)}
        written = onnx_format.finalize_with_inputs(written, feeds, deploy_target)
    write_checked_onnx(written, path, input_data, reference, onnx_format)
