"""ULQ activation quantiser: learnable asymmetric clip range with IFMR initialisation (docs/spec/engine.md §4.1)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from .ifmr import IfmrObserver, IfmrResult
from .primitives import (
    asymmetric_scale_offset,
    check_quantizable,
    fake_quantize,
    process_scale,
    quant_range,
)


def guard_clips(clip_max, clip_min, clip_max_pre, clip_min_pre, fixed_min: bool):
    """Forward steps 1-2 of docs/spec/engine.md §4.1, as tensor selects (no host sync).

    fixed_min forces cmin = 0; then an empty range reverts both clips to `_pre`, else a negative
    cmax reverts cmax, else a positive cmin reverts cmin.
    """
    cmax = clip_max.detach().to(torch.float32)
    cmin = clip_min.detach().to(torch.float32)
    if fixed_min:
        cmin = torch.zeros_like(cmin)
    pre_max = clip_max_pre.detach().to(torch.float32)
    pre_min = clip_min_pre.detach().to(torch.float32)
    empty = (cmax - cmin) == 0
    revert_max = empty | (cmax < 0)
    revert_min = empty | (~revert_max & (cmin > 0))
    return torch.where(revert_max, pre_max, cmax), torch.where(revert_min, pre_min, cmin)


def clip_scale_offset(cmax: torch.Tensor, cmin: torch.Tensor, bits: int):
    """Asymmetric (scale, offset) of a clip range, made safe by `process_scale` (docs/spec/engine.md §4.0)."""
    scale, offset = asymmetric_scale_offset(cmax, cmin, bits)
    return process_scale(scale, offset, bits, asymmetric=True)


def ulq_act_backward(x, grad_y, cmax, cmin, scale, offset, bits: int):
    """docs/spec/engine.md §4.1 backward: clip gradients (LSQ/PACT-like) and the straight-through input gradient.

    With t = cmax/s above the range, cmin/s below it and x/s inside, and e = (round(t) - t)/(2^b - 1):
        dL/dcmax = sum((e + upper) * g),  dL/dcmin = sum((lower - e) * g).
    Outside the range e is a constant, so both sums reduce to three tensor-wide sums (e*g inside,
    g above, g below): fewer full-size temporaries on the training hot path.
    """
    qn, qp = quant_range(bits)
    x32 = x.to(torch.float32)
    g = grad_y.to(torch.float32)
    offset = offset.to(torch.float32)
    upper = x32 > scale * (qp - offset)
    lower = x32 < scale * (qn - offset)
    outside = upper | lower
    levels = (1 << bits) - 1
    ratio = x32 / scale
    err_inside = ((torch.round(ratio) - ratio) * g).masked_fill_(outside, 0).sum() / levels
    g_upper = g.masked_fill(~upper, 0).sum()
    g_lower = g.masked_fill(~lower, 0).sum()
    e_max = (torch.round(cmax / scale) - cmax / scale) / levels
    e_min = (torch.round(cmin / scale) - cmin / scale) / levels
    grad_max = err_inside + (e_max + 1) * g_upper + e_min * g_lower
    grad_min = -err_inside - e_max * g_upper + (1 - e_min) * g_lower
    grad_x = grad_y.masked_fill(outside, 0)
    return grad_x, grad_max, grad_min


def _fast_fake_quantize(x, scale, offset, bits: int):
    """docs/spec/engine.md §4.0 fake quantisation through torch's fused kernel (one pass instead of five).

    The kernel multiplies by 1/scale where the formula divides, which can move a value sitting
    exactly on a rounding tie; training tolerates that, and eval/export use the exact formula.
    """
    if x.dtype != torch.float32:
        return fake_quantize(x, scale, offset, bits)
    qn, qp = quant_range(bits)
    return torch.fake_quantize_per_tensor_affine(x, scale.reshape(()), offset.to(torch.int32).reshape(()), qn, qp)


class UlqActFunction(torch.autograd.Function):
    """y = fake-quantised x over the guarded clip range; returns (y, scale, offset, cmax, cmin).

    Only y is differentiable. Tensors needed by backward go through `save_for_backward`: AMCT kept
    the input on a ctx attribute and leaked it across steps (docs/spec/engine.md §8).
    """

    @staticmethod
    def forward(ctx, x, clip_max, clip_min, clip_max_pre, clip_min_pre, bits: int, fixed_min: bool):
        cmax, cmin = guard_clips(clip_max, clip_min, clip_max_pre, clip_min_pre, fixed_min)
        scale, offset = clip_scale_offset(cmax, cmin, bits)
        y = _fast_fake_quantize(x, scale, offset, bits)
        ctx.save_for_backward(x, cmax, cmin, scale, offset)
        ctx.bits = bits
        ctx.fixed_min = fixed_min
        ctx.clip_dtypes = (clip_max.dtype, clip_min.dtype)
        ctx.mark_non_differentiable(scale, offset, cmax, cmin)
        return y, scale, offset, cmax, cmin

    @staticmethod
    def backward(ctx, grad_y, *_unused):
        x, cmax, cmin, scale, offset = ctx.saved_tensors
        grad_x, grad_max, grad_min = ulq_act_backward(x, grad_y, cmax, cmin, scale, offset, ctx.bits)
        max_dtype, min_dtype = ctx.clip_dtypes
        # With fixed_min the output does not depend on clip_min, so it gets no gradient.
        grad_min = None if ctx.fixed_min else grad_min.to(min_dtype)
        return grad_x, grad_max.to(max_dtype), grad_min, None, None, None, None


def _ddp_mean(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Averages across DDP ranks (docs/spec/engine.md §4.1); identity outside a multi-process group.

    Works on copies: the Function's clip outputs are also saved for its backward.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return tensors
    averaged = []
    for tensor in tensors:
        total = tensor.detach().clone()
        dist.all_reduce(total)
        averaged.append(total / dist.get_world_size())
    return tuple(averaged)


class UlqActQuantizer(nn.Module):
    """Learnable-clip asymmetric activation quantiser (docs/spec/engine.md §4.1).

    Initialisation: explicit `clip_max`/`clip_min` skip IFMR. Otherwise the first `batch_num`
    forwards feed an IFMR observer, in train *or* eval mode (as AMCT's wrapper does), so a model can
    be exported right after creation. The search is symmetric as in AMCT (docs/spec/engine.md §4.1) unless
    `asymmetric_init`: then it keeps the data's minimum and searches the maximum (IFMR with offset),
    which suits one-sided inputs that no `fixed_min` covers. Batches before the last one pass through
    unquantised while the clips follow their max/min; the batch that completes the search is
    quantised with the IFMR clips. Calibration state survives `load_state_dict`: finite `_pre`
    buffers mean calibrated.
    """

    def __init__(
        self,
        bits: int = 8,
        fixed_min: bool = False,
        clip_max: float | None = None,
        clip_min: float | None = None,
        batch_num: int = 1,
        asymmetric_init: bool = False,
    ) -> None:
        super().__init__()
        quant_range(bits)
        explicit = _check_clip_args(clip_max, clip_min)
        self.bits = bits
        self.fixed_min = fixed_min
        self.batch_num = batch_num
        init_max, init_min = (clip_max, clip_min) if explicit else (1.0, -1.0)
        self.acts_clip_max = nn.Parameter(torch.tensor(float(init_max)))
        self.acts_clip_min = nn.Parameter(torch.tensor(float(init_min)))
        pre_max, pre_min = (init_max, init_min) if explicit else (math.nan, math.nan)
        self.register_buffer("acts_clip_max_pre", torch.tensor(float(pre_max)))
        self.register_buffer("acts_clip_min_pre", torch.tensor(float(pre_min)))
        self.register_buffer("acts_scale", torch.tensor(math.nan))
        self.register_buffer("acts_offset", torch.tensor(0, dtype=torch.int32))
        self.observer = None if explicit else IfmrObserver(bits, batch_num, with_offset=asymmetric_init)
        self._calibrated = explicit
        if explicit:
            self._store_factors(*self._current_factors())

    @property
    def calibrated(self) -> bool:
        return self._calibrated

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NaN/Inf are looked for while calibrating, where they would corrupt the clip range.
        check_quantizable(x, "activation", finite=not self._calibrated)
        if not self._calibrated and not self._observe(x):
            return x
        y, scale, offset, cmax, cmin = UlqActFunction.apply(
            x,
            self.acts_clip_max,
            self.acts_clip_min,
            self.acts_clip_max_pre,
            self.acts_clip_min_pre,
            self.bits,
            self.fixed_min,
        )
        if self.training:
            cmax, cmin = _ddp_mean(cmax, cmin)
        self._store_clips(cmax, cmin, pre=True)
        self._store_factors(scale, offset)
        return y

    def scale_offset(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Current (scale float32, offset int32) for the record file and export."""
        if not bool(torch.isfinite(self.acts_scale)):
            raise RuntimeError("the activation quantiser has no scale yet: run a forward pass (calibration) first")
        return self.acts_scale.detach().float().clone(), self.acts_offset.detach().to(torch.int32).clone()

    def extra_repr(self) -> str:
        return f"bits={self.bits}, fixed_min={self.fixed_min}, batch_num={self.batch_num}"

    def _observe(self, x: torch.Tensor) -> bool:
        """Feed IFMR; True when calibrated (the caller then quantises this batch)."""
        if self.observer(x):
            self._apply_ifmr(self.observer.result)
            return True
        # docs/spec/engine.md §4.1: until IFMR finishes, the clips follow the batch range (the batch is unquantised).
        with torch.no_grad():
            cmax, cmin = x.detach().max(), x.detach().min()
            self._store_clips(cmax, cmin, pre=False)
            # No guard here: `_pre` is still unset, and a constant batch just gives scale 1.
            cmin = torch.zeros_like(cmin) if self.fixed_min else cmin
            self._store_factors(*clip_scale_offset(cmax, cmin, self.bits))
        return False

    def _apply_ifmr(self, result: IfmrResult) -> None:
        # docs/spec/engine.md §4.1: symmetric IFMR gives clip_max = Qp*s and clip_min = -2^(b-1)*s, also into _pre;
        # with offset o, clip_max = (Qp - o)*s and clip_min = -(2^(b-1) + o)*s.
        cmax, cmin = _ddp_mean(result.clip_max, result.clip_min)
        self._store_clips(cmax, cmin, pre=True)
        self._calibrated = True

    def _current_factors(self):
        cmax, cmin = guard_clips(
            self.acts_clip_max,
            self.acts_clip_min,
            self.acts_clip_max_pre,
            self.acts_clip_min_pre,
            self.fixed_min,
        )
        return clip_scale_offset(cmax, cmin, self.bits)

    @torch.no_grad()
    def _store_clips(self, cmax: torch.Tensor, cmin: torch.Tensor, pre: bool) -> None:
        self.acts_clip_max.copy_(cmax)
        self.acts_clip_min.copy_(cmin)
        if pre:
            self.acts_clip_max_pre.copy_(cmax)
            self.acts_clip_min_pre.copy_(cmin)

    @torch.no_grad()
    def _store_factors(self, scale: torch.Tensor, offset: torch.Tensor) -> None:
        self.acts_scale.copy_(scale)
        self.acts_offset.copy_(offset)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if prefix + "acts_clip_max_pre" in state_dict:
            self._calibrated = bool(torch.isfinite(self.acts_clip_max_pre))


def _check_clip_args(clip_max: float | None, clip_min: float | None) -> bool:
    """True when explicit clips are given; they come as a pair with clip_max > 0 > clip_min
    (docs/spec/engine.md §3.2)."""
    if clip_max is None and clip_min is None:
        return False
    if clip_max is None or clip_min is None:
        raise ValueError("clip_max and clip_min must be given together")
    if not (clip_max > 0 and clip_min < 0):
        raise ValueError(f"need clip_max > 0 and clip_min < 0, got clip_max={clip_max}, clip_min={clip_min}")
    return True
