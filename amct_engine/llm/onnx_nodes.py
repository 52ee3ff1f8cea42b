"""The ONNX nodes a converted Linear becomes (docs/spec/llm.md §6.2–6.3). Pure onnx + numpy.

MatMulNBits (com.microsoft) computes ``A @ dequant(B)`` with ``B`` (K, N) stored per output column ``n`` in
blocks of ``block_size`` along K: ``B`` packed uint8 (N, blocks, block_size * bits / 8), codes in order,
two 4-bit codes a byte with the first in the low nibble; ``scales`` (N, blocks); ``zero_points`` uint8
(N, ceil(blocks * bits / 8)), packed the same way, or absent for the default ``2**(bits-1)``
(onnxruntime/quantization/matmul_nbits_quantizer.py writes the same layout); float zero points are float32
(N * blocks), as ORT's HQQ quantiser writes them. Our codes are already unsigned with that zero point for
symmetric weights, so they are copied, never re-rounded.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

MS_DOMAIN = "com.microsoft"
CHANNEL_BLOCK = 128  # the file's block for one-group-per-row weights (MatMulNBits needs a power of two >= 16)


def file_block_size(group_size: int, in_features: int) -> int:
    """The MatMulNBits block for our groups: the group itself when MatMulNBits accepts it, else (a whole
    row, 'channel'/'tensor') 128 columns or the row's power-of-two ceiling, with the row's scale repeated."""
    if group_size & (group_size - 1) == 0 and group_size >= 16:
        return group_size
    return min(CHANNEL_BLOCK, max(16, 1 << (in_features - 1).bit_length()))


def _per_block(values: np.ndarray, group_size: int, block: int, blocks: int) -> np.ndarray:
    """(N, groups) -> (N, blocks): each file block takes the value of the group it lies in."""
    index = np.minimum(np.arange(blocks) * block // group_size, values.shape[1] - 1)
    return values[:, index]


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned codes (..., n) -> bytes (..., n * bits / 8), low nibble first for 4 bits."""
    codes = codes.astype(np.uint8)
    if bits == 8:
        return codes
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros((*codes.shape[:-1], 1), np.uint8)], axis=-1)
    return (codes[..., 0::2] & 0x0F) | ((codes[..., 1::2] & 0x0F) << 4)


