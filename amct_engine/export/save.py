"""Write the fake-quant and deploy ONNX models of a quantised model (docs/spec/engine.md §1.1, §5).

Pipeline: swap every QuantRetrainLayer for an ExportQuantLayer (BN folded, record factors applied),
once for both files; then per file, hand those layers the file's `OnnxFormat` writer, export, apply
the format's finaliser, and check the file with onnx.checker and onnxruntime (through the format's
reference rewrite).
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

from amct_engine.export.deploy_target import DEFAULT_DEPLOY_TARGET, resolve_deploy_target, signed_weights
from amct_engine.export.dynamic_shapes import traceable_sizes
from amct_engine.export.formats import check_deploy_format
from amct_engine.export.onnx_formats import FAKE_QUANT, OnnxFormat
from amct_engine.export.quant_layer import ExportQuantLayer
from amct_engine.quant.deployed import compute_factors, fold_batch_norm
from amct_engine.quant.retrain_layer import QuantRetrainLayer
from amct_engine.record import LayerQuantRecord

OPSET = 17
FILE_MODE = 0o640  # docs/spec/engine.md §1.1


def output_paths(save_path: str) -> dict[str, str]:
    """`<dir>/<prefix>` -> `<dir>/<prefix>_fake_quant_model.onnx` etc.; a trailing `/` drops the prefix."""
    save_path = str(save_path)
    prefix = save_path if save_path.endswith(("/", os.sep)) else save_path + "_"
    return {"fake_quant": prefix + "fake_quant_model.onnx", "deploy": prefix + "deploy_model.onnx"}


def quant_layers(model: nn.Module) -> dict[str, QuantRetrainLayer]:
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantRetrainLayer)}


def build_export_model(
    model: nn.Module, records: dict[str, LayerQuantRecord], onnx_format: OnnxFormat,
    deploy_target: str = DEFAULT_DEPLOY_TARGET,
) -> nn.Module:
    """A CPU copy of `model` whose quantised layers are ExportQuantLayers written by `onnx_format`.

    Every back end folds BN and takes every factor from the record (docs/spec/engine.md §5).
    `deploy_target` (export.deploy_target) picks int8 or uint8 + 128 weight codes.
    """
    wrappers = quant_layers(model)
    # Each wrapper is replaced below: the copy shares them instead of copying their quantisers, observers
    # and caches (most of the copy's time), and moves to the CPU only once they are out of it.
    export_model = copy.deepcopy(model, memo={id(w): w for w in wrappers.values()})
    for path, wrapper in wrappers.items():
        layer = fold_batch_norm(wrapper.layer, wrapper.bn)
        record = records[wrapper.layer_name]
        factors = compute_factors(wrapper.layer_name, layer, record)
        new = ExportQuantLayer(wrapper.layer_name, layer, factors, onnx_format.layer_writer)
        new.signed_weights = signed_weights(deploy_target)
        export_model.set_submodule(path, new)
    return export_model.cpu().eval()


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


def check_onnx(
    model: str | onnx.ModelProto, input_data: tuple[torch.Tensor, ...], onnx_format: OnnxFormat | None = None
) -> list[np.ndarray]:
    """onnx.checker plus one onnxruntime run on the example input: a file we write always runs.

    A format with custom ops (Ascend) runs through its `to_reference_onnx` rewrite; None: standard ONNX.
    """
    if isinstance(model, str):
        model = onnx.load(model)
    onnx.checker.check_model(model)
    if onnx_format is not None:
        model = onnx_format.to_reference_onnx(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: t.detach().cpu().numpy() for i, t in zip(session.get_inputs(), input_data, strict=False)}
    return session.run(None, feeds)


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
    deploy_format: str = "onnx",
    deploy_target: str = DEFAULT_DEPLOY_TARGET,
) -> dict[str, str]:
    """Write both models; returns {"fake_quant": path, "deploy": path}.

    `deploy_format` names the deploy model's format in `amct_engine.export.formats.DEPLOY_FORMATS`:
    "onnx", the portable integer model onnxruntime runs; "ascend", AMCT's layout with
    AscendQuant/AscendDequant for the ATC converter (docs/spec/engine.md §5). `deploy_target`
    ("auto", "x86_vnni", "x86_avx2", "arm"; export.deploy_target) is the CPU the "onnx" deploy
    model is written for; "auto" is the exporting machine's kind, and the deploy file's report says which.
    """
    deploy = check_deploy_format(deploy_format).load()
    deploy_target = resolve_deploy_target(deploy_target)
    validate_dynamic_axes(dynamic_axes)
    cpu_inputs = tuple(t.detach().cpu() for t in input_data)
    paths = output_paths(save_path)
    formats = {"fake_quant": FAKE_QUANT, "deploy": deploy}
    # One export model for both files (a copy of `model`, BN folded, factors computed once); each
    # file's export only hands its layers the file format's writer.
    export_model = build_export_model(model, records, FAKE_QUANT, deploy_target)
    for kind, path in paths.items():
        write_export_model(export_model, formats[kind], path, cpu_inputs, input_names, output_names,
                           dynamic_axes, deploy_target)
    return paths


def write_export_model(
    export_model: nn.Module,
    onnx_format: OnnxFormat,
    path: str,
    input_data: tuple[torch.Tensor, ...],
    input_names=None,
    output_names=None,
    dynamic_axes=None,
    deploy_target: str = DEFAULT_DEPLOY_TARGET,
) -> None:
    """Write a `build_export_model` model in `onnx_format` (its layers take the format's writer): export,
    finalise, check. `deploy_target` must be resolved (the one the model was built for)."""
    for layer in export_model.modules():
        if isinstance(layer, ExportQuantLayer):
            layer.writer = onnx_format.layer_writer
    export_onnx(export_model, path, input_data, input_names, output_names, dynamic_axes,
                dict(onnx_format.custom_opsets) or None)
    written = None  # the file is loaded, finalised and saved once, and checked from memory
    if onnx_format.finalize is not None:
        written = onnx_format.finalize(onnx.load(path))
    if onnx_format.finalize_with_inputs is not None:
        written = written if written is not None else onnx.load(path)
        names = [i.name for i in written.graph.input]
        feeds = {n: t.numpy() for n, t in zip(names, input_data, strict=False)}
        written = onnx_format.finalize_with_inputs(written, feeds, deploy_target)
    if written is not None:
        onnx.save(written, path)  # over the exported file: it keeps that file's mode
    check_onnx(path if written is None else written, input_data, onnx_format)
