"""report.json: what a user wants to know after compression.

(docs/architecture.md, "job_process/: the process that runs a job".)

Parameters, ONNX file sizes, accuracy of the original and the deploy model on held-out data (or
output agreement with the original when there are no labels), onnxruntime latency FP32 vs deploy.
Both models are measured the same way: in onnxruntime, on the same samples.
"""

from __future__ import annotations

import os
import time

import numpy as np
import onnx
import onnxruntime as ort

from amct_engine.export.formats import DEFAULT_DEPLOY_FORMAT, DEPLOY_FORMATS
from amct_engine.export.qdq.fusion_report import deploy_report
from job_process import size_report

LATENCY_WARMUP, LATENCY_RUNS = 3, 20


def _session(path: str, deploy_format: str = DEFAULT_DEPLOY_FORMAT) -> ort.InferenceSession:
    """An onnxruntime session on the file, through its format's reference rewrite (e.g. the Ascend
    layout's custom ops, which have no device here)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # per-model latency without the noise of thread scheduling
    model = DEPLOY_FORMATS[deploy_format].load().to_reference_onnx(onnx.load(path))
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _feeds(
    session: ort.InferenceSession, x: tuple[np.ndarray, ...], names: list[str] | None, start: int, stop: int
) -> dict:
    """The model's inputs in signature order (`names`); the exporter drops an input the graph never reads."""
    present = [i.name for i in session.get_inputs()]
    if len(present) == len(x) or not names:
        return {name: a[start:stop] for name, a in zip(present, x, strict=False)}
    return {name: a[start:stop] for name, a in zip(names, x, strict=False) if name in present}


def predict(
    path: str, x, deploy_format: str = DEFAULT_DEPLOY_FORMAT, batch: int = 256, input_names: list[str] | None = None
) -> list[np.ndarray]:
    """Every output of the file over `x` (an array or a tuple of arrays, one per input), concatenated."""
    x = x if isinstance(x, tuple) else (x,)
    session = _session(path, deploy_format)
    parts = [session.run(None, _feeds(session, x, input_names, i, i + batch)) for i in range(0, len(x[0]), batch)]
    return [np.concatenate([p[k] for p in parts]) for k in range(len(parts[0]))]


def latency_ms(
    paths: str | dict[str, str],
    x,
    deploy_format: str | dict[str, str] = DEFAULT_DEPLOY_FORMAT,
    input_names: list[str] | None = None,
) -> dict:
    """onnxruntime's time per run of one file (`paths` a path: its figures) or of several side by side (`paths`
    a dict name -> path: each name's figures), on one thread.

    Several files are timed interleaved, each round running every file once in an order that alternates, so
    that a change of the machine's load falls on all of them alike: timed one after the other on a busy
    machine, a report claimed 10.9x for a MiniLM PTQ whose speed-up interleaved was 3.5x (issue 39)."""
    x = x if isinstance(x, tuple) else (x,)
    files = paths if isinstance(paths, dict) else {"file": paths}
    formats = deploy_format if isinstance(deploy_format, dict) else dict.fromkeys(files, deploy_format)
    sessions = {name: _session(path, formats[name]) for name, path in files.items()}
    feeds = {name: _feeds(s, x, input_names, 0, len(x[0])) for name, s in sessions.items()}
    times: dict[str, list[float]] = {name: [] for name in files}
    for run in range(LATENCY_WARMUP + LATENCY_RUNS):
        for name in list(files) if run % 2 == 0 else reversed(list(files)):
            start = time.perf_counter()
            sessions[name].run(None, feeds[name])
            if run >= LATENCY_WARMUP:
                times[name].append((time.perf_counter() - start) * 1000)
    figures = {
        name: {
            "median": float(np.median(t)),
            "p90": float(np.percentile(t, 90)),
            "min": float(np.min(t)),
            "batch": int(len(x[0])),
        }
        for name, t in times.items()
    }
    return figures if isinstance(paths, dict) else figures["file"]


def _rows(x: tuple, batch: int) -> tuple:
    """`batch` held-out rows (the first ones, repeated where there are fewer)."""
    n = len(x[0])
    return tuple(np.ascontiguousarray(a[:batch]) if n >= batch else np.resize(a, (batch, *a.shape[1:])) for a in x)


def _weight_tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    # The exporter folds some weights into Constant nodes instead of initializers.
    for node in graph.node:
        if node.op_type == "Constant":
            yield from (a.t for a in node.attribute if a.name == "value")


