"""Quantisation primitives shared by every quantiser (docs/spec/engine.md §4.0).

Everything here is elementwise tensor code: a per-channel max/min vector gives a per-channel scale
vector with the same calls as a per-tensor scalar. Results stay on the input's device.

Precision decision: scales are float32, offsets int32, and fake quantisation runs in float32 and
casts back to the input dtype. Computing in float16 would be wrong for INT16 (float16 holds integers
exactly only up to 2048) and would round scales; AMCT computes its factors in float32 as well.
"""

from __future__ import annotations

import math

import torch

# docs/spec/engine.md §4.0: scales below FLT_EPSILON are replaced by 1 (C's FLT_EPSILON, float32 machine epsilon).
FLT_EPSILON = 1.192092896e-7
SUPPORTED_BITS = (4, 8, 16)
QUANTIZABLE_DTYPES = (torch.float32, torch.float16)


def quant_range(bits: int) -> tuple[int, int]:
    """(Qn, Qp) = (-2^(b-1), 2^(b-1)-1) for the supported INT4/INT8/INT16 widths (docs/spec/engine.md §4 notation)."""
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"unsupported bit width {bits!r}: expected one of {SUPPORTED_BITS}")
    half = 1 << (bits - 1)
    return -half, half - 1


def _as_float_tensor(value, like: torch.Tensor | None = None) -> torch.Tensor:
    device = like.device if isinstance(like, torch.Tensor) else None
    if isinstance(value, torch.Tensor):
        return value.detach().to(dtype=torch.float32)
    return torch.as_tensor(value, dtype=torch.float32, device=device)


def symmetric_scale(max_val, min_val, bits: int) -> torch.Tensor:
    """Symmetric scale (offset is 0), elementwise over per-channel max/min (docs/spec/engine.md §4.0).

    scope is Qp, or Qp+1 when |min| > |max|: a dominant negative extreme may use -2^(b-1).
    The raw scale may be 0; callers pass it through `process_scale`.
    """
    _, qp = quant_range(bits)
    max_abs = _as_float_tensor(max_val).abs()
    min_abs = _as_float_tensor(min_val, max_abs).abs()
    scope = torch.where(min_abs > max_abs, float(qp + 1), float(qp))
    return torch.maximum(max_abs, min_abs) / scope


