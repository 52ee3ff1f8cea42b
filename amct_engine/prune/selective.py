"""4-of-2 selective pruning (``l1_selective_prune``, M4N2; docs/spec/engine.md §4.5).

In every group of 4 weights along Cin, the 2 smallest |w| are masked. ``SelectiveMask`` holds the
mask of one weight and refreshes it per ``update_freq``; it masks the weight where the weight is
read, so quantisation sees the masked weight:

- a float layer gets the mask as a ``torch.nn.utils.parametrize`` parametrization of ``weight``
  (``layer.weight`` is the masked weight; the module stays a Conv2d/Linear for user code);
- a quantised layer (``QuantRetrainLayer``) gets ``MaskedWeightQuantizer``: mask, then the layer's
  own weight quantiser (a parametrization would break the wrapper's ``functional_call``).

``bake_selective_masks`` writes W ⊙ mask into the weight and removes both forms (save).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils import parametrize

from amct_engine.layers import behaviour_of
from amct_engine.prune.records import update_selective_records
from amct_engine.quant.retrain_layer import QuantRetrainLayer
from amct_engine.quant.weight_quantizer import WeightQuantizer
from amct_engine.record import RecordFile

GROUP_SIZE, PRUNED_PER_GROUP = 4, 2  # M4N2


def cin_axis(layer: nn.Module) -> int:
    """The weight axis of input channels: axis 0 of a ConvTranspose weight [Cin, Cout/g, kh, kw], 1 otherwise
    (docs/spec/engine.md §4.5; the layer-type table knows)."""
    return behaviour_of(layer).input_channel_axis(layer)


def m4n2_mask(weight: torch.Tensor, axis: int = 1) -> torch.Tensor:
    """Boolean mask keeping the 2 largest |w| of every 4 along ``axis`` (the oracle's ``generate_mask``).

    Cin is zero-padded to a multiple of 4 (padding counts as the smallest values); with fewer than 4
    input channels nothing is masked. Ties follow ``torch.topk``.
    """
    weight = weight.detach()
    channels = weight.shape[axis]
    if channels < GROUP_SIZE:
        return torch.ones_like(weight, dtype=torch.bool)
    groups = math.ceil(channels / GROUP_SIZE)
    pad_shape = list(weight.shape)
    pad_shape[axis] = groups * GROUP_SIZE - channels
    padded = torch.cat([weight.abs(), weight.new_zeros(pad_shape)], dim=axis)
    grouped = padded.reshape(*weight.shape[:axis], groups, GROUP_SIZE, *weight.shape[axis + 1 :])
    smallest = grouped.topk(PRUNED_PER_GROUP, dim=axis + 1, largest=False).indices
    mask = torch.ones_like(grouped, dtype=torch.bool).scatter_(axis + 1, smallest, False)
    mask = mask.reshape(*weight.shape[:axis], groups * GROUP_SIZE, *weight.shape[axis + 1 :])
    return mask.narrow(axis, 0, channels).contiguous()


class SelectiveMask(nn.Module):
    """The 4:2 mask of one weight, refreshed from the weight every ``update_freq`` training batches.

    ``update_freq`` 0: the mask of the first batch is kept (computed at creation: the weights are
    the same); k: refreshed when ``prune_cur_batch % k == 0`` (docs/spec/engine.md §4.5). Unlike AMCT the counter
    only counts training forwards, so evaluating never changes the mask; it is a buffer, so a
    restored checkpoint continues where training stopped. A refreshed mask is written to the record
    at the next eval forward (AMCT rewrites the record file on every refresh, inside training).
    """

    def __init__(
        self,
        layer_name: str,
        weight: torch.Tensor,
        axis: int,
        update_freq: int = 0,
        record: RecordFile | None = None,
        mask: torch.Tensor | None = None,
    ):
        super().__init__()
        self.layer_name = layer_name
        self.axis = axis
        self.update_freq = update_freq
        self.record = record
        if mask is None:
            mask = m4n2_mask(weight, axis)
        elif tuple(mask.shape) != tuple(weight.shape):
            raise ValueError(
                f"selective mask of {layer_name} has shape {list(mask.shape)}, the weight {list(weight.shape)}"
            )
        self.register_buffer("mask", mask.to(device=weight.device, dtype=torch.bool))
        self.register_buffer("prune_cur_batch", torch.zeros((), dtype=torch.int64))
        self._record_pending = False

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        if self.training:
            batch = int(self.prune_cur_batch)
            if batch == 0 or (self.update_freq > 0 and batch % self.update_freq == 0):
                new = m4n2_mask(weight, self.axis)
                if not torch.equal(new, self.mask):
                    self.mask.copy_(new)
                    self._record_pending = True
            self.prune_cur_batch += 1
        elif self._record_pending:
            self.flush_record()
        return weight * self.mask  # the mask gets no gradient; W's gradient is g ⊙ mask

    def flush_record(self) -> None:
        if self.record is not None:
            update_selective_records(self.record, {self.layer_name: self.mask})
        self._record_pending = False

    def extra_repr(self) -> str:
        return f"M4N2, axis={self.axis}, update_freq={self.update_freq}"


class MaskedWeightQuantizer(WeightQuantizer):
    """Selective mask, then the layer's weight quantiser: prune before quantise (docs/spec/engine.md §4.5)."""

    def __init__(self, selective: SelectiveMask, quant: WeightQuantizer):
        super().__init__()
        self.selective = selective
        self.quant = quant

    def forward(self, weight: torch.Tensor, transpose_groups: int | None = None) -> torch.Tensor:
        return self.quant(self.selective(weight), transpose_groups)

    def weight_to_quantize(self, weight: torch.Tensor) -> torch.Tensor:
        """W ⊙ mask without counting a batch: what the eval (= deploy) layer is built from."""
        return self.quant.weight_to_quantize(weight * self.selective.mask)

    @property
    def bits(self) -> int:
        return self.quant.bits

    @property
    def channel_wise(self) -> bool:
        return self.quant.channel_wise

    # AMCT's attribute names, which user code may read
    @property
    def wts_scales(self) -> torch.Tensor:
        return self.quant.wts_scales

    @property
    def wts_offsets(self) -> torch.Tensor:
        return self.quant.wts_offsets

    def scale_offset(self):
        return self.quant.scale_offset()


def attach_selective_mask(
    model: nn.Module, name: str, update_freq: int, record: RecordFile | None, mask: torch.Tensor | None = None
) -> SelectiveMask:
    """Mask the weight of layer ``name`` (a float layer or a QuantRetrainLayer) of ``model``."""
    target = model.get_submodule(name)
    if isinstance(target, QuantRetrainLayer):
        layer = target.layer
        selective = SelectiveMask(name, layer.weight, cin_axis(layer), update_freq, record, mask)
        target.weight_quant = MaskedWeightQuantizer(selective, target.weight_quant)
        return selective
    selective = SelectiveMask(name, target.weight, cin_axis(target), update_freq, record, mask)
    # unsafe: registering must not run the mask (a training-mode call counts a batch)
    parametrize.register_parametrization(target, "weight", selective, unsafe=True)
    return selective


def selective_masks(model: nn.Module) -> dict[str, SelectiveMask]:
    return {m.layer_name: m for m in model.modules() if isinstance(m, SelectiveMask)}


def bake_selective_masks(model: nn.Module) -> None:
    """W ← W ⊙ mask and remove the masking (docs/spec/engine.md §4.5 "Save"); ``model`` should be a copy in eval
    mode."""
    for module in list(model.modules()):
        if isinstance(module, QuantRetrainLayer) and isinstance(module.weight_quant, MaskedWeightQuantizer):
            with torch.no_grad():
                module.layer.weight.mul_(module.weight_quant.selective.mask)
            module.weight_quant = module.weight_quant.quant
        elif parametrize.is_parametrized(module, "weight") and any(
            isinstance(p, SelectiveMask) for p in module.parametrizations["weight"]
        ):
            _bake_parametrized(module)


def _bake_parametrized(module: nn.Module) -> None:
    """Replace the masked ``weight`` parametrization by a plain Parameter W ⊙ mask.

    ``remove_parametrizations`` cannot be used on a deep copy: it deletes the ``weight`` property from
    the injected ``Parametrized<Layer>`` class, which the copy shares with the original model.
    """
    plist = module.parametrizations["weight"]
    if len(plist) != 1 or len(module.parametrizations) != 1:  # the user's own parametrizations too
        parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
        return
    original = plist.original
    weight = original.detach() * plist[0].mask
    del module._modules["parametrizations"]
    module.__class__ = type(module).__bases__[0]  # parametrize injected Parametrized<Layer>(Layer)
    module.weight = nn.Parameter(weight, requires_grad=original.requires_grad)
