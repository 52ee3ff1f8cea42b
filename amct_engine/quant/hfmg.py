"""HFMG: histogram-based activation calibration (docs/spec/engine.md §4.10).

The calibration batches are summarised in one histogram of ``num_of_bins`` bins (the range
grows as batches come, old counts are moved to the bins of the wider range), so memory does not
grow with ``batch_num``. The clip is then searched on the histogram: every bin edge is a
candidate end, and the quantisation error of a candidate is the count-weighted squared error of
the bin centres. Asymmetric ranges are searched one end at a time (max, then min, then max again).
"""

from __future__ import annotations

import torch
from torch import nn

from .ifmr import IfmrResult
from .primitives import asymmetric_scale_offset, check_quantizable, process_scale, quant_range, values_in_memory_order

_CHUNK = 1 << 17  # candidates x bins evaluated at once (float64: 1 MiB, stays in cache)
_CANDIDATES = 512  # clip ends tried per search pass: every k-th bin edge, the range's own end included


def _losses(centres, counts, lows, highs, bits: int) -> torch.Tensor:
    """Count-weighted MSE of quantising the bin centres to [low_k, high_k] (0 always inside), per k.

    The operations of one [candidates, bins] expression in the same order, done in place on a
    cache-sized chunk of candidates: the search's cost is passes over that temporary.
    """
    out = []
    chunk = max(1, _CHUNK // centres.numel())
    centres, counts = centres[None, :], counts[None, :]
    for begin in range(0, lows.numel(), chunk):
        lo, hi = lows[begin : begin + chunk, None], highs[begin : begin + chunk, None]
        scale = torch.clamp((hi - lo) / ((1 << bits) - 1), min=1e-12)
        q = torch.clamp(centres, lo, hi)
        q.sub_(lo).div_(scale).round_().mul_(scale).add_(lo).sub_(centres)
        out.append(q.square_().mul_(counts).sum(dim=1))
    return torch.cat(out)


def _thin(ends: torch.Tensor) -> torch.Tensor:
    """At most about _CANDIDATES of the sorted candidate ends, always keeping the last (the full range)."""
    step = max(1, ends.numel() // _CANDIDATES)
    return torch.unique(torch.cat([ends[::step], ends[-1:]]))


def hfmg_search(counts: torch.Tensor, low: float, high: float, bits: int, with_offset: bool) -> IfmrResult:
    """The clip with the lowest histogram error, as scale/offset/clips like IFMR's result."""
    bins = counts.numel()
    edges = torch.linspace(low, high, bins + 1, dtype=torch.float64)
    centres = (edges[:-1] + edges[1:]) / 2
    counts = counts.double()
    qn, qp = quant_range(bits)
    if not with_offset:
        ends = _thin(torch.unique(edges.abs().clamp(min=1e-12)))
        best = ends[torch.argmin(_losses(centres, counts, -ends * (-qn) / qp, ends, bits))]
        scale = (best / qp).float().reshape(1)
        scale, _ = process_scale(scale, torch.zeros_like(scale), bits, asymmetric=False)
        scale = scale.reshape(())
        offset = torch.zeros((), dtype=torch.int32)
    else:
        cmax, cmin = edges[-1].clamp(min=0.0), edges[0].clamp(max=0.0)
        highs, lows = _thin(torch.unique(edges.clamp(min=0.0))), _thin(torch.unique(edges.clamp(max=0.0)))
        for _ in range(2):
            if cmax > 0:
                cmax = highs[torch.argmin(_losses(centres, counts, cmin.expand_as(highs), highs, bits))]
            if cmin < 0:
                cmin = lows[torch.argmin(_losses(centres, counts, lows, cmax.expand_as(lows), bits))]
        scale, offset = asymmetric_scale_offset(cmax.float(), cmin.float(), bits)
        scale, offset = process_scale(scale.reshape(1), offset.reshape(1), bits, asymmetric=True)
        scale, offset = scale.reshape(()), offset.reshape(()).to(torch.int32)
    return IfmrResult(scale, offset, (qp - offset) * scale, -(-qn + offset) * scale)


class HfmgObserver(nn.Module):
    """Histograms the first ``batch_num`` batches, then runs ``hfmg_search`` once."""

    def __init__(self, bits: int = 8, batch_num: int = 1, with_offset: bool = True, num_of_bins: int = 4096):
        super().__init__()
        quant_range(bits)
        if batch_num < 1:
            raise ValueError(f"HFMG batch_num must be >= 1, got {batch_num}")
        self.bits, self.batch_num, self.with_offset, self.num_of_bins = bits, batch_num, with_offset, num_of_bins
        self.result: IfmrResult | None = None
        self._counts: torch.Tensor | None = None
        self._range = (0.0, 0.0)
        self._seen = 0

    @classmethod
    def from_spec(cls, spec, batch_num: int, asymmetric: bool) -> HfmgObserver:
        """The observer of a PTQ layer (config/calibration_cfg.py PtqLayerSpec; quant/calibrators.py)."""
        return cls(spec.act_bits, batch_num, asymmetric, spec.num_of_bins)

    @property
    def done(self) -> bool:
        return self.result is not None

    def _rebin(self, low: float, high: float) -> None:
        """Move the old counts into a histogram over the wider [low, high] by their bin centres."""
        old_low, old_high = self._range
        width = (old_high - old_low) / self.num_of_bins
        centres = old_low + width * (torch.arange(self.num_of_bins, dtype=torch.float64) + 0.5)
        index = ((centres - low) / (high - low) * self.num_of_bins).long().clamp(0, self.num_of_bins - 1)
        counts = torch.zeros(self.num_of_bins, dtype=torch.float64)
        self._counts = counts.index_add_(0, index, self._counts)

    def forward(self, x: torch.Tensor) -> bool:
        if self.done:
            return True
        check_quantizable(x, "calibration batch")
        data = values_in_memory_order(x.detach()).double().cpu()
        low, high = min(float(data.min()), 0.0), max(float(data.max()), 0.0)
        if high == low:
            high = low + 1e-6
        if self._counts is None:
            self._counts, self._range = torch.zeros(self.num_of_bins, dtype=torch.float64), (low, high)
        elif low < self._range[0] or high > self._range[1]:
            low, high = min(low, self._range[0]), max(high, self._range[1])
            self._rebin(low, high)
            self._range = (low, high)
        self._counts += torch.histc(data, self.num_of_bins, *self._range)
        self._seen += 1
        if self._seen >= self.batch_num:
            self.result = hfmg_search(self._counts, *self._range, self.bits, self.with_offset)
            self._counts = None
        return self.done
