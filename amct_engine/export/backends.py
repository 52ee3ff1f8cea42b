"""ONNX layer writers: how one layer is written into the traced graph (export.layer_graph).

Every quantised-layer writer receives the same `ExportQuantLayer` (folded layer + factors from the
record); an `OnnxFormat` (amct_engine.export.onnx_formats) names the writer of its file:
- `FloatLayerWriter`: the layer as the exporter writes a float layer (the BN-folded model of PTQ's
  quantize_model);
- `FakeQuantBackend`: standard QuantizeLinear/DequantizeLinear on the activation and the weight;
  onnxruntime runs it and matches the PyTorch QAT model (the fake-quant model).
- `QdqDeployBackend`: the deploy model in onnxruntime's QDQ form (input QuantizeLinear ->
  DequantizeLinear, DequantizeLinear on the INT8 weight and int32 bias, the float op); export/qdq/
  then quantises the tensors between layers so ORT fuses every layer into its int8 kernels.
- `AscendDeployBackend`: AMCT's AscendQuant/AscendDequant layout for the ATC converter.

The graph around the layers comes from the TorchScript-based exporter: a layer placeholder is one
autograd function `symbolic`, and the export costs a fraction of a second, where the dynamo exporter
would need a custom translation table and seconds per export. Writers call `g.op` as a torch.onnx
symbolic does, on export.layer_graph's OnnxBuilder.
"""

from __future__ import annotations

import numpy as np
import torch

from amct_engine.export.ascend import ASCEND_DOMAIN, pack_dequant_param
from amct_engine.export.layer_graph import LAYER_ATTR, WTS_TYPE_ATTR
from amct_engine.export.quant_layer import ExportQuantLayer
from amct_engine.layers import behaviour_of


def _const(g, value: torch.Tensor):
    return g.op("Constant", value_t=value)


def _unsigned_codes(weight_q: torch.Tensor) -> torch.Tensor:
    """int8 weight codes as uint8 codes + 128 (zero point 128): the same integers.

    onnxruntime runs MatMulInteger/ConvInteger/QLinearConv, and the integer MatMul it makes of
    DequantizeLinear -> MatMul, on integer kernels; on x86 without VNNI the u8s8 kernel sums pairs
    of products in saturating 16-bit lanes (the documented `reduce_range` issue): MiniLM's INT8
    model came out at cosine 0.99 to its PyTorch twin, the Fashion-MNIST CNN's deploy logits off by
    6 % of their range. The u8u8 kernel is exact on every CPU.
    """
    return (weight_q.to(torch.int16) + 128).to(torch.uint8)


def _integer_activation(g, x, module: ExportQuantLayer, unsigned: bool = False):
    """Integer-valued floats q - offset_d of the layer input (quant.deployed.quantized_input).

    `unsigned` stores the codes as uint8 with zero point offset_d + 128 (same values), the form
    onnxruntime's exact u8u8 integer kernels take.
    """
    f = module.factors
    offset = torch.tensor(f.offset_d, dtype=torch.int8 if f.act_bits == 8 else torch.float32)
    if f.act_bits == 8 and unsigned:
        offset = torch.tensor(f.offset_d + 128, dtype=torch.uint8)
    scale = _const(g, torch.tensor(f.scale_d, dtype=torch.float32))
    if f.act_bits == 8:
        # DequantizeLinear with a unit scale yields the codes minus the zero point, exactly.
        zero_point = _const(g, offset)
        codes = g.op("QuantizeLinear", x, scale, zero_point)
        return g.op("DequantizeLinear", codes, _const(g, torch.tensor(1.0)), zero_point)
    # INT16 needs opset 21 QuantizeLinear; AMCT's float emulation (docs/spec/engine.md §5) computes the same.
    qn, qp = -(2 ** (f.act_bits - 1)), 2 ** (f.act_bits - 1) - 1
    offset = _const(g, offset)
    q = g.op("Add", g.op("Round", g.op("Div", x, scale)), offset)
    q = g.op("Clip", q, _const(g, torch.tensor(float(qn))), _const(g, torch.tensor(float(qp))))
    return g.op("Sub", q, offset)


