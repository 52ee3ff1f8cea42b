"""ULQ activation quantiser (docs/spec/engine.md §4.1): forward, clip gradients, guards and IFMR initialisation."""

import math
import weakref

import numpy as np
import pytest
import torch

from amct_engine.quant.ifmr import ifmr_search
from amct_engine.quant.ulq_act import UlqActFunction, UlqActQuantizer


def reference_ulq_grads(x, g, cmax, cmin, bits):
    """docs/spec/engine.md §4.1 backward in float64 numpy: (dL/dx, dL/dcmax, dL/dcmin)."""
    x, g = np.asarray(x, np.float64), np.asarray(g, np.float64)
    levels = 2**bits - 1
    scale = (max(cmax, 0.0) - min(cmin, 0.0)) / levels
    offset = np.round(-(2 ** (bits - 1)) - min(cmin, 0.0) / scale)
    upper = x > scale * (2 ** (bits - 1) - 1 - offset)
    lower = x < scale * (-(2 ** (bits - 1)) - offset)
    t = np.where(upper, cmax, np.where(lower, cmin, x)) / scale
    err = (np.round(t) - t) / levels
    return np.where(upper | lower, 0.0, g), np.sum((err + upper) * g), np.sum((lower - err) * g)


def test_int4_forward_and_gradients_by_hand():
    # clip [-0.5, 1.0], INT4: s = 1.5/15 = 0.1, o = -8 + 5 = -3; inside is [-0.5, 1.0].
    quantizer = UlqActQuantizer(bits=4, clip_max=1.0, clip_min=-0.5)
    x = torch.tensor([-0.8, -0.23, 0.0, 0.37, 0.64, 1.4], requires_grad=True)
    g = torch.tensor([1.0, -1.0, 0.5, 3.0, -2.0, 0.5])
    y = quantizer(x)
    torch.testing.assert_close(y, torch.tensor([-0.5, -0.2, 0.0, 0.4, 0.6, 1.0]))
    y.backward(g)
    # t = [-5, -2.3, 0, 3.7, 6.4, 10], e = (round(t) - t)/15 = [0, .3, 0, .3, -.4, 0]/15
    # dcmax = sum((e + upper) g) = -.02 + .06 + .4*2/15 + .5
    # dcmin = sum((lower - e) g) = 1 + .02 - .06 - .8/15
    torch.testing.assert_close(quantizer.acts_clip_max.grad, torch.tensor(0.54 + 0.8 / 15))
    torch.testing.assert_close(quantizer.acts_clip_min.grad, torch.tensor(0.96 - 0.8 / 15))
    torch.testing.assert_close(x.grad, torch.tensor([0.0, -1.0, 0.5, 3.0, -2.0, 0.0]))
    scale, offset = quantizer.scale_offset()
    assert scale.item() == pytest.approx(0.1)
    assert offset.item() == -3


@pytest.mark.parametrize("bits", [4, 8, 16])
def test_gradients_match_the_spec_formula(bits):
    gen = torch.Generator().manual_seed(bits)
    x = (torch.randn(64, generator=gen) * 2).requires_grad_(True)
    g = torch.randn(64, generator=gen)
    quantizer = UlqActQuantizer(bits=bits, clip_max=2.3, clip_min=-1.7)
    quantizer(x).backward(g)
    gx, gmax, gmin = reference_ulq_grads(x.detach().numpy(), g.numpy(), 2.3, -1.7, bits)
    np.testing.assert_allclose(x.grad.numpy(), gx, atol=1e-6)
    assert quantizer.acts_clip_max.grad.item() == pytest.approx(gmax, abs=1e-4)
    assert quantizer.acts_clip_min.grad.item() == pytest.approx(gmin, abs=1e-4)


