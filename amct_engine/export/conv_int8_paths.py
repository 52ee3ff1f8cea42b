"""Which int8 conv kernel onnxruntime runs a conv on: MLAS's symmetric conv, or its QGEMM (AMX) path.

Rewrites of the QDQ deploy graph for one deploy target each (export/deploy_target.py `DeployTarget.rewrites`),
exact (the same integer sums), chosen by measurement on onnxruntime 1.32's CPU kernels:

- `pad_input_channels`: a conv whose input channels are not a multiple of 4 (an image's 1 or 3) gets zero
  weight rows for the missing channels and its input codes a zero-filled channel `Pad`. MLAS's symmetric
  int8 conv (indirect, requantisation fused; the x86 path for int8 weights with zero point 0) needs
  input channels % 4 == 0; other convs take the generic im2col + GEMM + requantise path. Measured on
  isolated convs: 0.62-0.67x the time for 3x3 kernels on 1-3 channels; larger kernels stay as they are
  (ResNet's 7x7 stem ran 1.3x slower padded, `_padding_pays`). Zero weights add nothing to the sums, so
  the output is the same. Only where the weights are int8 with zero point 0 (deploy_target x86_vnni,
  x86_avx2): uint8 weights (x86_avx2_u8u8) never take the symmetric path, and ARM's symmetric conv refuses
  convs under 64 input channels.
- `convs_on_the_gemm_path` (x86_amx): each conv's int8 weight gets its zero point (0) as an initialiser that is
  also a graph input. ORT's QLinearConv takes MLAS's symmetric conv (AVX512-VNNI) only when the weight zero
  point is a *constant* all-zero tensor, and its im2col + QGEMM path otherwise; on a CPU with AMX-INT8 that
  QGEMM runs on AMX tiles. A graph input with an initialiser is overridable, so not constant to the kernel,
  and holds the same zeros: the same sums, outputs bit for bit the same. ORT's QDQ fusion still makes the
  QLinearConv (it checks the activations' quantisers, not the weight's zero point). Only convs big enough
  for AMX to pay (`_gemm_pays`): per node at 2 threads, ResNet-18's 3x3 convs took 0.55-0.93x the time,
  its 1x1 downsamples and 7x7 stem 1.2-1.9x, the 459k Fashion CNN's 3x3 convs (7x7 and 14x14 outputs)
  1.46x, CREPE's 1.06-1.94x. Whole ResNet-18 at 112x112, batch 8: wall 0.262x FP32 against 0.332x on the
  symmetric path, 0.183x against 0.300x in one-thread CPU time; batch 1: 0.227x against 0.250x.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amct_engine.export.conv_layout import GraphShapes, is_dq, node_attr, zero_point_zero

CHANNEL_MULTIPLE = 4  # MLAS's KernelInputChannelAlignment of its x86 symmetric conv kernels


MAX_TAPS = 9  # see _padding_pays


MIN_OUTPUT_CHANNELS = 16  # its FilterOutputChannelPackCount: fewer output channels never take that path


# The convs convs_on_the_gemm_path moves (measured: _gemm_pays): depth per output, filters, MACs per image.
GEMM_MIN_DEPTH, GEMM_MIN_FILTERS, GEMM_MIN_MACS = 576, 64, 8_000_000


def pad_input_channels(model: onnx.ModelProto) -> list[str]:
    """Zero-pad the input channels of int8 convs to a multiple of 4 (module doc). Returns the padded convs.

    The conv must read its input as DequantizeLinear(codes) and its weight as DequantizeLinear(int8 codes)
    with zero point 0, in one group, with at least 16 output channels in multiples of 8 (MLAS's symmetric
    kernels pack 16 and align 4 on AVX512, 8 on AVX2/AVX-VNNI)."""
    shapes = GraphShapes(model)
    padded = []
    for conv in [n for n in model.graph.node if n.op_type == "Conv"]:
        x_dq, w_dq = shapes.producer.get(conv.input[0]), shapes.producer.get(conv.input[1])
        if (
            node_attr(conv, "group", 1) != 1
            or not is_dq(x_dq)
            or not is_dq(w_dq)
            or w_dq.input[0] not in shapes.initializers
            or not zero_point_zero(w_dq, shapes)
        ):
            continue
        codes = numpy_helper.to_array(shapes.initializers[w_dq.input[0]])
        missing = -codes.shape[1] % CHANNEL_MULTIPLE
        if (
            codes.dtype != np.int8
            or not missing
            or codes.shape[0] < MIN_OUTPUT_CHANNELS
            or codes.shape[0] % 8
            or len(shapes.readers[w_dq.input[0]]) != 1
            or not _padding_pays(codes.shape)
        ):
            continue
        zeros = np.zeros((codes.shape[0], missing, *codes.shape[2:]), np.int8)
        shapes.initializers[w_dq.input[0]].CopyFrom(
            numpy_helper.from_array(np.concatenate([codes, zeros], axis=1), w_dq.input[0])
        )
        _pad_codes(model, conv, x_dq, missing, codes.ndim)
        padded.append(conv.name)
    return padded


def _padding_pays(weight_shape: tuple[int, ...]) -> bool:
    """Measured (one thread): padding 1 input channel to 4 won at 3x3 (0.67x the time, isolated convs),
    broke even at 5x5 (0.97x) and lost at 1x512 (2.4x: four times the multiplies); 2 or 3 channels won at
    3x3 (0.62x). ResNet-18's 7x7 stem on 3 channels measured 0.9x alone but 1.30x inside the network
    (2.79 against 2.14 ms at batch 8, 112x112; level at batch 1): kernels over 3x3 are left as they are."""
    return int(np.prod(weight_shape[2:])) <= MAX_TAPS


def _pad_codes(model: onnx.ModelProto, conv: onnx.NodeProto, x_dq: onnx.NodeProto, missing: int, rank: int) -> None:
    """codes -> Pad(channels, value = zero point) -> a DequantizeLinear of the conv's own -> conv.

    The pad value is irrelevant (its weights are 0); the zero point keeps the padded channels at 0.0."""
    stem = conv.name.split("/")[0] or conv.output[0]  # `<layer>/Conv` -> `<layer>`
    pads = np.zeros(2 * rank, np.int64)
    pads[rank + 1] = missing
    model.graph.initializer.append(numpy_helper.from_array(pads, f"{stem}.channel_pads"))
    codes = x_dq.input[0]
    zero = x_dq.input[2] if len(x_dq.input) > 2 else ""
    pad = helper.make_node(
        "Pad", [codes, f"{stem}.channel_pads", zero], [f"{stem}_padded_codes"], name=f"{stem}/PadChannels"
    )
    dq = helper.make_node(
        "DequantizeLinear",
        [f"{stem}_padded_codes", *x_dq.input[1:]],
        [f"{stem}_padded_input"],
        name=f"{stem}/DequantizeLinear_padded",
    )
    conv.input[0] = dq.output[0]
    graph = model.graph
    index = list(graph.node).index(conv)
    graph.node.insert(index, dq)
    graph.node.insert(index, pad)
    if not any(x_dq.output[0] in n.input for n in graph.node) and x_dq.output[0] not in {o.name for o in graph.output}:
        graph.node.remove(x_dq)


def convs_on_the_gemm_path(model: onnx.ModelProto) -> list[str]:
    """Give each one-group int8 conv's weight an overridable zero-point initialiser of zeros (module doc), so
    that onnxruntime runs it on its QGEMM path (AMX tiles where the CPU has them). Returns those convs."""
    shapes = GraphShapes(model)
    inputs = {v.name for v in model.graph.input}
    moved = []
    for conv in [n for n in model.graph.node if n.op_type == "Conv"]:
        x_dq, w_dq = shapes.producer.get(conv.input[0]), shapes.producer.get(conv.input[1])
        weight = shapes.initializers.get(w_dq.input[0]) if is_dq(w_dq) else None
        if (
            node_attr(conv, "group", 1) != 1
            or not is_dq(x_dq)
            or weight is None
            or weight.data_type != TensorProto.INT8
            or not zero_point_zero(w_dq, shapes)
            or not _gemm_pays(tuple(weight.dims), shapes.dims.get(conv.output[0]))
        ):
            continue
        name = w_dq.input[2] if len(w_dq.input) > 2 and w_dq.input[2] else f"{w_dq.input[0]}_zero_point"
        if name not in shapes.initializers:
            scale = numpy_helper.to_array(shapes.initializers[w_dq.input[1]])
            shapes.initializers[name] = numpy_helper.from_array(np.zeros(scale.shape, np.int8), name)
            model.graph.initializer.append(shapes.initializers[name])
            w_dq.input.extend([""] * (3 - len(w_dq.input)))
            w_dq.input[2] = name
        if name not in inputs:
            dims = list(shapes.initializers[name].dims)
            model.graph.input.append(helper.make_tensor_value_info(name, TensorProto.INT8, dims))
            inputs.add(name)
        moved.append(conv.name)
    return moved


def _gemm_pays(weight_shape: tuple[int, ...], output_dims: list[int | None] | None) -> bool:
    """Whether AMX's QGEMM beats the symmetric conv on this conv (module doc): a deep (Cin x taps >= 576), wide
    (>= 64 filters) conv with >= 8M multiply-adds per image. Below that the QGEMM path's per-image set-up
    outweighs the tiles (the 459k Fashion CNN's 64x64 3x3 conv on 7x7 outputs, 1.8M: 1.48x the time;
    ResNet-18's on 28x28, 29M: 0.82-0.92x; its 512x512 3x3 on 4x4, 19M: 0.88-0.93x). Unknown output sizes
    (a dynamic image size) keep the symmetric path."""
    filters, depth = weight_shape[0], int(np.prod(weight_shape[1:]))
    spatial = output_dims[2:] if output_dims else [None]
    if depth < GEMM_MIN_DEPTH or filters < GEMM_MIN_FILTERS or not spatial or None in spatial:
        return False
    return int(np.prod(spatial)) * filters * depth >= GEMM_MIN_MACS
