"""``amct.quantize`` and ``amct.convert`` for LLMs: AMCT's calibrate-then-convert workflow (docs/spec/llm.md §1).

    amct.quantize(model, cfg)      # in place: each target Linear -> CalibrationLinear
    model(calibration_batch)       # the user's forward, ``batch_num`` times
    amct.convert(model)            # in place: CalibrationLinear -> WeightOnlyLinear / W8A8Linear

Targets are the ``nn.Linear`` modules (subclasses included) not named by ``skip_layers``; an entry skips a
layer whose name contains it (AMCT's fuzzy match) or whose class name equals it. ``convert`` works one
Linear at a time and frees its statistics as it goes, with a tqdm progress bar.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from amct_engine.llm.awq import awq_quantize
from amct_engine.llm.calibration import CalibrationLinear
from amct_engine.llm.config import LlmQuantConfig, parse_config
from amct_engine.llm.gptq import gptq_quantize
from amct_engine.llm.group_quant import rtn
from amct_engine.llm.quant_linear import W8A8Linear, WeightOnlyLinear
from amct_engine.llm.smoothquant import smoothquant_params


def is_skipped(name: str, module: nn.Module, skip_layers: frozenset[str]) -> bool:
    return any(entry in name or entry == type(module).__name__ for entry in skip_layers)


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def target_linears(model: nn.Module, cfg: LlmQuantConfig) -> list[tuple[str, nn.Linear]]:
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and name and not is_skipped(name, m, cfg.skip_layers)
    ]


def quantize(model: nn.Module, config: dict[str, Any]) -> nn.Module:
    """Check ``config`` (``LlmConfigError`` names a bad field) and wrap each target Linear for calibration.

    Changes ``model`` in place and returns it. Raises ``ValueError`` when no Linear is left to quantise."""
    cfg = parse_config(config)
    targets = target_linears(model, cfg)
    if not targets:
        raise ValueError("amct.quantize: the model has no nn.Linear left to quantise after skip_layers")
    for name, linear in targets:
        _set_module(model, name, CalibrationLinear(linear, cfg, name))
    return model


def calibration_modules(model: nn.Module) -> Iterator[tuple[str, CalibrationLinear]]:
    for name, m in list(model.named_modules()):
        if isinstance(m, CalibrationLinear):
            yield name, m


@torch.no_grad()
def quantized_module(calib: CalibrationLinear) -> nn.Module:
    """The converted form of one calibrated Linear."""
    cfg, weight, bias = calib.cfg, calib.weight, calib.bias
    if cfg.inputs is not None:
        return W8A8Linear(smoothquant_params(weight, calib.channel_abs_max(), cfg), bias)
    if cfg.algorithm == "gptq":
        p = cfg.params
        codes = gptq_quantize(weight, calib.mean_hessian(), cfg.weights, float(p["percdamp"]), int(p["block_size"]))
        return WeightOnlyLinear(codes, bias, None)
    if cfg.algorithm == "awq":
        grids, clip = int(cfg.params["grids_num"]), int(cfg.params["clip_grids"])
        codes, multiplier = awq_quantize(
            weight, calib.mean_hessian(), calib.channel_abs_mean(), cfg.weights, grids, clip
        )
        return WeightOnlyLinear(codes, bias, multiplier)
    return WeightOnlyLinear(rtn(weight, cfg.weights), bias, None)


def convert(model: nn.Module, progress: bool = True, on_layer: Callable[[int, int], None] | None = None) -> nn.Module:
    """Replace every calibration module by its quantised module, in place; returns ``model``.

    GPTQ, AWQ and SmoothQuant need the calibration forward first (``RuntimeError`` otherwise). ``on_layer(done,
    total)`` is called after each Linear (a service job reports its progress with it)."""
    modules = list(calibration_modules(model))
    if not modules:
        raise ValueError("amct.convert: the model has no calibration modules; call amct.quantize first")
    for i, (name, calib) in enumerate(tqdm(modules, desc="amct.convert", unit="linear", disable=not progress), 1):
        quantized = quantized_module(calib)
        calib.release()
        _set_module(model, name, quantized.to(calib.weight.device))
        if on_layer is not None:
            on_layer(i, len(modules))
    return model