def matmulnbits_tensors(
    codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, group_size: int, bits: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """MatMulNBits' B, scales and zero points from codes (N, K) and per-group scales/zero points (N, groups)."""
    n, k = codes.shape
    block = file_block_size(group_size, k)
    blocks = -(-k // block)
    zp_block = _per_block(zero_points, group_size, block, blocks)
    float_zero = np.issubdtype(zp_block.dtype, np.floating)
    zp_codes = np.clip(np.round(zp_block), 0, 2**bits - 1).astype(np.uint8)
    padded = np.repeat(zp_codes, block, axis=1)  # padding columns hold the zero point: they dequantise to ~0
    padded[:, :k] = codes
    packed = _pack(padded.reshape(n, blocks, block), bits)
    stored_zp = zp_block.astype(np.float32).reshape(-1) if float_zero else _pack(zp_codes, bits)
    return packed, _per_block(scales, group_size, block, blocks).astype(np.float32), stored_zp, block


def matmulnbits_node(
    name: str,
    a: str,
    out: str,
    codes,
    scales,
    zero_points,
    group_size: int,
    bits: int,
    symmetric: bool,
    accuracy_level: int,
) -> tuple[list, list]:
    """The node and its initialisers; symmetric weights store no zero points (the default is theirs)."""
    packed, block_scales, packed_zp, block = matmulnbits_tensors(codes, scales, zero_points, group_size, bits)
    n, k = codes.shape
    inits = [
        numpy_helper.from_array(packed, f"{name}.qweight"),
        numpy_helper.from_array(block_scales, f"{name}.scales"),
    ]
    inputs = [a, inits[0].name, inits[1].name]
    if not symmetric:
        inits.append(numpy_helper.from_array(packed_zp, f"{name}.zero_points"))
        inputs.append(inits[-1].name)
    node = helper.make_node(
        "MatMulNBits",
        inputs,
        [out],
        name=f"{name}/MatMulNBits",
        domain=MS_DOMAIN,
        K=k,
        N=n,
        bits=bits,
        block_size=block,
        accuracy_level=accuracy_level,
    )
    return [node], inits


def w8a8_static_nodes(name: str, a: str, out: str, weight_codes, weight_scale, input_scale: float) -> tuple[list, list]:
    """Static int8: QuantizeLinear with the calibrated scale, MatMulInteger with the int8 weight (K, N), then
    both scales (the steps of W8A8Linear.forward). Not QDQ: on x86 ORT turns an int8 QDQ MatMul into a uint8 x int8
    one, whose AVX2 kernel without VNNI (vpmaddubsw) saturates pairs of products at int16 (SmolLM2's logits off
    by 0.2 on a tiny Llama; exact with the session option ``session.x64quantprecision``, which a file cannot set).
    MatMulInteger on int8 x int8 keeps every product exact."""
    inits = [
        numpy_helper.from_array(np.asarray(weight_codes, np.int8).T.copy(), f"{name}.qweight"),
        numpy_helper.from_array(np.asarray(weight_scale, np.float32), f"{name}.weight_scale"),
        numpy_helper.from_array(np.asarray(input_scale, np.float32), f"{name}.input_scale"),
        numpy_helper.from_array(np.asarray(0, np.int8), f"{name}.input_zero"),
    ]
    t = {s: f"{name}.{s}" for s in ("q", "acc", "accf", "y1")}
    nodes = [
        helper.make_node("QuantizeLinear", [a, inits[2].name, inits[3].name], [t["q"]], name=f"{name}/QuantizeInput"),
        helper.make_node("MatMulInteger", [t["q"], inits[0].name], [t["acc"]], name=f"{name}/MatMulInteger"),
        helper.make_node("Cast", [t["acc"]], [t["accf"]], name=f"{name}/Cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", [t["accf"], inits[2].name], [t["y1"]], name=f"{name}/InputScale"),
        helper.make_node("Mul", [t["y1"], inits[1].name], [out], name=f"{name}/WeightScale"),
    ]
    return nodes, inits


def w8a8_qdq_nodes(name: str, a: str, out: str, weight_codes, weight_scale, input_scale: float) -> tuple[list, list]:
    """Static int8 as QDQ: Q/DQ on the input with the static scale, DQ on the int8 weight (K, N) per column, a
    MatMul; ORT fuses the pattern into its uint8 x int8 MatMul when the session loads: exact and fast with VNNI,
    wrong without it (see w8a8_static_nodes)."""
    inits = [
        numpy_helper.from_array(np.asarray(weight_codes, np.int8).T.copy(), f"{name}.qweight"),
        numpy_helper.from_array(np.asarray(weight_scale, np.float32), f"{name}.weight_scale"),
        numpy_helper.from_array(np.asarray(input_scale, np.float32), f"{name}.input_scale"),
        numpy_helper.from_array(np.asarray(0, np.int8), f"{name}.input_zero"),
        numpy_helper.from_array(np.zeros(len(weight_scale), np.int8), f"{name}.weight_zero"),
    ]
    qa, dqa, dqw = f"{name}.qinput", f"{name}.dqinput", f"{name}.dqweight"
    nodes = [
        helper.make_node("QuantizeLinear", [a, inits[2].name, inits[3].name], [qa], name=f"{name}/QuantizeInput"),
        helper.make_node("DequantizeLinear", [qa, inits[2].name, inits[3].name], [dqa], name=f"{name}/DequantizeInput"),
        helper.make_node(
            "DequantizeLinear",
            [inits[0].name, inits[1].name, inits[4].name],
            [dqw],
            name=f"{name}/DequantizeWeight",
            axis=1,
        ),
        helper.make_node("MatMul", [dqa, dqw], [out], name=f"{name}/MatMul"),
    ]
    return nodes, inits


def w8a8_token_nodes(name: str, a: str, out: str, weight_codes, weight_scale) -> tuple[list, list]:
    """Per-token dynamic int8: scale = max|x| / 127 over the last axis, codes = clip(round(x / scale)),
    MatMulInteger with the int8 weight, then both scales (the same steps as W8A8Linear.forward)."""
    inits = [
        numpy_helper.from_array(np.asarray(weight_codes, np.int8).T.copy(), f"{name}.qweight"),
        numpy_helper.from_array(np.asarray(weight_scale, np.float32), f"{name}.weight_scale"),
        numpy_helper.from_array(np.asarray(127.0, np.float32), f"{name}.qmax"),
        numpy_helper.from_array(np.asarray(1e-8, np.float32), f"{name}.eps"),
        numpy_helper.from_array(np.asarray(-128.0, np.float32), f"{name}.lo"),
        numpy_helper.from_array(np.array([-1], np.int64), f"{name}.axis"),
    ]
    t = {s: f"{name}.{s}" for s in ("abs", "amax", "s0", "scale", "div", "round", "clip", "q", "acc", "accf", "y1")}
    nodes = [
        helper.make_node("Abs", [a], [t["abs"]]),
        helper.make_node("ReduceMax", [t["abs"], inits[5].name], [t["amax"]], keepdims=1),
        helper.make_node("Div", [t["amax"], inits[2].name], [t["s0"]]),
        helper.make_node("Max", [t["s0"], inits[3].name], [t["scale"]]),
        helper.make_node("Div", [a, t["scale"]], [t["div"]]),
        helper.make_node("Round", [t["div"]], [t["round"]]),
        helper.make_node("Clip", [t["round"], inits[4].name, inits[2].name], [t["clip"]]),
        helper.make_node("Cast", [t["clip"]], [t["q"]], to=TensorProto.INT8),
        helper.make_node("MatMulInteger", [t["q"], inits[0].name], [t["acc"]]),
        helper.make_node("Cast", [t["acc"]], [t["accf"]], to=TensorProto.FLOAT),
        helper.make_node("Mul", [t["accf"], t["scale"]], [t["y1"]]),
        helper.make_node("Mul", [t["y1"], inits[1].name], [out]),
    ]
    for i, node in enumerate(nodes):
        node.name = f"{name}/token_quant_{i}"
    return nodes, inits
