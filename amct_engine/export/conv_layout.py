"""Conv shapes onnxruntime's int8 kernels run fast: same integers, another layout (deploy graph only).

Rewrites of the QDQ deploy graph, each exact (the same integer sums, so the same outputs bit for bit),
chosen by measurement on onnxruntime 1.32's CPU kernels (figures in
docs/benchmarks.md#deploy-speed-our-int8-onnx-vs-fp32-and-onnxruntimes-own-ptq):

- `tall_kernels_as_wide`: a region of [N, C, H, 1] tensors whose convs have (k x 1) kernels (CREPE: 512x1,
  64x1) runs as [N, C, 1, H] with (1 x k) kernels. onnxruntime's NHWC im2col copies one kernel row per
  `memcpy`: a (k x 1) kernel is k copies of C bytes, a (1 x k) kernel one copy of k*C bytes. CREPE's first
  conv (1 -> 128 channels, 512x1, stride 4) took 28 ms per batch of 64 in QLinearConv and 5.7 ms as 1x512
  (one thread, minimum CPU time); Conv1D measured the same as 1 x k. Swapping H and W of a tensor whose W
  is 1 is a Reshape (no data moves); one goes in where the region starts and one where it ends.
- `pad_input_channels`: a conv whose input channels are not a multiple of 4 (an image's 1 or 3) gets zero
  weight rows for the missing channels and its input codes a zero-filled channel `Pad`. MLAS's symmetric
  int8 conv (indirect, requantisation fused; the x86 path for int8 weights with zero point 0) needs
  input channels % 4 == 0; other convs take the generic im2col + GEMM + requantise path. Measured on
  isolated convs: 0.62-0.67x the time for 3x3 kernels on 1-3 channels; larger kernels stay as they are
  (ResNet's 7x7 stem ran 1.3x slower padded, `_padding_pays`). Zero weights add nothing to the sums, so
  the output is the same. Only where the weights are int8 with zero point 0 (deploy_target x86_vnni):
  uint8 weights (x86_avx2) never take the symmetric path, and ARM's symmetric conv refuses convs under 64
  input channels.
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
- `float_stems` (x86_vnni and x86_amx, before the padding): a conv on one input channel with a 2-D kernel up to 3x3 (a
  greyscale image's stem) has too little depth per output for the int8 GEMM: QLinearConv took 702 µs per
  batch of 64 on the 20k-parameter Fashion-MNIST CNN's 28x28 stem, padded or not, where onnxruntime's
  float NCHWc conv took 157 µs (one thread, minimum). Such a conv runs float on its integer codes (input
  codes less the zero point, weight codes, int32 bias), with the rescale by input x weight scale moved
  after the ReLU and max-pool: the same integer sums and the same single multiply as the eval model, so
  the codes the next layer reads are bit for bit the same (the whole model: 598 against 1,012 µs, FP32
  532 µs). Only where every partial sum is an integer float32 holds exactly (below 2^24). ResNet-18's
  7x7 stem on 3 channels ran slower so (whole model at batch 8: 21.9 against 18.7 ms CPU time; level
  at batch 1): stems stay one channel and 3x3 at most.
"""

from __future__ import annotations