def _rescale(g, y, module: ExportQuantLayer):
    """AscendDequant as one Mul by scale_w * scale_d per output channel."""
    deq = (module.factors.scale_w * module.factors.scale_d).float()
    behaviour = behaviour_of(module.layer)
    shape = behaviour.output_channel_shape(deq.numel(), behaviour.output_rank(module.layer))
    return g.op("Mul", y, _const(g, deq.reshape(shape)))


class FloatLayerWriter:
    """The float layer, as torch.onnx writes nn.Linear / nn.Conv*: Gemm on 2-D inputs, else MatMul + Add."""

    @staticmethod
    def emit(g, x, module):
        layer = module.layer
        weight = _const(g, layer.weight.detach())
        bias = _const(g, layer.bias.detach()) if layer.bias is not None else None
        return behaviour_of(layer).write(g, x, layer, weight, bias, input_rank=g.rank(x))


class FakeQuantBackend:
    """Standard QuantizeLinear/DequantizeLinear on activation and weight, computed in the integer
    domain like AMCT's fake-quant model: layer(q_x - o, q_w) + q_b, then one rescale. The QAT eval
    forward (`deployed_forward`) and the Ascend reference compute exactly this, bit for bit."""

    @staticmethod
    def emit(g, x, module: ExportQuantLayer):
        f = module.factors
        behaviour = behaviour_of(module.layer)
        linear = behaviour.matmul_like
        x_int = _integer_activation(g, x, module, unsigned=linear)
        if not behaviour.int8_kernel or f.act_bits != 8:
            # Integer-valued float weights: onnxruntime would turn DQ(weight) -> MatMul on a float
            # (INT16-emulated) input into a dynamically quantised MatMul that re-quantises it.
            weight = _const(g, f.weight_q.float())
        elif linear:
            weight = g.op(
                "DequantizeLinear",
                _const(g, _unsigned_codes(f.weight_q)),
                _const(g, torch.tensor(1.0)),
                _const(g, torch.tensor(128, dtype=torch.uint8)),
            )
        else:
            weight = g.op(
                "DequantizeLinear",
                _const(g, f.weight_q),
                _const(g, torch.tensor(1.0)),
                _const(g, torch.tensor(0, dtype=torch.int8)),
            )
        bias = _const(g, f.bias_q.float()) if f.bias_q is not None else None
        return _rescale(g, behaviour.write(g, x_int, module.layer, weight, bias, input_rank=None), module)


def _activation_qdq(g, x, scale: float, offset: int, tag: dict):
    """QuantizeLinear -> DequantizeLinear with AMCT's int8 offset as a uint8 zero point (+128):
    uint8 activations are what onnxruntime's fastest (U8S8) and exact (U8U8) kernels take."""
    scale = _const(g, torch.tensor(scale, dtype=torch.float32))
    zero_point = _const(g, torch.tensor(offset + 128, dtype=torch.uint8))
    return g.op("DequantizeLinear", g.op("QuantizeLinear", x, scale, zero_point, **tag), scale, zero_point, **tag)


