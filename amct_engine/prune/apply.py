"""Physical channel removal (docs/spec/engine.md §4.4 step 4): slice weights, biases, BN statistics, fix attributes.

A ``PrunePlan`` maps a module path to the absolute channel indices each of its tensors loses, by
member kind (``dependency.OUT`` / ``IN`` / ``NORM`` / ``DEPTHWISE``). It is built from the chosen
groups at create time and from the record at restore time, so both remove exactly the same thing;
the module's layer pruner (``layer_pruners.py``) does the slicing.
``prune_with_forward_check`` applies a plan group by group and gives back the groups whose removal
breaks the model's forward (found by bisection), restoring their modules (docs/spec/engine.md §4.4 "Apply").
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from amct_engine.prune.channel_groups import IN, OP, ChannelGroup
from amct_engine.prune.layer_pruners import layer_pruner_for

PrunePlan = dict[str, dict[str, set[int]]]


@dataclass(frozen=True)
class GroupCut:
    """A channel group and the group channels (``0..size-1``) it loses."""

    group: ChannelGroup
    channels: tuple[int, ...]


def plan_from_cuts(cuts: Sequence[GroupCut]) -> PrunePlan:
    plan: PrunePlan = {}
    for cut in cuts:
        for member in cut.group.members:
            if member.kind != OP:
                plan.setdefault(member.name, {}).setdefault(member.kind, set()).update(
                    member.indices(list(cut.channels))
                )
    return plan


def apply_plan(model: nn.Module, plan: PrunePlan) -> None:
    """Remove the planned channels from ``model``'s modules in place, each through its layer pruner."""
    for name, cuts in plan.items():
        module = model.get_submodule(name)
        try:
            _prune_module(module, cuts)
        except (ValueError, IndexError) as exc:
            raise ValueError(f"cannot prune '{name}' ({type(module).__name__}): {exc}") from None


def _prune_module(module: nn.Module, cuts: dict[str, set[int]]) -> None:
    pruner = layer_pruner_for(module)
    if pruner is None:
        raise ValueError(
            "no layer pruner is registered for its type, so it cannot lose channels "
            "(amct_engine.prune.register_layer_pruner adds one)"
        )
    # output side first (OUT; NORM and DEPTHWISE, whose in and out channels are the same), then IN
    for kind in sorted(cuts, key=lambda k: k == IN):
        if kind == IN:
            pruner.prune_in_channels(module, cuts[kind])
        else:
            pruner.prune_out_channels(module, cuts[kind])


# ---------------------------------------------------------------------- forward check and bisection


def output_shapes(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[tuple[int, ...]]:
    """Shapes of every tensor in the model's output, from an eval forward that changes nothing."""
    was_training = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            out = model(*inputs)
    finally:
        for m, mode in was_training.items():
            m.training = mode
    return [tuple(t.shape) for t in _tensors(out)]


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def prune_with_forward_check(
    model: nn.Module,
    cuts: Sequence[GroupCut],
    inputs: tuple[torch.Tensor, ...],
    expected: list[tuple[int, ...]] | None = None,
    finish: Callable[[nn.Module], None] | None = None,
) -> tuple[list[GroupCut], list[tuple[GroupCut, str]]]:
    """Apply every cut whose removal keeps the forward working; return (applied, [(broken, error)]).

    ``expected``: the unpruned model's output shapes, when already known. Each trial prunes a deep
    copy; bisection finds the breaking groups in O(k log n) trials. ``finish``: what else a pruned
    model needs before it runs (attention_heads.sync_head_attributes).
    """
    finish = finish or (lambda _model: None)
    if not cuts:
        return [], []
    if expected is None:
        expected = output_shapes(model, inputs)

    def failure(subset: list[GroupCut]) -> str | None:
        trial = copy.deepcopy(model)
        try:
            apply_plan(trial, plan_from_cuts(subset))
            finish(trial)
            shapes = output_shapes(trial, inputs)
        except Exception as exc:  # the user's forward may raise anything on a shape mismatch
            return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        if shapes != expected:
            return f"the output shapes change from {expected} to {shapes}"
        return None

    applied: list[GroupCut] = []
    broken: list[tuple[GroupCut, str]] = []
    _bisect(list(cuts), applied, broken, lambda extra: failure(applied + extra))
    apply_plan(model, plan_from_cuts(applied))
    finish(model)
    return applied, broken


def _bisect(
    cands: list[GroupCut],
    good: list[GroupCut],
    bad: list[tuple[GroupCut, str]],
    failure: Callable[[list[GroupCut]], str | None],
) -> None:
    if not cands:
        return
    error = failure(cands)
    if error is None:
        good.extend(cands)
    elif len(cands) == 1:
        bad.append((cands[0], error))
    else:
        mid = len(cands) // 2
        _bisect(cands[:mid], good, bad, failure)
        _bisect(cands[mid:], good, bad, failure)