def asymmetric_scale_offset(max_val, min_val, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric scale and int32 offset (docs/spec/engine.md §4.0); the range always contains 0.

    The raw scale may be 0 (max == min == 0); callers pass the pair through `process_scale`.
    """
    qn, _ = quant_range(bits)
    levels = (1 << bits) - 1
    max_val = torch.clamp(_as_float_tensor(max_val), min=0.0)
    min_val = torch.clamp(_as_float_tensor(min_val, max_val), max=0.0)
    scale = (max_val - min_val) / levels
    # -ceil((2^b-1)/2) == -2^(b-1) == Qn; a degenerate range takes offset Qn without dividing by 0.
    safe_scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    offset = torch.where(max_val != min_val, qn - min_val / safe_scale, torch.full_like(scale, qn))
    return scale, torch.round(offset).to(torch.int32)


def process_scale(
    scale: torch.Tensor, offset: torch.Tensor, bits: int, asymmetric: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace scales below FLT_EPSILON by 1 (offset Qn when asymmetric); NaN/Inf raise (docs/spec/engine.md §4.0)."""
    qn, _ = quant_range(bits)
    offset = torch.as_tensor(offset, device=scale.device)
    # One device sync for both checks: AMCT raises here rather than export a broken factor.
    if not bool(torch.isfinite(scale).all() & torch.isfinite(offset.float()).all()):
        raise RuntimeError("quantisation scale or offset has an invalid value (inf or nan)")
    too_small = scale < FLT_EPSILON
    if asymmetric:
        offset = torch.where(too_small, torch.full_like(offset, qn), offset)
    scale = torch.where(too_small, torch.ones_like(scale), scale)
    return scale, offset


def broadcast_along_axis0(factor: torch.Tensor, ndim: int, channels: int) -> torch.Tensor:
    """View a per-tensor ([] or [1]) or per-channel ([C]) factor so it broadcasts over axis 0."""
    if factor.numel() == 1:
        return factor.reshape(())
    if factor.numel() != channels:
        raise ValueError(f"a quantisation factor has {factor.numel()} values; expected 1 or {channels} (axis 0)")
    return factor.reshape((channels,) + (1,) * (ndim - 1))


def fake_quantize(x: torch.Tensor, scale, offset, bits: int) -> torch.Tensor:
    """(clamp(round(x/scale + offset), Qn, Qp) - offset) * scale, per channel along axis 0
    (docs/spec/engine.md §4.0)."""
    qn, qp = quant_range(bits)
    channels = x.shape[0] if x.dim() > 0 else 1
    scale = broadcast_along_axis0(_as_float_tensor(scale, x).to(x.device), x.dim(), channels)
    offset = broadcast_along_axis0(_as_float_tensor(offset, x).to(x.device), x.dim(), channels)
    q = torch.clamp(torch.round(x.to(torch.float32) / scale + offset), qn, qp)
    return ((q - offset) * scale).to(x.dtype)


def values_in_memory_order(x: torch.Tensor) -> torch.Tensor:
    """x's values as a 1-D tensor, a view when x is dense channels-last (PTQ's calibration layout, ptq.py).

    For statistics that ignore the order (calibration observers): `reshape(-1)` of a channels-last
    tensor is a transposing copy, slower than the convolution that wrote it.
    """
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return x.permute(0, 2, 3, 1).reshape(-1)
    return x.reshape(-1)


def check_quantizable(x: torch.Tensor, what: str = "tensor", finite: bool = True) -> None:
    """Only finite float32/float16 tensors can be quantised (docs/spec/engine.md §4.0 input checks).

    `finite=False` checks the dtype only: the full scan costs a pass over the tensor and a host
    sync, which a training step should not pay on every activation.
    """
    if x.dtype not in QUANTIZABLE_DTYPES:
        raise TypeError(f"only float32 and float16 {what}s can be quantised, got {x.dtype}")
    if finite and x.numel() and not all(math.isfinite(float(v)) for v in torch.aminmax(x.detach())):
        # aminmax propagates nan and keeps an inf: one pass without a mask tensor (isfinite(x).all()
        # wrote a bool per value and read it back; calibration scans every batch).
        raise RuntimeError(f"the {what} to be quantised contains inf or nan")


def to_cout_major(weight: torch.Tensor, transpose_groups: int | None = None) -> torch.Tensor:
    """Return the weight with Cout on axis 0 (docs/spec/engine.md §4.0).

    Conv/Linear weights already are [Cout, ...]. A ConvTranspose weight is [Cin, Cout/g, *k]; output
    channel gi*(Cout/g)+j of group gi lives at rows gi*(Cin/g):(gi+1)*(Cin/g), column j, so it becomes
    [g, Cin/g, Cout/g, *k] -> swap the two middle axes -> [Cout, Cin/g, *k].
    """
    if transpose_groups is None:
        return weight
    g = transpose_groups
    cin, cout_g, *kernel = weight.shape
    if g < 1 or cin % g:
        raise ValueError(f"ConvTranspose weight with Cin={cin} cannot be split into {g} groups")
    grouped = weight.reshape(g, cin // g, cout_g, *kernel).transpose(1, 2)
    return grouped.reshape(g * cout_g, cin // g, *kernel)


def from_cout_major(weight_cm: torch.Tensor, transpose_groups: int | None, shape: torch.Size) -> torch.Tensor:
    """Inverse of `to_cout_major`: back to the module's own weight layout `shape`."""
    if transpose_groups is None:
        return weight_cm
    g = transpose_groups
    cin, cout_g, *kernel = shape
    grouped = weight_cm.reshape(g, cout_g, cin // g, *kernel).transpose(1, 2)
    return grouped.reshape(shape)


def match_state_shapes(module: torch.nn.Module, state_dict: dict, prefix: str, names) -> None:
    """Resize lazily-shaped factors (e.g. per-channel `wts_scales`) to a checkpoint's shapes.

    Called from `_load_from_state_dict` before loading. `.data` is swapped, so a Parameter keeps its
    identity and an optimizer built earlier still trains it.
    """
    for name in names:
        incoming = state_dict.get(prefix + name)
        current = getattr(module, name)
        if isinstance(incoming, torch.Tensor) and incoming.shape != current.shape:
            current.data = torch.empty(incoming.shape, dtype=current.dtype, device=current.device)
