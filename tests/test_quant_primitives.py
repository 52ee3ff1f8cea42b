"""Quantisation primitives (docs/spec/engine.md §4.0) against hand-computed values."""

import pytest
import torch

from amct_engine.quant.primitives import (
    asymmetric_scale_offset,
    check_quantizable,
    fake_quantize,
    from_cout_major,
    process_scale,
    quant_range,
    symmetric_scale,
    to_cout_major,
)


@pytest.mark.parametrize(("bits", "expected"), [(4, (-8, 7)), (8, (-128, 127)), (16, (-32768, 32767))])
def test_quant_range_of_supported_widths(bits, expected):
    assert quant_range(bits) == expected


@pytest.mark.parametrize("bits", [2, 7, 32])
def test_quant_range_rejects_other_widths(bits):
    with pytest.raises(ValueError, match="bit width"):
        quant_range(bits)


def test_symmetric_scale_uses_127_unless_the_negative_extreme_dominates():
    assert symmetric_scale(1.27, -0.5, 8).item() == pytest.approx(0.01)
    assert symmetric_scale(0.5, -1.28, 8).item() == pytest.approx(0.01)  # 1.28 / 128
    assert symmetric_scale(1.0, -1.0, 8).item() == pytest.approx(1.0 / 127)  # tie: Qp


def test_symmetric_scale_is_elementwise_for_per_channel_ranges():
    scale = symmetric_scale(torch.tensor([1.27, 0.5, 0.0]), torch.tensor([-0.5, -1.28, 0.0]), 8)
    torch.testing.assert_close(scale, torch.tensor([0.01, 0.01, 0.0]))


@pytest.mark.parametrize(
    ("bits", "max_val", "min_val", "expected"),
    [(4, 0.7, -0.3, 0.1), (4, 0.3, -0.8, 0.1), (16, 3.2767, 0.0, 1e-4), (16, 1.0, -3.2768, 1e-4)],
)
def test_symmetric_scale_int4_and_int16(bits, max_val, min_val, expected):
    assert symmetric_scale(max_val, min_val, bits).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    ("bits", "max_val", "min_val", "scale", "offset"),
    [
        (8, 2.55, 0.0, 0.01, -128),  # all-positive range: zero at Qn
        (8, 1.0, -1.55, 0.01, 27),  # -128 - (-155)
        (8, -1.0, -2.55, 0.01, 127),  # max clamped up to 0
        (8, 2.55, 0.5, 0.01, -128),  # min clamped down to 0
        (4, 1.2, -0.3, 0.1, -5),  # (1.5)/15, -8 + 3
        (16, 4.0, -2.5535, 1e-4, -7233),  # 6.5535/65535, -32768 + 25535
    ],
)
def test_asymmetric_scale_offset(bits, max_val, min_val, scale, offset):
    got_scale, got_offset = asymmetric_scale_offset(max_val, min_val, bits)
    assert got_scale.item() == pytest.approx(scale, rel=1e-5)
    assert got_offset.dtype == torch.int32
    assert got_offset.item() == offset


def test_asymmetric_offset_rounds_half_to_even():
    # scale = 255/255 = 1, offset = -128 + 2.5 = -125.5 -> -126
    _, offset = asymmetric_scale_offset(252.5, -2.5, 8)
    assert offset.item() == -126


def test_asymmetric_empty_range_gives_zero_scale_and_offset_qn():
    scale, offset = asymmetric_scale_offset(torch.tensor([0.0, 0.0]), torch.tensor([0.0, 0.0]), 4)
    assert scale.tolist() == [0.0, 0.0]
    assert offset.tolist() == [-8, -8]


def test_process_scale_replaces_tiny_scales_and_resets_asymmetric_offsets():
    scale = torch.tensor([0.0, 1e-8, -0.5, 0.5])
    offset = torch.tensor([3, 4, 5, 6], dtype=torch.int32)
    new_scale, new_offset = process_scale(scale, offset, 8, asymmetric=True)
    assert new_scale.tolist() == [1.0, 1.0, 1.0, 0.5]
    assert new_offset.tolist() == [-128, -128, -128, 6]
    _, int4_offset = process_scale(scale, offset, 4, asymmetric=True)
    assert int4_offset.tolist() == [-8, -8, -8, 6]