def test_fixed_min_forces_the_clip_min_to_zero():
    quantizer = UlqActQuantizer(bits=8, fixed_min=True, clip_max=2.55, clip_min=-1.0)
    x = torch.tensor([-1.0, 0.5, 3.0], requires_grad=True)
    y = quantizer(x)
    assert quantizer.acts_clip_min.item() == 0.0
    assert quantizer.acts_clip_min_pre.item() == 0.0
    scale, offset = quantizer.scale_offset()
    assert scale.item() == pytest.approx(0.01)
    assert offset.item() == -128
    torch.testing.assert_close(y, torch.tensor([0.0, 0.5, 2.55]))
    y.sum().backward()
    assert quantizer.acts_clip_min.grad is None  # the output does not depend on clip_min
    assert quantizer.acts_clip_max.grad is not None


def test_empty_clip_range_reverts_both_clips_to_pre():
    quantizer = UlqActQuantizer(bits=8, clip_max=1.0, clip_min=-1.0)
    with torch.no_grad():
        quantizer.acts_clip_max.fill_(0.3)
        quantizer.acts_clip_min.fill_(0.3)
    quantizer(torch.randn(10))
    assert (quantizer.acts_clip_max.item(), quantizer.acts_clip_min.item()) == (1.0, -1.0)


def test_negative_clip_max_reverts_only_clip_max():
    quantizer = UlqActQuantizer(bits=8, clip_max=1.0, clip_min=-1.0)
    with torch.no_grad():
        quantizer.acts_clip_max.fill_(-0.2)
        quantizer.acts_clip_min.fill_(-2.0)
    quantizer(torch.randn(10))
    assert (quantizer.acts_clip_max.item(), quantizer.acts_clip_min.item()) == (1.0, -2.0)
    assert quantizer.acts_clip_min_pre.item() == -2.0


def test_positive_clip_min_reverts_only_clip_min():
    quantizer = UlqActQuantizer(bits=8, clip_max=1.0, clip_min=-1.0)
    with torch.no_grad():
        quantizer.acts_clip_max.fill_(3.0)
        quantizer.acts_clip_min.fill_(0.5)
    quantizer(torch.randn(10))
    assert (quantizer.acts_clip_max.item(), quantizer.acts_clip_min.item()) == (3.0, -1.0)


def test_ifmr_initialisation_over_two_batches():
    gen = torch.Generator().manual_seed(0)
    first, second = torch.randn(8, 16, generator=gen), torch.randn(8, 16, generator=gen) * 2
    quantizer = UlqActQuantizer(bits=8, batch_num=2)
    assert torch.equal(quantizer(first), first)  # calibration batch: unquantised
    assert not quantizer.calibrated
    assert quantizer.acts_clip_max.item() == first.max().item()
    assert quantizer.acts_clip_min.item() == first.min().item()
    assert math.isnan(quantizer.acts_clip_max_pre.item())

    out = quantizer(second)  # completes IFMR, then quantises with its clips
    s = ifmr_search(torch.cat([first.reshape(-1), second.reshape(-1)]), 8).scale.item()
    assert quantizer.calibrated
    assert quantizer.acts_clip_max.item() == pytest.approx(127 * s)
    assert quantizer.acts_clip_min.item() == pytest.approx(-128 * s)
    assert quantizer.acts_clip_max_pre.item() == quantizer.acts_clip_max.item()
    assert quantizer.acts_clip_min_pre.item() == quantizer.acts_clip_min.item()
    assert not torch.equal(out, second)
    grid = out / quantizer.acts_scale
    torch.testing.assert_close(grid, torch.round(grid), atol=1e-3, rtol=0)

    clips = (quantizer.acts_clip_max.item(), quantizer.acts_clip_min.item())
    quantizer(100 * second)  # no new calibration
    assert (quantizer.acts_clip_max.item(), quantizer.acts_clip_min.item()) == clips


def test_a_constant_calibration_batch_is_harmless():
    quantizer = UlqActQuantizer(bits=8, batch_num=2)
    zeros = torch.zeros(3, 4)
    assert torch.equal(quantizer(zeros), zeros)
    scale, offset = quantizer.scale_offset()
    assert (scale.item(), offset.item()) == (1.0, -128)  # process_scale of an empty range
    quantizer(torch.randn(3, 4))
    assert quantizer.calibrated


