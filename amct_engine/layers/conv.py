"""Convolutions: nn.Conv1d/2d/3d and nn.ConvTranspose2d (amct_engine/layer_table.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from amct_engine.layers import LayerBehaviour


def conv_pads(module: nn.Module) -> list[int]:
    """ONNX pads [b1, b2, ..., e1, e2, ...] for the layer's padding (ints or 'same'/'valid')."""
    dims = len(module.kernel_size)
    if isinstance(module.padding, str):
        if module.padding == "valid":
            return [0] * (2 * dims)
        total = [d * (k - 1) for d, k in zip(module.dilation, module.kernel_size, strict=True)]
        return [t // 2 for t in total] + [t - t // 2 for t in total]
    return list(module.padding) * 2


def conv_attrs(module: nn.Module, with_pads: bool = True) -> dict:
    """The ONNX Conv attributes of a torch conv, in torch.onnx's typed-name convention."""
    attrs = {
        "kernel_shape_i": list(module.kernel_size),
        "strides_i": list(module.stride),
        "dilations_i": list(module.dilation),
        "group_i": module.groups,
    }
    if with_pads:
        attrs["pads_i"] = conv_pads(module)
    return attrs


class ConvBehaviour(LayerBehaviour):
    op_type = "Conv"

    def out_channels(self, module: nn.Module) -> int:
        return module.out_channels

    def call(self, module, x, weight, bias):
        return module._conv_forward(x, weight, bias)

    def output_rank(self, module: nn.Module) -> int:
        return len(module.kernel_size) + 2

    def write(self, g, x, module, weight, bias, *, input_rank=None, stored="torch", **attrs):
        inputs = [x, weight] + ([bias] if bias is not None else [])
        return g.op(self.op_type, *inputs, **self._attrs(module), **attrs)

    def _attrs(self, module: nn.Module) -> dict:
        return conv_attrs(module)


class ConvTransposeBehaviour(ConvBehaviour):
    """A transposed conv: weight [Cin, Cout/groups, k…], so output channels run along axis 1 within groups."""

    op_type = "ConvTranspose"
    int8_kernel = False  # onnxruntime has no integer ConvTranspose kernel
    rows_are_output_channels = False

    def input_channel_axis(self, module: nn.Module) -> int:
        return 0

    def weight_groups(self, module: nn.Module) -> int | None:
        return module.groups

    def per_out_channel(self, values: torch.Tensor, module: nn.Module) -> torch.Tensor:
        # output channel c = group * Cout/groups + j lives in its group's rows, column j (docs/spec/engine.md §4.0)
        weight = module.weight
        values = values.to(weight.device).float().reshape(-1)
        groups, cin, cout_g = module.groups, weight.shape[0], weight.shape[1]
        kernel = list(weight.shape[2:])
        values = values.expand(groups * cout_g).reshape(groups, 1, cout_g, *[1] * len(kernel))
        return values.expand(groups, cin // groups, cout_g, *kernel).reshape(weight.shape)

    def call(self, module, x, weight, bias):
        return F.conv_transpose2d(
            x, weight, bias, module.stride, module.padding, module.output_padding, module.groups, module.dilation
        )

    def macs(self, module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
        return int(x.numel() * module.weight[0].numel())  # every input element meets one weight row

    def _attrs(self, module: nn.Module) -> dict:
        return {**conv_attrs(module), "output_padding_i": list(module.output_padding)}


CONV = ConvBehaviour()
CONV_TRANSPOSE = ConvTransposeBehaviour()