# Which input of a layer op is its weight, and (integer ops) how many inputs later its zero point comes.
# MatMulIntegerToFloat (A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias): the deploy graph's
# float-output Linears (amct_engine/export/float_output_matmul.py).
WEIGHT_INPUT = {
    "Conv": 1,
    "ConvTranspose": 1,
    "Gemm": 1,
    "MatMul": 1,
    "ConvInteger": 1,
    "MatMulInteger": 1,
    "QLinearConv": 3,
    "QLinearMatMul": 3,
    "MatMulIntegerToFloat": 1,
}
ZERO_POINT_AFTER = {
    "ConvInteger": 2,
    "MatMulInteger": 2,
    "QLinearConv": 2,
    "QLinearMatMul": 2,
    "MatMulIntegerToFloat": 4,
}
# The axis a per-channel zero point runs along: the output channel of a conv, the output column of a matmul.
ZERO_POINT_AXIS = {
    "ConvInteger": 0,
    "QLinearConv": 0,
    "MatMulInteger": -1,
    "QLinearMatMul": -1,
    "MatMulIntegerToFloat": -1,
}
# Ops the exporters put between a stored weight and its layer without changing which values are zero.
PASS_THROUGH = {"Transpose", "Cast", "Reshape", "Identity", "Squeeze", "Unsqueeze"}


def _attribute(node: onnx.NodeProto, name: str, default):
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _along(zero_point, ndim: int, axis: int):
    """A scalar or per-channel zero point, shaped to broadcast against codes of `ndim` dimensions."""
    zero_point = np.asarray(zero_point)
    if zero_point.size <= 1:
        return zero_point.reshape(())
    shape = [1] * ndim
    shape[axis] = -1
    return zero_point.reshape(shape)


def _stored_weight(name: str, producers: dict, constants: dict):
    """The stored tensor behind a layer's weight input and the value that means zero in it: 0 for floats,
    the zero point for the integer codes a DequantizeLinear reads. None when the input is not a constant
    (a MatMul of two activations)."""
    for _ in range(8):  # a weight is a few pass-through ops away from its tensor at most
        if name in constants:
            return constants[name], 0
        node = producers.get(name)
        if node is None:
            return None
        if node.op_type == "DequantizeLinear":
            codes = constants.get(node.input[0])
            if codes is None:
                return None
            zero_point = constants.get(node.input[2], 0) if len(node.input) > 2 and node.input[2] else 0
            return codes, _along(zero_point, codes.ndim, _attribute(node, "axis", 1))
        if node.op_type not in PASS_THROUGH:
            return None
        name = node.input[0]
    return None


def onnx_parameters(path: str) -> dict:
    """`total`: every stored element (weights, biases, scales, zero points); `weights`: the elements of the
    layers' weight tensors; `nonzero_weights`: those not zero, which for an integer model means the codes
    that differ from their zero point (a code equal to it dequantises to 0). Pruning and sparsity show in
    `nonzero_weights`; quantisation does not change it beyond the weights that round to zero."""
    model = onnx.load(path, load_external_data=False)
    constants, total = {}, 0
    for tensor in _weight_tensors(model.graph):
        constants[tensor.name] = onnx.numpy_helper.to_array(tensor)
        total += constants[tensor.name].size
    for node in model.graph.node:  # Constant nodes' tensors are named by the node's output
        if node.op_type == "Constant" and node.output:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                constants[node.output[0]] = onnx.numpy_helper.to_array(value)
    producers = {out: node for node in model.graph.node for out in node.output}
    weights = nonzero = 0
    for node in model.graph.node:
        slot = WEIGHT_INPUT.get(node.op_type)
        if slot is None or len(node.input) <= slot:
            continue
        found = _stored_weight(node.input[slot], producers, constants)
        if found is None and node.op_type == "MatMul":  # x @ W or W @ x
            found = _stored_weight(node.input[0], producers, constants)
        if found is None:
            continue
        codes, zero_point = found
        padded = _padded_input_channels(node, producers, constants)
        if padded:  # the deploy graph's zero channels for the int8 kernels are not the model's weights
            codes = codes[:, : codes.shape[1] - padded]
        zp_slot = slot + ZERO_POINT_AFTER.get(node.op_type, len(node.input))
        if zp_slot < len(node.input) and node.input[zp_slot] in constants:
            zero_point = _along(constants[node.input[zp_slot]], codes.ndim, ZERO_POINT_AXIS[node.op_type])
        weights += codes.size
        nonzero += int(np.count_nonzero(codes != zero_point))
    return {"total": int(total), "weights": int(weights), "nonzero_weights": int(nonzero)}


