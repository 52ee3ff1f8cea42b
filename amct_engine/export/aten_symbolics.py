"""ONNX translations (torch.onnx symbolics) for transformer ops the TorchScript-based exporter lacks at our
opset (docs/spec/engine.md §5.3).

export.layer_graph traces at opset 17 with the TorchScript-based exporter (export/backends.py says why).
It has no translation for `aten::rms_norm` (`nn.RMSNorm`, `F.rms_norm`) and refuses
`scaled_dot_product_attention(..., enable_gqa=True)` (grouped-query attention without repeated key/value
heads). Both are written here in standard opset-17 ops, in the pattern onnxruntime's graph optimiser fuses
(RMSNorm into `SimplifiedLayerNormalization`), so the file stays portable and ORT still runs one kernel.

Registered once, process-wide, through torch.onnx's public `register_custom_op_symbolic`: rms_norm had no
translation, and the attention one only adds the grouped-query case before handing over to torch's own.
"""

from __future__ import annotations

import functools

import torch
from torch.onnx import symbolic_helper
from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_opset14

_FLOAT = 1  # onnx.TensorProto.FLOAT


@symbolic_helper.parse_args("v", "is", "v", "f")
def rms_norm(g, x, normalized_shape, weight, eps):
    """x / sqrt(mean(x², last dims) + eps) · weight, as Pow → ReduceMean → Add → Sqrt → Div → Mul.

    ORT (1.32) fuses exactly this chain into SimplifiedLayerNormalization when the mean is over the last
    axis; the opset-23 `RMSNormalization` would need the whole graph at opset 23. eps None is the input
    dtype's machine epsilon, as torch's. A non-float input (fp16) is computed in float32 and cast back, as
    torch does."""
    dtype = x.type().scalarType()
    if eps is None:
        eps = torch.finfo(getattr(torch, {"Half": "float16", "BFloat16": "bfloat16"}.get(dtype, "float32"))).eps
    wide = dtype not in (None, "Float")
    if wide:
        onnx_type = _type_utils.JitScalarType.from_value(x).onnx_type()
        x = g.op("Cast", x, to_i=_FLOAT)
    axes = list(range(-len(normalized_shape), 0))
    square = g.op("Pow", x, g.op("Constant", value_t=torch.tensor(2.0)))
    mean = g.op("ReduceMean", square, axes_i=axes, keepdims_i=1)
    root = g.op("Sqrt", g.op("Add", mean, g.op("Constant", value_t=torch.tensor(eps, dtype=torch.float32))))
    y = g.op("Div", x, root)
    if wide:
        y = g.op("Cast", y, to_i=onnx_type)
    if not symbolic_helper._is_none(weight):
        y = g.op("Mul", y, weight)
    return y


def scaled_dot_product_attention(
    g, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """torch's own translation, after repeating each key/value head for its group of query heads when
    `enable_gqa` is set (what torch computes: query head h reads key/value head h // (Hq / Hkv))."""
    if symbolic_helper._parse_arg(enable_gqa, "b"):
        key, value = (_repeat_heads(g, t, query) for t in (key, value))
    return symbolic_opset14.scaled_dot_product_attention(
        g, query, key, value, attn_mask, dropout_p, is_causal, scale, g.op("Constant", value_t=torch.tensor(False))
    )


def _repeat_heads(g, kv, query):
    """[B, Hkv, S, D] → [B, Hq, S, D], each head repeated Hq / Hkv times in a row (repeat_interleave)."""
    q_heads = symbolic_helper._get_tensor_sizes(query)[-3]
    kv_sizes = symbolic_helper._get_tensor_sizes(kv)
    kv_heads = kv_sizes[-3]
    if q_heads is None or kv_heads is None:
        raise symbolic_helper.errors.SymbolicValueError(
            "grouped-query attention needs static head counts to export", query
        )
    groups = q_heads // kv_heads
    shape = g.op("Shape", kv)

    def dims(start, end):
        return g.op("Slice", shape, _ints(g, [start]), _ints(g, [end]))

    # [B, Hkv, 1, S, D] expanded to [B, Hkv, groups, S, D], then [B, Hq, S, D]
    unsqueezed = g.op("Unsqueeze", kv, _ints(g, [2]))
    wide = g.op("Concat", dims(0, 2), _ints(g, [groups]), dims(2, 4), axis_i=0)
    expanded = g.op("Expand", unsqueezed, wide)
    flat = g.op("Concat", dims(0, 1), _ints(g, [q_heads]), dims(2, 4), axis_i=0)
    return g.op("Reshape", expanded, flat)


def _ints(g, values):
    return g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))


@functools.cache
def register(opset: int) -> None:
    """Register the translations above with torch.onnx for `opset` and later (once per process)."""
    torch.onnx.register_custom_op_symbolic("aten::rms_norm", rms_norm, opset)
    torch.onnx.register_custom_op_symbolic("aten::scaled_dot_product_attention", scaled_dot_product_attention, opset)
