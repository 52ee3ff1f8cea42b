"""IFMR clip search (docs/spec/engine.md §4.3) against a brute-force numpy reference."""

import numpy as np
import pytest
import torch

from amct_engine.quant import ifmr
from amct_engine.quant.ifmr import IfmrObserver, ifmr_search, search_ratios

FLT_EPSILON = 1.192092896e-7


def reference_ifmr(data, bits, with_offset=False, max_pct=0.999999, min_pct=0.999999):
    """docs/spec/engine.md §4.3 written out in float64 numpy: returns (scale, offset, clip_max, clip_min)."""
    x = np.asarray(data, dtype=np.float64).reshape(-1)
    length = x.size
    max_index = 1 if 1 - max_pct < FLT_EPSILON else length - int(max_pct * length)
    min_index = 1 if 1 - min_pct < FLT_EPSILON else length - int(min_pct * length)
    ordered = np.sort(x)
    max0 = max(ordered[length - max_index], 0.0)
    min0 = min(ordered[min_index - 1], 0.0)
    best_loss, best_scale = np.inf, None
    for k in range(60):
        ratio = 0.7 + 0.01 * k
        if with_offset:
            top, low = ratio * max0, min0
            scale = (top - min0) / (2**bits - 1)
        else:
            top = ratio * max(abs(max0), abs(min0))
            low = -top
            scale = top / (2 ** (bits - 1) if abs(max0) < abs(min0) else 2 ** (bits - 1) - 1)
        scale = 1.0 if scale < FLT_EPSILON else scale
        loss = np.mean((np.round(np.clip(x, low, top) / scale) * scale - x) ** 2)
        if loss < best_loss:  # strict: the first minimum wins
            best_loss, best_scale = loss, scale
    offset = -round(min0 / best_scale) - 2 ** (bits - 1) if with_offset else 0
    clip_max = (2 ** (bits - 1) - 1 - offset) * best_scale
    clip_min = -(2 ** (bits - 1) + offset) * best_scale
    return best_scale, offset, clip_max, clip_min


def assert_matches_reference(result, expected):
    scale, offset, clip_max, clip_min = expected
    assert result.scale.item() == pytest.approx(scale, rel=1e-5)
    assert result.offset.item() == offset
    assert result.clip_max.item() == pytest.approx(clip_max, rel=1e-5)
    assert result.clip_min.item() == pytest.approx(clip_min, rel=1e-5)


def test_search_has_60_candidates_from_0_7_to_1_29():
    ratios = search_ratios(0.7, 1.3, 0.01, "cpu")
    assert ratios.numel() == 60
    assert ratios[0].item() == pytest.approx(0.7)
    assert ratios[-1].item() == pytest.approx(1.29)


@pytest.mark.parametrize("bits", [4, 8, 16])
def test_symmetric_search_matches_reference(bits):
    data = torch.randn(5000, generator=torch.Generator().manual_seed(bits))
    result = ifmr_search(data, bits)
    assert_matches_reference(result, reference_ifmr(data.numpy(), bits))
    assert result.clip_max.item() == pytest.approx((2 ** (bits - 1) - 1) * result.scale.item())
    assert result.clip_min.item() == pytest.approx(-(2 ** (bits - 1)) * result.scale.item())


def test_symmetric_search_divides_by_128_when_the_negative_side_dominates():
    data = torch.cat([torch.rand(3000), -3 * torch.rand(3000)])  # |min| ~ 3 > |max| ~ 1
    result = ifmr_search(data, 8)
    assert_matches_reference(result, reference_ifmr(data.numpy(), 8))
    # With 6000 values the percentile index is 1, so the clip is r * |min(data)| and s = clip / 128.
    ratio = result.scale.item() * 128 / abs(data.min().item())
    assert 0.7 - 1e-6 <= ratio <= 1.29 + 1e-6
    assert abs(ratio * 100 - round(ratio * 100)) < 1e-3


@pytest.mark.parametrize("bits", [4, 8])
def test_asymmetric_search_matches_reference(bits):
    data = torch.cat([torch.rand(4000) * 2.0, -0.5 * torch.rand(1000)])
    result = ifmr_search(data, bits, with_offset=True)
    assert_matches_reference(result, reference_ifmr(data.numpy(), bits, with_offset=True))


def test_percentile_init_ignores_a_lone_outlier_with_default_percentiles():
    # Smallest L with max_index = L - int(0.999999 * L) = 2: the 2nd largest value seeds the search.
    data = torch.randn(1_000_001, generator=torch.Generator().manual_seed(0))
    data[123] = 1000.0
    result = ifmr_search(data, 8)
    assert_matches_reference(result, reference_ifmr(data.numpy(), 8))
    assert result.clip_max.item() < 10.0


def test_percentile_choice_changes_the_clip():
    data = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    data[:10] = 100.0  # ten outliers
    kept = ifmr_search(data, 8, max_percentile=1.0, min_percentile=1.0)
    dropped = ifmr_search(data, 8, max_percentile=0.98, min_percentile=0.98)
    assert_matches_reference(kept, reference_ifmr(data.numpy(), 8, max_pct=1.0, min_pct=1.0))
    assert_matches_reference(dropped, reference_ifmr(data.numpy(), 8, max_pct=0.98, min_pct=0.98))
    assert kept.clip_max.item() > 60.0  # seeded by the outliers: at least 0.7 * 100 * 127/128
    assert dropped.clip_max.item() < 5.0


