"""What onnxruntime makes of a deploy model: which op each quantised layer runs as after its optimiser, the
layers that stayed float and why, and the export's decisions stored in the file (`deploy_report`)."""

from __future__ import annotations

import json
from collections import defaultdict

import onnx
import onnxruntime as ort
from onnx import TensorProto

from amct_engine.export.deploy_target import TARGETS
from amct_engine.export.int4_pack import INT4_SUFFIX
from amct_engine.export.qdq.graph_index import LAYER_OPS

REPORT_KEY = "amct_deploy_report"


# What each quantised layer should become after ORT's optimiser.
FUSED_OPS = {
    "QLinearConv",
    "QGemm",
    "QLinearMatMul",
    "MatMulIntegerToFloat",
    "QLinearAdd",
    "QLinearConcat",
    "QLinearGlobalAveragePool",
    "QLinearAveragePool",
    "QLinearSigmoid",
    "QLinearMul",
    "QLinearLeakyRelu",
    "DynamicQuantizeMatMul",
    "MatMulNBits",
}


def optimized_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph ORT's CPU provider runs after its optimiser (all levels), as a ModelProto."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # not the warning that the saved graph is hardware specific
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


def _why_not_fused(model: onnx.ModelProto, layer: str) -> str:
    """The reason a layer's op stayed float: what reads its output in the deploy graph."""
    node = next(n for n in model.graph.node if n.name.split("/")[0] == layer and n.op_type in LAYER_OPS)
    outputs = {o.name for o in model.graph.output}
    readers = [n.op_type for n in model.graph.node if node.output[0] in n.input]
    if node.output[0] in outputs or not readers:
        return "its output is a model output, kept float (a quantised output would cost a rounding)"
    if "QuantizeLinear" not in readers:
        return (
            f"its output is read by float ops ({', '.join(sorted(set(readers)))}) and reaches no quantised "
            "layer, so it is not quantised and ORT cannot make an int8 kernel of it"
        )
    return "ORT's QDQ selectors rejected the group (see the optimised graph)"


# export/conv_float_stems.py says why.
FLOAT_STEM_REASON = "float stem by design: exact on its integer codes, faster than QLinearConv on one channel"


def fusion_report(model: onnx.ModelProto, deploy_target: str) -> dict:
    """Which op each quantised layer runs as after ORT's optimiser, and the layers that did not fuse, why.

    ORT names a fused node after the node it replaces, so `<layer>/<Op>` survives optimisation.
    """
    layers = {
        n.name.split("/")[0]
        for n in model.graph.node  # MatMulIntegerToFloat: export.float_output_matmul
        if n.op_type in LAYER_OPS | {"MatMulIntegerToFloat"} and "/" in n.name and not n.name.startswith("/")
    }
    optimized = optimized_ops(model)
    runs_as: dict[str, str] = {}
    for node in optimized.graph.node:
        layer = node.name.split("/")[0]
        layer_op = node.op_type in FUSED_OPS or node.op_type in LAYER_OPS | {"FusedConv", "FusedGemm"}
        if layer in layers and layer_op and runs_as.get(layer) not in FUSED_OPS:
            runs_as[layer] = node.op_type
    ops: dict[str, int] = defaultdict(int)
    for node in optimized.graph.node:
        ops[node.op_type] += 1
    not_fused = {
        layer: f"runs as float {op}: {_why_not_fused(model, layer)}"
        for layer, op in runs_as.items()
        if op not in FUSED_OPS
    }
    for node in model.graph.node:  # layers the writer could not give an int8 kernel (QdqDeployBackend)
        if node.op_type == "Identity" and node.name.endswith("/NoInt8Kernel"):
            layer = node.name.split("/")[0]
            runs_as[layer] = "float (integer-valued)"
            not_fused[layer] = (
                "INT16 activations or a transposed conv: onnxruntime has no int8 kernel for it, "
                "so it runs the fake-quant form (integer-valued floats, exact)"
            )
    return {
        "deploy_target": deploy_target,
        "layers": runs_as,
        "not_fused": not_fused,
        "optimized_op_counts": dict(sorted(ops.items())),
    }


def deploy_report(model: str | onnx.ModelProto) -> dict:
    """A deploy model's report ({} for a file `finalize_qdq_deploy` did not write): the export's decisions
    stored in the file (deploy target, conv layout rewrites, float-output MatMuls), the INT4 weights, and
    which op each quantised layer runs as after this onnxruntime's optimiser, with the layers that did not
    fuse and why and the op counts of that graph (`fusion_report`, computed now: an onnxruntime session)."""
    model = onnx.load(model) if isinstance(model, str) else model
    stored = next((json.loads(p.value) for p in model.metadata_props if p.key == REPORT_KEY), None)
    if stored is None:
        return {}
    report = fusion_report(model, stored["deploy_target"])
    layout = {
        key: stored.get(key, []) for key in ("wide_kernels", "float_stems", "padded_input_channels", "gemm_path_convs")
    }
    for layer in (name.split("/")[0] for name in layout["float_stems"]):  # ORT renames them (NCHWc)
        report["layers"][layer] = "Conv"
        report["not_fused"][layer] = FLOAT_STEM_REASON
    report["int4_weights"] = [
        t.name.removesuffix(INT4_SUFFIX) for t in model.graph.initializer if t.data_type == TensorProto.INT4
    ]
    report["conv_layout"] = layout
    target = TARGETS.get(stored["deploy_target"])
    if target is not None:  # the widest weight code (7 on x86_avx2; depthwise convs keep 8: export/save.py)
        report["weight_bits"] = target.weight_bits
    report["matmul_integer_to_float"] = stored.get("matmul_integer_to_float", [])
    # HardSwish nodes whose gate runs on codes, PRelu nodes rewritten (export/qdq/activations_on_codes.py)
    report["activations"] = stored.get("activations", {})
    report["int8_embeddings"] = stored.get("int8_embeddings", [])  # tables as int8 rows (qdq/embeddings.py)
    # softmaxes whose NaN guard went with a finite mask fill (export/attention_masks.py)
    report["finite_attention_masks"] = stored.get("finite_attention_masks", [])
    return report
