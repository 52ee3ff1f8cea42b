"""4-of-2 selective masks (docs/spec/engine.md §4.5, §7.4 test_selective_mask_gen), update_freq, record packing
(docs/spec/engine.md §2.3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from amct_engine.prune.records import pack_mask, selective_prune_record, unpack_mask
from amct_engine.prune.selective import SelectiveMask, bake_selective_masks, m4n2_mask


def _oracle(weight: torch.Tensor, dim: int) -> torch.Tensor:
    """AMCT's SelectiveMaskFaker: zero-pad Cin to a multiple of 4, zero the 2 smallest |w| of each 4."""
    cin = weight.shape[dim]
    if cin < 4:
        return torch.ones_like(weight)
    groups = math.ceil(cin / 4)
    pad_shape = weight.shape[:dim] + (groups * 4 - cin,) + weight.shape[dim + 1 :]
    padded = torch.cat((weight.abs(), torch.zeros(pad_shape)), dim=dim)
    grouped = padded.reshape(weight.shape[:dim] + (groups, 4) + weight.shape[dim + 1 :])
    idx = grouped.topk(k=2, dim=dim + 1, largest=False)[1]
    mask = torch.ones_like(grouped).scatter_(dim + 1, idx, 0.0)
    return mask.reshape(weight.shape[:dim] + (-1,) + weight.shape[dim + 1 :]).split(cin, dim=dim)[0]


@pytest.mark.parametrize(
    ("shape", "axis"),
    [
        ([2, 4, 3, 3], 0),
        ([160, 4, 3, 3], 1),
        ([160, 7, 3, 3], 1),
        ([160, 3, 3, 3], 0),
        ([1, 4, 3, 3], 1),
        ([16, 6, 3, 3], 1),
        ([1, 5, 3, 3], 1),
    ],
)
def test_mask_matches_the_oracle(shape, axis):
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
    assert torch.equal(m4n2_mask(weight, axis).float(), _oracle(weight, axis))


def test_exactly_two_of_every_four_along_cin_are_kept():
    weight = torch.randn(8, 12, 3, 3, generator=torch.Generator().manual_seed(0))
    mask = m4n2_mask(weight, 1)
    kept = mask.reshape(8, 3, 4, 3, 3).sum(dim=2)
    assert torch.all(kept == 2)
    # the kept two are the two largest |w| of their group
    grouped = weight.abs().reshape(8, 3, 4, 3, 3)
    kept_min = torch.where(mask.reshape(grouped.shape), grouped, torch.inf).amin(dim=2)
    dropped_max = torch.where(mask.reshape(grouped.shape), -torch.inf, grouped).amax(dim=2)
    assert torch.all(kept_min >= dropped_max)


def test_linear_and_conv_transpose_group_along_their_cin_axis():
    linear = torch.randn(3, 8)
    assert torch.all(m4n2_mask(linear, 1).reshape(3, 2, 4).sum(-1) == 2)
    deconv = torch.randn(8, 2, 3, 3)  # ConvTranspose2d: [Cin, Cout/g, kh, kw]
    assert torch.all(m4n2_mask(deconv, 0).reshape(2, 4, 2, 3, 3).sum(1) == 2)


def test_tail_group_counts_its_padding_as_zeros():
    weight = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])  # Cin 6: groups [1..4], [5, 6, pad, pad]
    assert m4n2_mask(weight, 1).tolist() == [[False, False, True, True, True, True]]


def _mask_module(update_freq: int) -> tuple[nn.Parameter, SelectiveMask]:
    weight = nn.Parameter(torch.tensor([[4.0, 3.0, 2.0, 1.0]]))
    return weight, SelectiveMask("fc", weight, 1, update_freq)


def _swap_order(weight: nn.Parameter) -> None:
    with torch.no_grad():
        weight.copy_(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))


def test_update_freq_zero_keeps_the_first_batch_mask():
    weight, mask = _mask_module(0)
    mask.train()
    mask(weight)
    _swap_order(weight)
    for _ in range(3):
        out = mask(weight)
    assert mask.mask.tolist() == [[True, True, False, False]]
    assert out.tolist() == [[1.0, 2.0, 0.0, 0.0]]


def test_update_freq_k_refreshes_every_k_training_batches():
    weight, mask = _mask_module(2)
    mask.train()
    mask(weight)  # batch 0: refresh
    _swap_order(weight)
    mask(weight)  # batch 1: kept
    assert mask.mask.tolist() == [[True, True, False, False]]
    mask(weight)  # batch 2: refresh
    assert mask.mask.tolist() == [[False, False, True, True]]
    assert int(mask.prune_cur_batch) == 3


def test_eval_forwards_neither_count_nor_refresh():
    weight, mask = _mask_module(1)
    mask.eval()
    _swap_order(weight)
    for _ in range(3):
        mask(weight)
    assert int(mask.prune_cur_batch) == 0
    assert mask.mask.tolist() == [[True, True, False, False]]


def test_masked_weight_gets_the_masked_gradient():
    weight, mask = _mask_module(0)
    mask.train()
    mask(weight).sum().backward()
    assert weight.grad.tolist() == [[1.0, 1.0, 0.0, 0.0]]


def test_bake_writes_the_mask_into_a_parametrized_layer():
    layer = nn.Linear(8, 2)
    mask = SelectiveMask("fc", layer.weight, 1)
    torch.nn.utils.parametrize.register_parametrization(layer, "weight", mask, unsafe=True)
    expected = layer.weight.detach().clone()
    bake_selective_masks(layer.eval())
    assert type(layer) is nn.Linear
    assert torch.equal(layer.weight, expected)
    assert int((layer.weight == 0).sum()) == 8


def test_mask_packs_big_endian_into_int64_words():
    mask = torch.tensor([1, 0, 0, 0, 0, 0, 0, 1, 1], dtype=torch.bool)  # bytes 0x81, 0x80, then padding
    words = pack_mask(mask)
    assert words == [int(np.frombuffer(bytes([0x81, 0x80, 0, 0, 0, 0, 0, 0]), "<i8")[0])]
    assert torch.equal(unpack_mask(words, [9]), mask)


def test_selective_record_round_trips_the_mask():
    mask = m4n2_mask(torch.randn(5, 7, 3, 3, generator=torch.Generator().manual_seed(1)), 1)
    record = selective_prune_record("layer1.conv", mask)
    attrs = {a.name: a for a in record.selective_prune.attr}
    assert list(attrs["mask_shape"].ints) == [5, 7, 3, 3]
    assert len(attrs["selective_mask"].ints) == math.ceil(math.ceil(mask.numel() / 8) / 8)
    assert torch.equal(unpack_mask(attrs["selective_mask"].ints, attrs["mask_shape"].ints), mask)