def test_process_scale_keeps_offsets_when_symmetric():
    new_scale, new_offset = process_scale(torch.tensor([0.0, 2.0]), torch.tensor([0, 0]), 8, asymmetric=False)
    assert new_scale.tolist() == [1.0, 2.0]
    assert new_offset.tolist() == [0, 0]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_process_scale_rejects_non_finite_scales(bad):
    with pytest.raises(RuntimeError, match="inf or nan"):
        process_scale(torch.tensor([0.1, bad]), torch.tensor([0, 0]), 8, asymmetric=True)


def test_fake_quantize_rounds_half_to_even_and_saturates_int4():
    x = torch.tensor([-5.0, -1.25, 0.0, 1.25, 0.75, 1.5, 10.0])
    # x/0.5 = [-10, -2.5, 0, 2.5, 1.5, 3, 20] -> round [-10, -2, 0, 2, 2, 3, 20] -> clamp [-8, 7]
    expected = torch.tensor([-4.0, -1.0, 0.0, 1.0, 1.0, 1.5, 3.5])
    torch.testing.assert_close(fake_quantize(x, torch.tensor(0.5), torch.tensor(0), 4), expected)


def test_fake_quantize_with_offset():
    x = torch.tensor([-70.0, 0.0, 58.5, 60.0])
    # x/0.5 + 10 = [-130, 10, 127, 130] -> clamp [-128, 10, 127, 127] -> (q - 10) * 0.5
    expected = torch.tensor([-69.0, 0.0, 58.5, 58.5])
    torch.testing.assert_close(fake_quantize(x, torch.tensor(0.5), torch.tensor(10), 8), expected)


def test_fake_quantize_broadcasts_per_channel_scales_along_axis0():
    x = torch.tensor([[1.0, 0.74, -0.3], [3.0, 5.0, -100.0]])
    expected = torch.tensor([[1.0, 0.5, -0.5], [4.0, 4.0, -100.0]])
    got = fake_quantize(x, torch.tensor([0.5, 2.0]), torch.zeros(2, dtype=torch.int32), 8)
    torch.testing.assert_close(got, expected)


def test_fake_quantize_keeps_float16():
    x = torch.tensor([-5.0, -1.25, 1.25, 10.0], dtype=torch.float16)
    got = fake_quantize(x, torch.tensor(0.5), torch.tensor(0), 4)
    assert got.dtype == torch.float16
    assert got.tolist() == [-4.0, -1.0, 1.0, 3.5]


def test_fake_quantize_int16_is_exact_on_its_grid():
    x = torch.tensor([-3.2768, 0.0001, 3.2767, 5.0])
    got = fake_quantize(x, torch.tensor(1e-4), torch.tensor(0), 16)
    torch.testing.assert_close(got, torch.tensor([-3.2768, 0.0001, 3.2767, 3.2767]))


def test_fake_quantize_rejects_a_scale_of_the_wrong_length():
    with pytest.raises(ValueError, match="expected 1 or 2"):
        fake_quantize(torch.ones(2, 3), torch.ones(3), torch.zeros(3), 8)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.bfloat16])
def test_check_quantizable_rejects_other_dtypes(dtype):
    with pytest.raises(TypeError, match="float32 and float16"):
        check_quantizable(torch.zeros(3, dtype=dtype), "weight")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_check_quantizable_rejects_non_finite_values(bad):
    with pytest.raises(RuntimeError, match="inf or nan"):
        check_quantizable(torch.tensor([1.0, bad], dtype=torch.float16))


@pytest.mark.parametrize(("conv", "kernel"), [(torch.nn.ConvTranspose2d, (2, 2)), (torch.nn.ConvTranspose1d, (3,))])
def test_cout_major_row_is_what_feeds_that_output_channel(conv, kernel):
    layer = conv(4, 6, kernel[0], groups=2, bias=False)
    weight = layer.weight.detach()
    weight_cm = to_cout_major(weight, 2)
    assert weight_cm.shape == (6, 2, *kernel)
    torch.testing.assert_close(from_cout_major(weight_cm, 2, weight.shape), weight)
    x = torch.randn(1, 4, *([5] * len(kernel)))
    for channel in range(6):
        only = torch.zeros_like(weight_cm)
        only[channel] = weight_cm[channel]
        with torch.no_grad():
            layer.weight.copy_(from_cout_major(only, 2, weight.shape))
            out = layer(x)
        others = [c for c in range(6) if c != channel]
        assert out[:, others].abs().max() == 0
        assert out[:, channel].abs().max() > 0