def test_all_zero_data_falls_back_to_scale_one():
    result = ifmr_search(torch.zeros(100), 8)
    assert result.scale.item() == 1.0
    assert (result.clip_max.item(), result.clip_min.item()) == (127.0, -128.0)


def test_candidate_chunking_does_not_change_the_result(monkeypatch):
    data = torch.randn(3001, generator=torch.Generator().manual_seed(2))
    whole = ifmr_search(data, 8)
    monkeypatch.setattr(ifmr, "_CHUNK_ELEMENTS", 7000)  # two candidates per chunk
    chunked = ifmr_search(data, 8)
    assert chunked == whole


def test_float16_data_is_searched_in_float32():
    data = torch.randn(2000, generator=torch.Generator().manual_seed(3)).half()
    result = ifmr_search(data, 8)
    assert result.scale.dtype == torch.float32
    assert_matches_reference(result, reference_ifmr(data.float().numpy(), 8))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_percentile": 0.0}, ValueError, "max_percentile"),
        ({"min_percentile": 1.5}, ValueError, "min_percentile"),
        ({"search_start": 1.3, "search_end": 0.7}, ValueError, "search range"),
        ({"search_step": 0.0}, ValueError, "search range"),
    ],
)
def test_search_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        ifmr_search(torch.randn(10), 8, **kwargs)


def test_search_rejects_empty_and_non_finite_data():
    with pytest.raises(ValueError, match="empty"):
        ifmr_search(torch.zeros(0), 8)
    with pytest.raises(RuntimeError, match="inf or nan"):
        ifmr_search(torch.tensor([1.0, float("nan")]), 8)


def test_observer_searches_once_over_all_batch_num_batches():
    batches = [torch.randn(4, 50, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    observer = IfmrObserver(bits=8, batch_num=3)
    assert observer(batches[0]) is False
    assert observer(batches[1]) is False
    assert (observer.done, observer.result, observer.batches_seen) == (False, None, 2)
    assert observer(batches[2]) is True
    assert observer.result == ifmr_search(torch.cat([b.reshape(-1) for b in batches]), 8)
    first = observer.result
    assert observer(100 * torch.randn(4, 50)) is True  # later batches are ignored
    assert observer.result is first


def test_observer_keeps_its_own_copy_of_earlier_batches():
    batch = torch.randn(200, generator=torch.Generator().manual_seed(4))
    expected = ifmr_search(torch.cat([batch, batch]), 8)
    observer = IfmrObserver(bits=8, batch_num=2)
    observer(batch)
    original = batch.clone()
    batch.mul_(50.0)  # the model reuses the tensor in place after the forward
    observer(original)
    assert observer.result == expected


def test_observer_rejects_bad_batch_num():
    with pytest.raises(ValueError, match="batch_num"):
        IfmrObserver(bits=8, batch_num=0)


@pytest.mark.parametrize("k", [1, 2, 7, 300])
def test_the_percentile_selection_over_rows_finds_topks_value(k):
    """The percentile's k-th extreme value is selected among the rows with the most extreme maxima: it must be
    topk's value, also when the extremes repeat, share a row, fill whole rows (a ReLU's zeros) or sit in the tail."""
    gen = torch.Generator().manual_seed(k)
    shared_row = torch.rand(100_000, generator=gen)
    shared_row[: k + 3] = 7.0
    for x in (
        torch.randn(200_000, generator=gen),
        torch.relu(torch.randn(200_000, generator=gen)),
        shared_row,
        torch.cat([torch.rand(100_000, generator=gen), torch.full((2 * k,), 5.0), torch.full((k,), -5.0)]),
        torch.cat([torch.rand(100_000, generator=gen), torch.tensor([9.0, -9.0, 8.0])]),
    ):
        for largest in (True, False):
            expected = torch.topk(x, k, largest=largest).values[-1]
            assert ifmr._kth_from_end(x, k, largest) == expected


@pytest.mark.parametrize("bins", [7, 1000, 65536])
def test_the_histogram_counts_every_bin_as_histc_does(bins):
    """ifmr._histogram replaces torch.histc for speed: the same bin for every value, edges and maximum included."""
    g = torch.Generator().manual_seed(3)
    for x in (
        torch.relu(torch.randn(200_003, generator=g)),
        torch.randn(50_000, generator=g) * 3 + 1,
        torch.rand(30_000, generator=g) ** 3 * 7 - 2,
        torch.randn(5_000, generator=g) * 1e-3,
        torch.tensor([0.0, 1.0, 1.0, 2.0]),
    ):
        lo, hi = torch.aminmax(x)
        torch.testing.assert_close(
            ifmr._histogram(x, bins, lo, hi), torch.histc(x, bins, float(lo), float(hi)), rtol=0, atol=0
        )
