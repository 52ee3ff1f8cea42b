"""ARQ and ULQ weight quantisers (docs/spec/engine.md §4.2), plus a CPU/CUDA agreement check for every quantiser."""

import math

import numpy as np
import pytest
import torch

from amct_engine.quant.arq import ArqWeightQuantizer
from amct_engine.quant.ulq_act import UlqActQuantizer
from amct_engine.quant.ulq_weight import UlqWeightQuantizer


def hand_weight():
    return torch.tensor(
        [
            [0.5, -1.27, 0.304, 1.27],  # |min| == |max|: 1.27/127 = 0.01
            [-2.56, 1.0, 0.0, 0.5],  # |min| > |max|: 2.56/128 = 0.02
            [0.0, 0.0, 0.0, 0.0],  # scale 0 -> 1 (process_scale)
        ]
    )


def test_arq_per_channel_scales_on_a_hand_made_weight():
    quantizer = ArqWeightQuantizer(bits=8, channel_wise=True)
    out = quantizer(hand_weight())
    torch.testing.assert_close(quantizer.wts_scales, torch.tensor([0.01, 0.02, 1.0]))
    assert quantizer.wts_offsets.tolist() == [0, 0, 0]
    expected = hand_weight()
    expected[0, 2] = 0.30  # 30.4 -> 30
    torch.testing.assert_close(out, expected)


def test_arq_per_tensor_scale():
    quantizer = ArqWeightQuantizer(bits=8, channel_wise=False)
    quantizer(hand_weight())
    assert quantizer.wts_scales.shape == (1,)
    assert quantizer.wts_scales.item() == pytest.approx(0.02)


@pytest.mark.parametrize(("bits", "row", "scale"), [(4, [0.7, -0.3], 0.1), (16, [3.2767, -1.0], 1e-4)])
def test_arq_int4_and_int16_scales(bits, row, scale):
    quantizer = ArqWeightQuantizer(bits=bits)
    quantizer(torch.tensor([row]))
    assert quantizer.wts_scales.item() == pytest.approx(scale, rel=1e-6)


def test_arq_gradient_is_straight_through():
    weight = torch.randn(4, 3, 3, 3, requires_grad=True)
    g = torch.randn(4, 3, 3, 3)
    ArqWeightQuantizer(bits=4)(weight).backward(g)
    assert torch.equal(weight.grad, g)


def test_arq_recomputes_the_scale_from_the_current_weight():
    quantizer = ArqWeightQuantizer(bits=8, channel_wise=False)
    quantizer(torch.tensor([1.27, -0.5]))
    quantizer(torch.tensor([2.54, -0.5]))
    assert quantizer.wts_scales.item() == pytest.approx(0.02)


def test_arq_conv_transpose_weights_are_scaled_per_output_channel():
    # ConvTranspose2d(4 -> 6, groups=2): weight [Cin=4, Cout/g=3, 2, 2]; output o = 3*gi + j reads
    # weight[2*gi:2*gi+2, j].
    weight = torch.randn(4, 3, 2, 2, generator=torch.Generator().manual_seed(0))
    quantizer = ArqWeightQuantizer(bits=8)
    out = quantizer(weight, transpose_groups=2)
    expected_scales, expected = [], torch.empty_like(weight)
    for o in range(6):
        gi, j = divmod(o, 3)
        block = weight[2 * gi : 2 * gi + 2, j].numpy().astype(np.float64)
        scope = 128 if abs(block.min()) > abs(block.max()) else 127
        scale = np.abs(block).max() / scope
        expected_scales.append(scale)
        expected[2 * gi : 2 * gi + 2, j] = torch.from_numpy(np.clip(np.round(block / scale), -128, 127) * scale)
    np.testing.assert_allclose(quantizer.wts_scales.numpy(), expected_scales, rtol=1e-6)
    assert out.shape == weight.shape
    torch.testing.assert_close(out, expected)


def test_arq_buffers_are_sized_by_num_channels_or_by_load_state_dict():
    assert ArqWeightQuantizer(bits=8, num_channels=5).wts_scales.shape == (5,)
    source = ArqWeightQuantizer(bits=8)
    source(torch.randn(7, 2))
    restored = ArqWeightQuantizer(bits=8)
    restored.load_state_dict(source.state_dict())
    torch.testing.assert_close(restored.wts_scales, source.wts_scales)
    assert restored.wts_offsets.dtype == torch.int32