def _weight_codes(f, signed: bool, transpose: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight codes and their zero point: int8 and 0 (`signed`), or uint8 codes + 128 and 128."""
    codes = f.weight_q.t().contiguous() if transpose else f.weight_q
    if signed:
        return codes, torch.zeros(f.scale_w.shape, dtype=torch.int8)
    return _unsigned_codes(codes), torch.full(f.scale_w.shape, 128, dtype=torch.uint8)


class QdqDeployBackend:
    """The deploy model as onnxruntime's own static quantiser writes it (QDQ form): the input
    quantised by the layer's quantiser, DequantizeLinear on the integer weight and the int32 bias
    (scale scale_w * scale_d), the float op between them. onnxruntime fuses each such group into
    QLinearConv / QGemm once export/qdq/boundaries.py has quantised the layer's output too.

    `module.signed_weights` (export.deploy_target) picks int8 or uint8 + 128 weight codes.
    """

    @staticmethod
    def emit(g, x, module: ExportQuantLayer):
        layer, f = module.layer, module.factors
        behaviour = behaviour_of(layer)
        if f.act_bits != 8 or not behaviour.int8_kernel:
            # No integer kernel for INT16 inputs or transposed convs in onnxruntime: the fake-quant form,
            # marked by an Identity that export/qdq/boundaries.py names `<layer>/NoInt8Kernel` for the report.
            return g.op("Identity", FakeQuantBackend.emit(g, x, module), **{f"{LAYER_ATTR}_s": module.layer_name})
        tag = {f"{LAYER_ATTR}_s": module.layer_name}
        x_hat = _activation_qdq(g, x, f.scale_d, f.offset_d, tag)
        per_channel = f.scale_w.numel() > 1
        rank = g.rank(x)
        linear = behaviour.matmul_like
        matmul = linear and rank != 2  # Gemm takes 2-D inputs only; MatMul has W^T, channels on axis 1
        axis = {"axis_i": 1 if matmul else 0} if per_channel else {}

        def vector(values: torch.Tensor) -> torch.Tensor:
            return values if per_channel else values.reshape(())

        # 4-bit codes cannot saturate the u8s8 kernels (2 x 255 x 8 < 2**15): signed on every target,
        # which also lets export.int4_pack store them as INT4.
        signed = getattr(module, "signed_weights", True) or f.wts_bits <= 4
        codes, zero = _weight_codes(f, signed, transpose=matmul)
        # A conv's zero point of 0 is left out (its default): a vector per layer costs bytes on small models.
        # ORT's QGemm/MatMul selectors want the zero points written.
        zero_input = [_const(g, vector(zero))] if zero.dtype == torch.uint8 or linear else []
        weight = g.op(
            "DequantizeLinear", _const(g, codes), _const(g, vector(f.scale_w.float())), *zero_input, **axis, **tag
        )
        bias = None
        if f.bias_q is not None:
            # The int32 bias shares the accumulator's scale, scale_d * scale_w, as QLinearConv/QGemm need.
            bias_scale = (f.scale_w * f.scale_d).float()
            # ORT's QGemm selector wants the bias zero point written; a conv's may be left out.
            bias_zero = [_const(g, vector(torch.zeros_like(f.scale_w, dtype=torch.int32)))] if linear else []
            bias = g.op(
                "DequantizeLinear",
                _const(g, f.bias_q),
                _const(g, vector(bias_scale)),
                *bias_zero,
                **({"axis_i": 0} if per_channel else {}),
                **tag,
            )
        stored = "transposed" if matmul else "torch"
        return behaviour.write(g, x_hat, layer, weight, bias, input_rank=rank, stored=stored, **tag)


class AscendDeployBackend:
    """AMCT's deploy layout for the ATC converter (docs/spec/engine.md §5); finished by export.ascend.

    Weights and bias are emitted as float tensors holding the integer values: the exporter's type
    promotion would otherwise cast INT8 weights to the bias's INT32. `finalize_ascend_model`
    stores them as INT8/INT4 and INT32, guided by the temporary layer attributes.
    """

    @staticmethod
    def emit(g, x, module: ExportQuantLayer):
        layer, f = module.layer, module.factors
        tag = {f"{LAYER_ATTR}_s": module.layer_name, f"{WTS_TYPE_ATTR}_s": f"INT{f.wts_bits}"}
        x_q = g.op(
            f"{ASCEND_DOMAIN}::AscendQuant",
            x,
            scale_f=1.0 / f.scale_d,
            offset_f=float(f.offset_d),
            dst_type_s=f"INT{f.act_bits}",
            **tag,
        )
        bias = _const(g, f.bias_q.float()) if f.bias_q is not None else None
        behaviour = behaviour_of(layer)
        if behaviour.matmul_like:  # AMCT's layout stores a Linear's weight as the MatMul reads it
            weight, stored = _const(g, f.weight_q.t().float().contiguous()), "transposed"
        else:
            weight, stored = _const(g, f.weight_q.float()), "torch"
        y = behaviour.write(g, x_q, layer, weight, bias, input_rank=None, stored=stored, **tag)
        # The param travels as int64 (same bits); finalize_ascend_model stores it as UINT64.
        words = pack_dequant_param((f.scale_w * f.scale_d).numpy()).view(np.int64)
        return g.op(f"{ASCEND_DOMAIN}::AscendDequant", y, _const(g, torch.from_numpy(words.copy())), dtype_i=0, **tag)