import functools
from collections import defaultdict

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Ops that act per position and per channel on [N, C, H, W] (or only along H and W through their
# attributes, swapped below): a region of them may run with H and W exchanged.
_ELEMENTWISE = {
    "QuantizeLinear",
    "DequantizeLinear",
    "Relu",
    "Clip",
    "Sigmoid",
    "LeakyRelu",
    "Identity",
    "BatchNormalization",
}
_SPATIAL = {"Conv", "MaxPool", "AveragePool"}
_SPATIAL_ATTRS = ("kernel_shape", "strides", "dilations")
CHANNEL_MULTIPLE = 4  # MLAS's KernelInputChannelAlignment of its x86 symmetric conv kernels
MAX_TAPS = 9  # see _padding_pays
MIN_OUTPUT_CHANNELS = 16  # its FilterOutputChannelPackCount: fewer output channels never take that path
STEM_MAX_CHANNELS, STEM_MAX_TAPS = 1, 9  # the image stems float_stems runs float (measured: its doc)
# The convs convs_on_the_gemm_path moves (measured: _gemm_pays): depth per output, filters, MACs per image.
GEMM_MIN_DEPTH, GEMM_MIN_FILTERS, GEMM_MIN_MACS = 576, 64, 8_000_000


class _Shapes:
    """Static shapes (None where unknown), constants and producers/readers of a model."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        graph = model.graph
        self.initializers = {t.name: t for t in graph.initializer}
        self.constant = set(self.initializers)
        for node in graph.node:  # topological order: a node of constants only makes constants
            if all(not i or i in self.constant for i in node.input):
                self.constant.update(node.output)
        self.producer = {o: n for n in graph.node for o in n.output}
        self.readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                self.readers[name].append(node)

    @functools.cached_property
    def dims(self) -> dict[str, list[int | None]]:
        """Shape inference runs only for the rewrites that read shapes (the wide kernels, and the AMX convs once a
        candidate is found): the stems and the channel padding read the graph alone, and each rewrite builds its
        own `_Shapes`."""
        inferred = onnx.shape_inference.infer_shapes(self.model)
        return {
            v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
            for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
            if v.type.tensor_type.HasField("shape")
        }

    def width_one(self, name: str) -> bool:
        dims = self.dims.get(name)
        return dims is not None and len(dims) == 4 and dims[3] == 1


def _attr(node: onnx.NodeProto, name: str, default=None):
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


def _set_attr(node: onnx.NodeProto, name: str, value) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])


def _activations(node: onnx.NodeProto, shapes: _Shapes) -> list[str]:
    """The data tensors a node reads and writes: every op above reads its data as input 0 (the others are
    weights, biases, scales, zero points, clip bounds)."""
    return [n for n in (*node.input[:1], *node.output) if n and n not in shapes.constant]


def _flippable(node: onnx.NodeProto, shapes: _Shapes) -> bool:
    if node.op_type not in _ELEMENTWISE | _SPATIAL:
        return False
    if node.op_type in ("QuantizeLinear", "DequantizeLinear") and _attr(node, "axis", 1) not in (1, -3):
        return False
    if node.op_type in _SPATIAL and (_attr(node, "kernel_shape") or [0, 0])[-1] != 1:
        return False
    if _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return False
    data = _activations(node, shapes)
    return bool(data) and all(shapes.width_one(n) for n in data)


def _regions(model: onnx.ModelProto, shapes: _Shapes) -> list[list[onnx.NodeProto]]:
    """Connected groups of flippable nodes (joined by the activations they share), in graph order."""
    nodes = [n for n in model.graph.node if _flippable(n, shapes)]
    parent = list(range(len(nodes)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in _activations(node, shapes):
            if name in owner:
                parent[root(i)] = root(owner[name])
            owner.setdefault(name, i)
    groups: dict[int, list[onnx.NodeProto]] = defaultdict(list)
    for i, node in enumerate(nodes):
        groups[root(i)].append(node)
    return list(groups.values())


def _swap_hw(values: list[int]) -> list[int]:
    if len(values) == 4:  # pads: [h_begin, w_begin, h_end, w_end]
        return [values[1], values[0], values[3], values[2]]
    return [values[1], values[0]]


def _flip_node(node: onnx.NodeProto, shapes: _Shapes, flipped_weights: set[str]) -> None:
    for name in (*_SPATIAL_ATTRS, "pads"):
        values = _attr(node, name)
        if values is not None:
            _set_attr(node, name, _swap_hw(list(values)))
    if node.op_type != "Conv":
        return
    weight = node.input[1]
    dq = shapes.producer.get(weight)
    tensor = dq.input[0] if dq is not None and dq.op_type == "DequantizeLinear" else weight
    if tensor in flipped_weights or tensor not in shapes.initializers:
        return
    codes = numpy_helper.to_array(shapes.initializers[tensor])
    shapes.initializers[tensor].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(codes.swapaxes(2, 3)), tensor))
    flipped_weights.add(tensor)


def _reshape(model: onnx.ModelProto, source: str, target: str, shape: list[int], name: str) -> onnx.NodeProto:
    shape_name = f"{name}_shape"
    if shape_name not in {t.name for t in model.graph.initializer}:
        model.graph.initializer.append(numpy_helper.from_array(np.array(shape, np.int64), shape_name))
    return helper.make_node("Reshape", [source, shape_name], [target], name=name)


def tall_kernels_as_wide(model: onnx.ModelProto) -> list[str]:
    """Run each region of (k x 1) convs on [N, C, H, 1] tensors as (1 x k) convs on [N, C, 1, H] (module
    doc). Returns the names of the convs whose kernels were turned; the graph changes in place."""
    shapes = _Shapes(model)
    outputs = {o.name for o in model.graph.output}
    turned, flipped_weights = [], set()
    before: dict[int, list[onnx.NodeProto]] = defaultdict(list)  # id(node) -> Reshapes to insert before it
    after: dict[int, list[onnx.NodeProto]] = defaultdict(list)
    regions = _regions(model, shapes)  # held until the end: `before`/`after` are keyed by id(node)
    for region in regions:
        convs = [n for n in region if n.op_type == "Conv" and (_attr(n, "kernel_shape") or [1])[0] > 1]
        if not convs:
            continue
        members = {id(n) for n in region}
        produced = {o for n in region for o in n.output}
        renamed: dict[str, str] = {}
        for node in region:
            data = set(_activations(node, shapes))
            for i, name in enumerate(node.input):
                if name in data and name not in produced:  # enters the region: [N, C, H, 1] -> [N, C, 1, H]
                    if name not in renamed:
                        renamed[name] = f"{name}_wide"
                        before[id(node)].append(
                            _reshape(model, name, renamed[name], [0, 0, 1, -1], f"{renamed[name]}/Reshape")
                        )
                    node.input[i] = renamed[name]
        for node in region:
            for i, name in enumerate(node.output):
                leaves = name in outputs or any(id(r) not in members for r in shapes.readers[name])
                if not leaves:
                    continue
                wide = f"{name}_wide"
                node.output[i] = wide
                for reader in (r for r in shapes.readers[name] if id(r) in members):
                    reader.input[:] = [wide if n == name else n for n in reader.input]
                after[id(node)].append(_reshape(model, wide, name, [0, 0, -1, 1], f"{name}/Reshape"))
            _flip_node(node, shapes, flipped_weights)
        turned += [n.name for n in convs]
    if turned:
        _insert_around(model, before, after)
    return turned


def _insert_around(model: onnx.ModelProto, before: dict, after: dict) -> None:
    ordered = []
    for node in model.graph.node:
        ordered += [*before.get(id(node), []), node, *after.get(id(node), [])]
    del model.graph.node[:]
    model.graph.node.extend(ordered)


def pad_input_channels(model: onnx.ModelProto) -> list[str]:
    """Zero-pad the input channels of int8 convs to a multiple of 4 (module doc). Returns the padded convs.

    The conv must read its input as DequantizeLinear(codes) and its weight as DequantizeLinear(int8 codes)
    with zero point 0, in one group, with at least 16 output channels in multiples of 8 (MLAS's symmetric
    kernels pack 16 and align 4 on AVX512, 8 on AVX2/AVX-VNNI)."""
    shapes = _Shapes(model)
    padded = []
    for conv in [n for n in model.graph.node if n.op_type == "Conv"]:
        x_dq, w_dq = shapes.producer.get(conv.input[0]), shapes.producer.get(conv.input[1])
        if (
            _attr(conv, "group", 1) != 1
            or not _is_dq(x_dq)
            or not _is_dq(w_dq)
            or w_dq.input[0] not in shapes.initializers
            or not _zero_point_zero(w_dq, shapes)
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


def float_stems(model: onnx.ModelProto) -> list[str]:
    """Run each int8 conv on one input channel (a greyscale image's stem, 2-D kernels up to 3x3) as a float
    conv on integer-valued operands (module doc). Returns the rewritten convs; the graph changes in place.

    `DQ(x) -> Conv(DQ(w), DQ(b)) -> Relu -> Q -> DQ -> MaxPool -> Q` becomes
    `DQ(x, scale 1) -> Conv(float(w), float(b)) -> Relu -> MaxPool -> Mul(bias scale) -> Q` (zero-point-0 int8
    weights, as x86_vnni writes them): the conv sums the same
    integers (exact in float32 below 2^24), the one multiply by the bias scale (input scale x weight scale)
    is the eval model's rescale, and ReLU and max-pool commute with a positive per-channel scale and with the
    quantiser dropped before the pool (both monotonic), so the codes are the PyTorch eval model's.
    """
    shapes = _Shapes(model)
    rewritten = []
    for conv in [n for n in model.graph.node if n.op_type == "Conv"]:
        plan = _stem_plan(conv, shapes)
        if plan is not None:
            _rewrite_stem(model, conv, shapes, *plan)
            rewritten.append(conv.name)
    return rewritten


def _stem_plan(conv: onnx.NodeProto, shapes: _Shapes):
    """(input DQ, weight DQ, bias DQ, the ReLU, the quantiser after it, the max-pool or None), or None."""
    x_dq, w_dq = shapes.producer.get(conv.input[0]), shapes.producer.get(conv.input[1])
    b_dq = shapes.producer.get(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    if (
        _attr(conv, "group", 1) != 1
        or not _is_dq(x_dq)
        or not _is_dq(w_dq)
        or not _is_dq(b_dq)
        or any(n.input[0] not in shapes.initializers for n in (w_dq, b_dq))
        or not (_zero_point_zero(w_dq, shapes) and _zero_point_zero(b_dq, shapes))
    ):
        return None
    codes = numpy_helper.to_array(shapes.initializers[w_dq.input[0]])
    if (
        codes.ndim != 4
        or codes.shape[1] > STEM_MAX_CHANNELS
        or min(codes.shape[2:]) < 2
        or int(np.prod(codes.shape[2:])) > STEM_MAX_TAPS
    ):
        return None  # measured on image stems only: 1-D kernels stay int8
    if not _sums_exact_in_float(x_dq, codes, numpy_helper.to_array(shapes.initializers[b_dq.input[0]]), shapes):
        return None
    relu = _only_reader(conv.output[0], shapes, "Relu")
    quant = _only_reader(relu.output[0], shapes, "QuantizeLinear") if relu is not None else None
    if quant is None or any(len(shapes.readers[name]) != 1 for name in (w_dq.input[0], *b_dq.input[:2])):
        return None
    dq = _only_reader(quant.output[0], shapes, "DequantizeLinear")
    pool = _only_reader(dq.output[0], shapes, "MaxPool") if dq is not None else None
    requant = _only_reader(pool.output[0], shapes, "QuantizeLinear") if pool is not None else None
    if requant is None or list(requant.input[1:]) != list(quant.input[1:]):
        pool = None  # no max-pool between two identical quantisers: the rescale goes right after the ReLU
    return x_dq, w_dq, b_dq, relu, quant, pool


def _sums_exact_in_float(x_dq: onnx.NodeProto, codes: np.ndarray, bias: np.ndarray, shapes: _Shapes) -> bool:
    """Every partial sum of the float conv is an integer below 2^24, so float32 holds it exactly (in any
    order): the bound of |input code - zero point| times the weights' absolute row sums, plus |bias|."""
    zero = shapes.initializers.get(x_dq.input[2]) if len(x_dq.input) > 2 and x_dq.input[2] else None
    zero_point = int(numpy_helper.to_array(zero)) if zero is not None else 0
    code_range = (-128, 127) if zero is not None and zero.data_type == TensorProto.INT8 else (0, 255)
    largest_input = max(abs(code_range[0] - zero_point), abs(code_range[1] - zero_point))
    row_sums = np.abs(codes.astype(np.int64)).reshape(codes.shape[0], -1).sum(axis=1)
    return int((largest_input * row_sums + np.abs(bias.astype(np.int64))).max()) < 2**24


def _only_reader(tensor: str, shapes: _Shapes, op_type: str) -> onnx.NodeProto | None:
    readers = shapes.readers[tensor]
    return readers[0] if len(readers) == 1 and readers[0].op_type == op_type else None


def _rewrite_stem(model: onnx.ModelProto, conv, shapes: _Shapes, x_dq, w_dq, b_dq, relu, quant, pool) -> None:
    """The file keeps the int8 weight, the int32 bias and the bias scale (reshaped to [1, C, 1, 1]): the same
    bytes; Casts of those constants, which onnxruntime folds when it loads the model, make the float operands."""
    stem = conv.name.split("/")[0] or conv.output[0]
    graph = model.graph
    model.graph.initializer.append(numpy_helper.from_array(np.ones((), np.float32), f"{stem}.unit_scale"))
    rescale_scale = shapes.initializers[b_dq.input[1]]  # read by the bias's DequantizeLinear only (_stem_plan)
    if len(rescale_scale.dims) == 1:  # per output channel: [1, C, 1, 1] broadcasts over the activations
        rescale_scale.dims[:] = [1, rescale_scale.dims[0], 1, 1]
    before_conv = [
        helper.make_node(
            "DequantizeLinear",
            [x_dq.input[0], f"{stem}.unit_scale", *x_dq.input[2:]],
            [f"{stem}_input_codes"],
            name=f"{stem}/DequantizeLinear_codes",
        ),
        helper.make_node(
            "Cast", [w_dq.input[0]], [f"{stem}_weight_codes"], name=f"{stem}/CastWeight", to=TensorProto.FLOAT
        ),
        helper.make_node(
            "Cast", [b_dq.input[0]], [f"{stem}_bias_codes"], name=f"{stem}/CastBias", to=TensorProto.FLOAT
        ),
    ]
    conv.input[:] = [n.output[0] for n in before_conv[:3]]
    last = pool if pool is not None else relu
    rescale = helper.make_node("Mul", [last.output[0], b_dq.input[1]], [f"{stem}_rescaled"], name=f"{stem}/Rescale")
    dead = {id(w_dq), id(b_dq)}
    if pool is not None:  # Relu -> MaxPool directly; the quantiser after the pool reads the rescaled values
        pool.input[0] = relu.output[0]
        shapes.readers[pool.output[0]][0].input[0] = rescale.output[0]
        dead |= {id(quant), id(shapes.readers[quant.output[0]][0])}
    else:
        quant.input[0] = rescale.output[0]
    nodes = []
    for node in graph.node:
        if id(node) not in dead:
            nodes += [*(before_conv if node is conv else []), node, *([rescale] if node is last else [])]
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in graph.node for i in n.input}
    orphaned = set(w_dq.input[1:]) - used  # the weight scale: the bias scale is the whole rescale
    kept = [t for t in graph.initializer if t.name not in orphaned]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(x_dq.output[0] in n.input for n in graph.node):
        graph.node.remove(x_dq)


def convs_on_the_gemm_path(model: onnx.ModelProto) -> list[str]:
    """Give each one-group int8 conv's weight an overridable zero-point initialiser of zeros (module doc), so
    that onnxruntime runs it on its QGEMM path (AMX tiles where the CPU has them). Returns those convs."""
    shapes = _Shapes(model)
    inputs = {v.name for v in model.graph.input}
    moved = []
    for conv in [n for n in model.graph.node if n.op_type == "Conv"]:
        x_dq, w_dq = shapes.producer.get(conv.input[0]), shapes.producer.get(conv.input[1])
        weight = shapes.initializers.get(w_dq.input[0]) if _is_dq(w_dq) else None
        if (
            _attr(conv, "group", 1) != 1
            or not _is_dq(x_dq)
            or weight is None
            or weight.data_type != TensorProto.INT8
            or not _zero_point_zero(w_dq, shapes)
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


def _is_dq(node: onnx.NodeProto | None) -> bool:
    return node is not None and node.op_type == "DequantizeLinear"


def _zero_point_zero(dq: onnx.NodeProto, shapes: _Shapes) -> bool:
    if len(dq.input) < 3 or not dq.input[2]:
        return True
    zero = shapes.initializers.get(dq.input[2])
    return zero is not None and not numpy_helper.to_array(zero).any()


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