def _padded_input_channels(conv: onnx.NodeProto, producers: dict, constants: dict) -> int:
    """How many zero input channels the deploy export appended to a conv's input and weight (Pad ->
    DequantizeLinear -> Conv, amct_engine/export/conv_layout.py `pad_input_channels`); 0 for any other layer."""
    if conv.op_type != "Conv":
        return 0
    dequantize = producers.get(conv.input[0])
    pad = (
        producers.get(dequantize.input[0])
        if dequantize is not None and dequantize.op_type == "DequantizeLinear"
        else None
    )
    if pad is None or pad.op_type != "Pad" or len(pad.input) < 2 or pad.input[1] not in constants:
        return 0
    pads = np.asarray(constants[pad.input[1]]).reshape(-1)
    rank = pads.size // 2
    return int(pads[rank + 1]) if rank > 1 and not pads[: rank + 1].any() and not pads[rank + 2 :].any() else 0


def _agreement(reference: np.ndarray, other: np.ndarray) -> dict:
    """How close `other` is to `reference`, per sample: cosine, MSE, largest difference; for a
    `[batch, n]` output (class logits, bins) also how often the arg-max agrees."""
    ref = reference.reshape(len(reference), -1).astype(np.float64)
    oth = other.reshape(len(other), -1).astype(np.float64)
    cos = (ref * oth).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(oth, axis=1) + 1e-12)
    diff = ref - oth
    out = {
        "mean_abs_diff": float(np.abs(diff).mean()),
        "mean_cosine": float(cos.mean()),
        "min_cosine": float(cos.min()),
        "mse": float((diff**2).mean()),
        "max_abs_diff": float(np.abs(diff).max()),
    }
    if reference.ndim == 2 and ref.shape[1] > 1:
        out["top1_agreement"] = float((ref.argmax(1) == oth.argmax(1)).mean())
    return out


def _is_classifier(shape: list, has_labels: bool, first: bool) -> bool:
    """Class logits: `[batch, classes]`, the first output, and labels to score it (else: a tensor)."""
    return len(shape) == 2 and shape[1] > 1 and first and has_labels


def build_report(
    kind: str,
    original_parameters: int,
    onnx_files: dict[str, str],
    eval_x,
    eval_y,
    split: str,
    batch: int,
    pytorch_accuracy: float | None,
    deploy_format: str = DEFAULT_DEPLOY_FORMAT,
    output_names: list[str] | None = None,
    outputs: dict | None = None,
    input_names: list[str] | None = None,
) -> dict:
    """`onnx_files`: `fp32`, `deploy` (in `deploy_format`) and, when the engine wrote one, `fake_quant`.

    `eval_x` is a tensor or a tuple of tensors (one per input). `outputs` (the structure recorded at
    upload) and `output_names` name the per-output rows: `outputs[name]` compares each file with the
    FP32 model on that output (cosine, MSE, max-abs, and top-1 agreement for classifier logits).
    """
    x = tuple(t.numpy() for t in eval_x) if isinstance(eval_x, tuple) else (eval_x.numpy(),)
    formats = {name: deploy_format if name == "deploy" else DEFAULT_DEPLOY_FORMAT for name in onnx_files}
    predictions = {name: predict(path, x, formats[name], input_names=input_names) for name, path in onnx_files.items()}
    names = list(output_names or [f"output_{i}" for i in range(len(predictions["fp32"]))])
    if len(names) != len(predictions["fp32"]):
        names = [f"output_{i}" for i in range(len(predictions["fp32"]))]
    per_output = _per_output(predictions, names, eval_y is not None)
    first = {name: out[0] for name, out in predictions.items()}
    report: dict = {
        "kind": kind,
        "eval": {"split": split, "samples": int(len(x[0]))},
        "parameters": {
            "original": int(original_parameters),
            **{name: onnx_parameters(path) for name, path in onnx_files.items()},
        },
        "onnx_size_bytes": {name: os.path.getsize(path) for name, path in onnx_files.items()},
        # The first output's figures (what a one-output model has; kept for older clients).
        "agreement_with_original": {name: per_output[names[0]][name] for name in first if name != "fp32"},
        "outputs": per_output,
    }
    if eval_y is not None:
        y = eval_y.numpy()
        report["accuracy"] = {name: float((out.argmax(1) == y).mean()) for name, out in first.items()}
        report["accuracy"]["compressed_pytorch"] = pytorch_accuracy
        report["accuracy_drop"] = report["accuracy"]["fp32"] - report["accuracy"]["deploy"]
        report["accuracy_output"] = names[0]
    report["latency_ms"] = _latency(onnx_files, x, batch, formats, input_names)
    report["size_ratio"] = report["onnx_size_bytes"]["deploy"] / report["onnx_size_bytes"]["fp32"]
    report["formats"] = formats
    report["shapes"] = size_report.shapes(onnx_files)
    report["other_sizes"] = size_report.other_sizes(onnx_files, x, formats, input_names, predict, _agreement)
    deployed = deploy_report(onnx_files["deploy"]) if deploy_format == DEFAULT_DEPLOY_FORMAT else {}
    if deployed:  # the CPU `auto` resolved to, and what each layer runs as (a pruned float model has none)
        report["deploy"] = deployed
    if DEPLOY_FORMATS[deploy_format].load().rewritten_for_reference:
        note = f"{deploy_format} layout timed through its onnxruntime reference rewrite"
        report["latency_ms"]["deploy"]["note"] = note
    return report


