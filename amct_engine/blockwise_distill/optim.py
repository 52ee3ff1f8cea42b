"""Re-creating a user's optimizer over one distill group's parameters (docs/spec/engine.md §6.2).

AMCT re-creates the user's optimizer per group with only ``lr``. Passing ``optimizer.defaults`` back
keeps every hyper-parameter, but ``defaults`` may hold keys the constructor does not take (torch's
AdamW stores ``decoupled_weight_decay``, which only Adam's constructor accepts), so the keyword
arguments come from the constructor's own signature.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

import torch
from torch import nn


def optimizer_kwargs(optimizer: torch.optim.Optimizer) -> dict:
    """The hyper-parameters to build another ``type(optimizer)`` with: those of its first parameter
    group (where AMCT reads ``lr``; a scheduler may have changed it), over ``defaults``, restricted to
    what the constructor accepts."""
    first = optimizer.param_groups[0] if optimizer.param_groups else {}
    values = {**optimizer.defaults, **{k: v for k, v in first.items() if k in optimizer.defaults}}
    parameters = inspect.signature(type(optimizer).__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return values
    accepted = {
        name
        for name, p in parameters.items()
        if name not in ("self", "params") and p.kind is not inspect.Parameter.VAR_POSITIONAL
    }
    return {k: v for k, v in values.items() if k in accepted}


def rebuild_optimizer(optimizer: torch.optim.Optimizer, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """A new optimizer of the same class and hyper-parameters as ``optimizer``, over ``params``."""
    return type(optimizer)(list(params), **optimizer_kwargs(optimizer))