def test_eval_forward_calibrates_a_fresh_quantizer():
    quantizer = UlqActQuantizer(bits=8).eval()
    with pytest.raises(RuntimeError, match="no scale yet"):
        quantizer.scale_offset()
    with torch.no_grad():
        quantizer(torch.randn(100))
    assert quantizer.calibrated
    scale, offset = quantizer.scale_offset()
    assert scale.item() > 0 and offset.dtype == torch.int32


def test_explicit_clips_skip_ifmr_and_give_factors_before_any_forward():
    quantizer = UlqActQuantizer(bits=8, clip_max=2.55, clip_min=-2.55)
    assert quantizer.observer is None and quantizer.calibrated
    scale, offset = quantizer.scale_offset()
    assert scale.item() == pytest.approx(0.02)
    assert offset.item() == 0  # -128 + round(127.5) with ties to even
    x = torch.tensor([0.013, 5.0])
    torch.testing.assert_close(quantizer(x), torch.tensor([0.02, 2.54]))


def test_calibration_state_survives_load_state_dict():
    source = UlqActQuantizer(bits=8)
    source(torch.randn(500))
    restored = UlqActQuantizer(bits=8)
    restored.load_state_dict(source.state_dict())
    assert restored.calibrated
    x = torch.randn(50)
    torch.testing.assert_close(restored(x), source(x))


@pytest.mark.parametrize(("clip_max", "clip_min"), [(1.0, None), (None, -1.0), (-1.0, -2.0), (1.0, 0.5)])
def test_rejects_bad_explicit_clips(clip_max, clip_min):
    with pytest.raises(ValueError, match="clip_max"):
        UlqActQuantizer(bits=8, clip_max=clip_max, clip_min=clip_min)


def test_float16_activations_stay_float16():
    quantizer = UlqActQuantizer(bits=8, clip_max=2.0, clip_min=-2.0)
    x = torch.randn(32).half().requires_grad_(True)
    y = quantizer(x)
    assert y.dtype == torch.float16
    torch.testing.assert_close(y.float(), quantizer(x.float()), atol=1e-3, rtol=0)
    y.sum().backward()
    assert x.grad.dtype == torch.float16


def test_backward_state_lives_in_saved_tensors_not_on_ctx():
    quantizer = UlqActQuantizer(bits=8, clip_max=1.0, clip_min=-1.0)
    y = quantizer(torch.randn(10, requires_grad=True))
    ctx = y.grad_fn
    assert type(ctx).__name__ == "UlqActFunctionBackward"
    assert len(ctx.saved_tensors) == 5
    assert not [name for name, value in vars(ctx).items() if isinstance(value, torch.Tensor)]


def test_backward_releases_the_input_even_while_outputs_are_kept():
    # AMCT kept the input on a ctx attribute: it then lives as long as the output (e.g. kept for
    # logging). Saved tensors are released by backward instead.
    quantizer = UlqActQuantizer(bits=8, clip_max=1.0, clip_min=-1.0)
    inputs, outputs = [], []
    for _ in range(5):
        x = torch.randn(1000, requires_grad=True) * 2
        inputs.append(weakref.ref(x))
        y = quantizer(x)
        y.sum().backward()
        outputs.append(y)
        del x, y
    assert all(ref() is None for ref in inputs)


def test_function_marks_only_the_output_differentiable():
    x = torch.randn(5, requires_grad=True)
    clip_max = torch.tensor(1.0, requires_grad=True)
    clip_min = torch.tensor(-1.0, requires_grad=True)
    y, scale, offset, cmax, cmin = UlqActFunction.apply(
        x, clip_max, clip_min, torch.tensor(1.0), torch.tensor(-1.0), 8, False
    )
    assert y.requires_grad
    assert not any(t.requires_grad for t in (scale, offset, cmax, cmin))
