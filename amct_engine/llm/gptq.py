"""GPTQ: quantise a Linear's weight one input column at a time, pushing each column's rounding error
onto the columns not yet quantised through the inverse Hessian of the layer's inputs
(docs/spec/llm.md §3.2; Frantar et al. 2022, "GPTQ", Algorithm 1 with lazy batch updates).

Minimises ``||W X - Q(W) X||^2`` over the calibration tokens given ``H = E[x x^T]``. Group ranges are
taken when the quantiser reaches a group's first column, from the already-updated weights, so the
result is an ordinary group-quantised weight (same codes/scales/zero points layout as RTN).
"""

from __future__ import annotations

import contextlib

import torch

from amct_engine.llm.config import WeightSpec
from amct_engine.llm.group_quant import GroupCodes, effective_group_size, qparams, quantize_codes, zero_point_storage


def _inverse_hessian_factor(hessian: torch.Tensor, weight: torch.Tensor, percdamp: float) -> torch.Tensor:
    """Upper Cholesky factor of ``(H + damp I)^-1``; dead inputs (never non-zero) get ``H_ii = 1`` and a zero column."""
    h = hessian.double().clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    weight[:, dead] = 0.0
    h += percdamp * torch.mean(torch.diag(h)) * torch.eye(h.shape[0], dtype=h.dtype)
    for extra in (0.0, 1e-6, 1e-4, 1e-2):  # more damping only if the Hessian is numerically singular
        try:
            inverse = torch.cholesky_inverse(
                torch.linalg.cholesky(h + extra * torch.diag(h).mean() * torch.eye(len(h)))
            )
            return torch.linalg.cholesky(inverse, upper=True).float()
        except torch.linalg.LinAlgError:
            continue
    raise RuntimeError("GPTQ: the calibration Hessian is not positive definite even with damping")


def _column_params(
    w: torch.Tensor, spec: WeightSpec, tensor_range: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point (out,) from the columns ``w`` (out, cols) of one group."""
    if tensor_range is not None:
        wmin, wmax = tensor_range
        return qparams(
            wmin.expand(w.shape[0]), wmax.expand(w.shape[0]), spec.bits, spec.symmetric, spec.float_zero_point
        )
    return qparams(w.amin(dim=1), w.amax(dim=1), spec.bits, spec.symmetric, spec.float_zero_point)


@torch.no_grad()
def gptq_quantize(
    weight: torch.Tensor, hessian: torch.Tensor, spec: WeightSpec, percdamp: float = 0.01, block_size: int = 128
) -> GroupCodes:
    """GPTQ codes of ``weight`` (out, in) for inputs with second moment ``hessian`` (in, in)."""
    w = weight.detach().float().clone()
    rows, cols = w.shape
    group = effective_group_size(spec, cols)
    hinv = _inverse_hessian_factor(hessian, w, percdamp)
    block_size = max(block_size - block_size % group, group) if group < cols else block_size
    tensor_range = (w.min(), w.max()) if spec.strategy == "tensor" else None
    n_groups = -(-cols // group)
    scales = torch.zeros(rows, n_groups)
    zeros = torch.zeros(rows, n_groups)
    codes = torch.zeros(rows, cols)
    scale = zero = torch.zeros(rows)
    with _one_thread():
        _walk(w, hinv, spec, group, block_size, tensor_range, codes, scales, zeros, scale, zero)
    return GroupCodes(codes.to(torch.uint8), scales, zero_point_storage(zeros, spec), group, spec.bits, spec.symmetric)


@contextlib.contextmanager
def _one_thread():
    """The column walk runs thousands of tiny ops: with several intra-op threads each pays a barrier, and on a
    loaded machine the walk was 5-8x slower (SmolLM2-135M, 2 shared cores: 508 s vs about 70 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _walk(w, hinv, spec, group, block_size, tensor_range, codes, scales, zeros, scale, zero) -> None:
    rows, cols = w.shape
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        w1, err1, hinv1 = w[:, i1:i2].clone(), torch.zeros(rows, i2 - i1), hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % group == 0:  # a group starts: its range from the weights as updated so far
                scale, zero = _column_params(w1[:, i : i + group] if group < cols else w, spec, tensor_range)
                scales[:, col // group], zeros[:, col // group] = scale, zero
            q = quantize_codes(w1[:, i], scale, zero, spec.bits, spec.float_zero_point)
            codes[:, col] = q
            err = (w1[:, i] - (q - zero) * scale) / hinv1[i, i]
            w1[:, i:] -= err.unsqueeze(1) @ hinv1[i, i:].unsqueeze(0)
            err1[:, i] = err
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]
