"""The "onnx" deploy format's finaliser: the QDQ passes in order, the deploy target's rewrites, the report."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import onnx

from amct_engine.export.attention_masks import finite_attention_masks
from amct_engine.export.conv_float_stems import float_stems
from amct_engine.export.conv_int8_paths import convs_on_the_gemm_path, pad_input_channels
from amct_engine.export.conv_layout import tall_kernels_as_wide
from amct_engine.export.deploy_target import TARGETS
from amct_engine.export.float_output_matmul import matmuls_to_integer_to_float
from amct_engine.export.int4_pack import pack_int4_weights
from amct_engine.export.onnx_graph import drop_default_attributes
from amct_engine.export.qdq.activations_on_codes import hardswish_on_codes, prelu_without_float_kernel
from amct_engine.export.qdq.batch_norm import batch_norms_as_depthwise_convs
from amct_engine.export.qdq.boundaries import quantize_boundaries
from amct_engine.export.qdq.embeddings import int8_embeddings
from amct_engine.export.qdq.fusion_report import REPORT_KEY
from amct_engine.export.qdq.names import name_after_layers, short_activation_names

PRODUCER = "amct_engine"
# The conv rewrites a deploy target may ask for (export/deploy_target.py `DeployTarget.rewrites`), by the
# name the file's report records their result under; applied in the order a target lists them.
TARGET_REWRITES: dict[str, Callable[[onnx.ModelProto], list[str]]] = {
    "float_stems": float_stems,
    "padded_input_channels": pad_input_channels,
    "gemm_path_convs": convs_on_the_gemm_path,
}


def finalize_qdq_deploy(model: onnx.ModelProto, feeds: dict[str, np.ndarray], deploy_target: str) -> onnx.ModelProto:
    """The "onnx" deploy format's finaliser: boundaries quantised, names, the target's rewrites, producer, and
    the export's decisions in the file's metadata (`deploy_report` adds what onnxruntime makes of the graph)."""
    model = batch_norms_as_depthwise_convs(quantize_boundaries(model, feeds))
    activations = {"hardswish_on_codes": hardswish_on_codes(model), "prelu": prelu_without_float_kernel(model)}
    activations = {kind: nodes for kind, nodes in activations.items() if nodes}
    model = name_after_layers(model)
    decisions: dict = {"deploy_target": deploy_target, "activations": activations}
    decisions["wide_kernels"] = tall_kernels_as_wide(model)
    for name in TARGETS[deploy_target].rewrites:
        decisions[name] = TARGET_REWRITES[name](model)
    decisions["matmul_integer_to_float"] = matmuls_to_integer_to_float(model)
    decisions["finite_attention_masks"] = finite_attention_masks(model)  # softmaxes without a NaN guard
    decisions["int8_embeddings"] = int8_embeddings(model)  # lookup tables as int8 rows + row scales
    model = pack_int4_weights(model)
    model = drop_default_attributes(short_activation_names(model))  # after the packing: it writes value_info
    model.producer_name = PRODUCER
    kept = [p for p in model.metadata_props if p.key != REPORT_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    # Only what cannot be read off the graph, and no empty lists: a few percent of a small A8W4 file.
    stored = {key: value for key, value in decisions.items() if value}
    model.metadata_props.add(key=REPORT_KEY, value=json.dumps(stored, sort_keys=True, separators=(",", ":")))
    return model