def test_ulq_weight_arq_init_uses_max_abs_over_qp():
    weight = torch.tensor([[0.7, -0.35], [-1.4, 0.2]])
    quantizer = UlqWeightQuantizer(bits=4, channel_wise=True)
    quantizer(weight)
    torch.testing.assert_close(quantizer.wts_scales.detach(), torch.tensor([0.1, 0.2]))
    assert quantizer.wts_offsets.tolist() == [0, 0]
    per_tensor = UlqWeightQuantizer(bits=8, channel_wise=False)
    per_tensor(weight)
    assert per_tensor.wts_scales.item() == pytest.approx(1.4 / 127)


def ulq_weight_with_scales(scales, bits=4, channel_wise=True):
    quantizer = UlqWeightQuantizer(bits=bits, channel_wise=channel_wise, num_channels=len(scales))
    quantizer(torch.ones(len(scales), 3))  # ARQ init, then overwrite with the scales under test
    with torch.no_grad():
        quantizer.wts_scales.copy_(torch.tensor(scales))
    return quantizer


def test_ulq_weight_forward_and_lsq_gradient_by_hand():
    quantizer = ulq_weight_with_scales([0.1, 0.2])
    weight = torch.tensor([[0.23, -0.95, 0.71], [0.54, -0.34, 1.0]], requires_grad=True)
    g = torch.tensor([[1.0, 2.0, 3.0], [2.0, 1.0, 1.0]])
    out = quantizer(weight)
    # W/s = [[2.3, -9.5, 7.1], [2.7, -1.7, 5]] -> clamp(round) = [[2, -8, 7], [3, -2, 5]]
    torch.testing.assert_close(out, torch.tensor([[0.2, -0.8, 0.7], [0.6, -0.4, 1.0]]))
    out.backward(g)
    # row 0: (-0.3*1 + Qn*2 + Qp*3) / sqrt(3*7); row 1: (0.3*2 - 0.3*1 + 0) / sqrt(3*7)
    expected = torch.tensor([4.7, 0.3]) / math.sqrt(21)
    torch.testing.assert_close(quantizer.wts_scales.grad, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(weight.grad, g)  # plain STE, clipped elements included


def test_ulq_weight_per_tensor_gradient_scales_by_all_elements():
    quantizer = ulq_weight_with_scales([0.1], channel_wise=False)
    weight = torch.tensor([[0.23, -0.95, 0.71], [0.54, -0.34, 0.4]], requires_grad=True)
    g = torch.tensor([[1.0, 2.0, 3.0], [2.0, 1.0, 1.0]])
    quantizer(weight).backward(g)
    # W/s = [[2.3, -9.5, 7.1], [5.4, -3.4, 4]]: -0.3 + 2*(-8) + 3*7 + 2*(-0.4) + 1*0.4 + 0
    expected = (-0.3 - 16 + 21 - 0.8 + 0.4) / math.sqrt(6 * 7)
    assert quantizer.wts_scales.grad.shape == (1,)
    assert quantizer.wts_scales.grad.item() == pytest.approx(expected, rel=1e-5)


def test_ulq_weight_keeps_the_scale_positive():
    quantizer = ulq_weight_with_scales([-0.5, 0.0])
    out = quantizer(torch.randn(2, 3))
    assert torch.isfinite(out).all()
    assert (quantizer.scale_offset()[0] > 0).all()


def test_ulq_weight_scale_stepped_through_zero_quantises_with_its_magnitude():
    """Adam can push a learnt scale below zero: the forward, the record and the gradient use |s|."""
    weight = torch.tensor([[0.23, -0.95, 0.71], [0.54, -0.34, 1.0]])
    g = torch.tensor([[1.0, 2.0, 3.0], [2.0, 1.0, 1.0]])
    positive, negative = ulq_weight_with_scales([0.1, 0.2]), ulq_weight_with_scales([-0.1, 0.2])
    outs = []
    for quantizer in (positive, negative):
        w = weight.clone().requires_grad_(True)
        out = quantizer(w)
        out.backward(g)
        outs.append(out.detach())
    torch.testing.assert_close(outs[1], outs[0])
    torch.testing.assert_close(negative.scale_offset()[0], torch.tensor([0.1, 0.2]))
    # d|s|/ds = -1 for the negative channel: its gradient flips, the other is unchanged.
    torch.testing.assert_close(negative.wts_scales.grad, positive.wts_scales.grad * torch.tensor([-1.0, 1.0]))


def test_ulq_weight_is_initialised_only_once_and_after_restore_not_at_all():
    quantizer = UlqWeightQuantizer(bits=8, channel_wise=True)
    quantizer(torch.full((2, 3), 1.27))
    quantizer(torch.full((2, 3), 12.7))
    torch.testing.assert_close(quantizer.wts_scales.detach(), torch.tensor([0.01, 0.01]))
    restored = UlqWeightQuantizer(bits=8, channel_wise=True)
    restored.load_state_dict(quantizer.state_dict())
    assert restored.initialized
    restored(torch.full((2, 3), 12.7))
    torch.testing.assert_close(restored.wts_scales.detach(), torch.tensor([0.01, 0.01]))


def test_ulq_weight_lazy_per_channel_scale_stays_the_optimised_parameter():
    quantizer = UlqWeightQuantizer(bits=8, channel_wise=True)
    optimizer = torch.optim.SGD(quantizer.parameters(), lr=0.1)
    weight = torch.randn(4, 5)
    quantizer(weight).square().sum().backward()
    before = quantizer.wts_scales.detach().clone()
    optimizer.step()
    assert quantizer.wts_scales.shape == (4,)
    assert not torch.equal(quantizer.wts_scales.detach(), before)


def test_ulq_weight_handles_conv_transpose_layout():
    weight = torch.randn(4, 3, 2, 2, requires_grad=True)
    quantizer = UlqWeightQuantizer(bits=4, channel_wise=True)
    out = quantizer(weight, transpose_groups=2)
    assert out.shape == weight.shape and quantizer.wts_scales.shape == (6,)
    out.sum().backward()
    assert weight.grad.shape == weight.shape and quantizer.wts_scales.grad.shape == (6,)


def test_int4_ulq_weights_train_a_least_squares_problem():
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(256, 16, generator=gen)
    target_weight = torch.randn(8, 16, generator=gen)
    targets = inputs @ target_weight.T
    weight = torch.nn.Parameter(0.1 * torch.randn(8, 16, generator=gen))
    quantizer = UlqWeightQuantizer(bits=4, channel_wise=True, num_channels=8)
    optimizer = torch.optim.Adam([weight, *quantizer.parameters()], lr=0.02)
    losses = []
    for _ in range(300):
        loss = (inputs @ quantizer(weight).T - targets).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.05 * losses[0]
    # Raw scales may have stepped through zero (the forward uses |s|); none collapsed to nothing.
    assert torch.isfinite(quantizer.wts_scales).all()
    assert (quantizer.scale_offset()[0] > 0.05).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_every_quantizer_matches_cpu_on_cuda():
    gen = torch.Generator().manual_seed(0)
    activation = torch.randn(4, 8, 5, 5, generator=gen)
    weight = torch.randn(6, 8, 3, 3, generator=gen)
    transposed = torch.randn(8, 3, 3, 3, generator=gen)
    cases = [
        (lambda: UlqActQuantizer(bits=8, batch_num=1), activation, {}),
        (lambda: UlqActQuantizer(bits=4, clip_max=1.5, clip_min=-1.0, fixed_min=True), activation, {}),
        (lambda: ArqWeightQuantizer(bits=8), weight, {}),
        (lambda: ArqWeightQuantizer(bits=4, channel_wise=False), weight, {}),
        (lambda: UlqWeightQuantizer(bits=4), weight, {}),
        (lambda: UlqWeightQuantizer(bits=8), transposed, {"transpose_groups": 2}),
    ]
    for make, data, kwargs in cases:
        results = []
        for device in ("cpu", "cuda"):
            quantizer = make().to(device)
            x = data.to(device).requires_grad_(True)
            quantizer(x, **kwargs)  # calibration / initialisation step
            out = quantizer(x, **kwargs)
            out.backward(torch.ones_like(out))
            params = [p.grad.cpu() for p in quantizer.parameters() if p.grad is not None]
            buffers = [b.cpu() for b in quantizer.buffers()]
            assert all(b.device.type == device for b in quantizer.buffers())
            results.append((out.detach().cpu(), x.grad.cpu(), params, buffers))
        (cpu_out, cpu_gx, cpu_params, cpu_buffers), (gpu_out, gpu_gx, gpu_params, gpu_buffers) = results
        torch.testing.assert_close(gpu_out, cpu_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(gpu_gx, cpu_gx)
        for cpu_value, gpu_value in zip(cpu_params + cpu_buffers, gpu_params + gpu_buffers, strict=True):
            torch.testing.assert_close(gpu_value, cpu_value, atol=1e-4, rtol=1e-4, equal_nan=True)
