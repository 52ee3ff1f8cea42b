"""nn.Linear (amct_engine/layer_table.py): features on the last axis, any number of leading axes."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from amct_engine.layers import LayerBehaviour


class LinearBehaviour(LayerBehaviour):
    matmul_like = True

    def out_channels(self, module: nn.Module) -> int:
        return module.out_features

    def output_channel_axis(self, rank: int) -> int:
        return rank - 1

    def output_channel_shape(self, n: int, rank: int) -> list[int]:
        return [] if n == 1 else [n]

    def call(self, module, x, weight, bias):
        return F.linear(x, weight, bias)

    def output_rank(self, module: nn.Module) -> int:
        return 2  # as our export sees it: inputs flattened before

    def write(self, g, x, module, weight, bias, *, input_rank=None, stored="torch", **attrs):
        """Gemm on a 2-D input with the weight in torch's layout (what ORT fuses into QGemm); otherwise
        MatMul on the transposed weight, then Add (Gemm takes 2-D inputs only)."""
        if input_rank == 2 and stored == "torch":
            return g.op("Gemm", x, weight, *([bias] if bias is not None else []), transB_i=1, **attrs)
        if stored == "torch":
            weight = g.op("Transpose", weight, perm_i=[1, 0])
        y = g.op("MatMul", x, weight, **attrs)
        return g.op("Add", y, bias, **attrs) if bias is not None else y

    def reads_normalised_channels(self, output_rank) -> bool:
        return output_rank() in (2, None)  # features on axis 1 only for a [N, features] output


LINEAR = LinearBehaviour()