def _per_output(predictions: dict, names: list[str], has_labels: bool) -> dict:
    """Each output's row: its shape, whether it is the classifier's logits, every file against the FP32 one."""
    rows = {}
    for k, name in enumerate(names):
        classifier = _is_classifier(list(predictions["fp32"][k].shape), has_labels, k == 0)
        rows[name] = {
            "shape": list(predictions["fp32"][k].shape[1:]),
            "kind": "classifier_logits" if classifier else "tensor",
            **{f: _agreement(predictions["fp32"][k], out[k]) for f, out in predictions.items() if f != "fp32"},
        }
    return rows


OTHER_LATENCY_BATCH = 8  # timed too, where the files take it: int8 kernels that lose at batch 1 may win there
# A token sequence (an integer input's dynamic axis) is timed at this length too where the dataset's differs:
# attention's cost grows with the square of the length, so a speed-up at 32 tokens says little about 128.
SEQUENCE_LENGTH = 128


def _latency(onnx_files: dict, x: tuple, batch: int, formats: dict, input_names) -> dict:
    """The FP32 and deploy files' onnxruntime latency on one batch of the held-out rows, timed side by side
    (latency_ms), and the speed-up: the ratio of medians; `other_batches` the same at OTHER_LATENCY_BATCH; for a
    model that takes token sequences, `lengths` (the dataset's) and `other_lengths` (the same at SEQUENCE_LENGTH)."""
    timed = {name: onnx_files[name] for name in ("fp32", "deploy")}
    timed_formats = {name: formats[name] for name in timed}
    load_before = os.getloadavg()
    latency: dict = latency_ms(timed, _rows(x, batch), timed_formats, input_names)
    latency["speedup"] = latency["fp32"]["median"] / latency["deploy"]["median"]
    latency["other_batches"] = []
    if batch != OTHER_LATENCY_BATCH:
        try:
            other = latency_ms(timed, _rows(x, OTHER_LATENCY_BATCH), timed_formats, input_names)
        except Exception:  # a file whose batch is fixed (its size checks say so): nothing to compare there
            other = None
        if other is not None:
            speedup = other["fp32"]["median"] / other["deploy"]["median"]
            latency["other_batches"].append({"batch": OTHER_LATENCY_BATCH, **other, "speedup": speedup})
    tokens = size_report.token_axes(onnx_files["fp32"], x, input_names)
    if tokens:  # the dataset's length of each token axis: the length the figures above are at
        latency["lengths"] = {group.name: group.size for group in tokens}
    latency["other_lengths"] = _other_lengths(timed, tokens, x, batch, timed_formats, input_names)
    latency["timing"] = "interleaved: FP32 and deploy runs alternate, one thread"
    latency["threads"] = 1
    # The machine's 1/5/15-minute load averages before and after: a loaded machine moves medians, not ratios.
    latency["load_avg"] = {"before": list(load_before), "after": list(os.getloadavg())}
    return latency


def _other_lengths(timed: dict, tokens: list, x: tuple, batch: int, formats: dict, input_names) -> list[dict]:
    """The FP32 and deploy files timed at SEQUENCE_LENGTH tokens (the held-out rows cut or cycled along the
    sequence axis), at the report's batch and at OTHER_LATENCY_BATCH, for each token axis whose dataset length
    differs; a file that does not take that length (a model's position table is shorter) has no row."""
    rows = []
    for group in tokens:
        if group.size == SEQUENCE_LENGTH:
            continue
        for rows_per_batch in dict.fromkeys((batch, OTHER_LATENCY_BATCH)):
            inputs = size_report.at_size(_rows(x, rows_per_batch), group, SEQUENCE_LENGTH)
            try:
                figures = latency_ms(timed, inputs, formats, input_names)
            except Exception:  # the model does not run at this length (its upload check found the sizes it takes)
                break
            speedup = figures["fp32"]["median"] / figures["deploy"]["median"]
            rows.append(
                {
                    "axis": group.name,
                    "size": SEQUENCE_LENGTH,
                    "dataset_size": group.size,
                    "batch": rows_per_batch,
                    **figures,
                    "speedup": speedup,
                }
            )
    return rows
