"""Physical channel removal (spec §4.4 step 4): slice weights, biases, BN statistics, fix attributes.

A ``PrunePlan`` maps a module path to the absolute channel indices each of its tensors loses, by
member kind (``dependency.OUT`` / ``IN`` / ``NORM`` / ``DEPTHWISE``). It is built from the chosen
groups at create time and from the record at restore time, so both remove exactly the same thing.
``prune_with_forward_check`` applies a plan group by group and gives back the groups whose removal
breaks the model's forward (found by bisection), restoring their modules (spec §4.4 "Apply").
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from amct_engine.prune.channel_groups import (
    BN_TYPES,
    CONV_TRANSPOSE_TYPES,
    CONV_TYPES,
    DEPTHWISE,
    IN,
    NORM,
    OP,
    OUT,
    ChannelGroup,
)

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
                    member.indices(list(cut.channels)))
    return plan


def apply_plan(model: nn.Module, plan: PrunePlan) -> None:
    """Remove the planned channels from ``model``'s modules in place."""
    for name, cuts in plan.items():
        module = model.get_submodule(name)
        try:
            _prune_module(module, cuts)
        except (ValueError, IndexError) as exc:
            raise ValueError(f"cannot prune '{name}' ({type(module).__name__}): {exc}") from None


def _prune_module(module: nn.Module, cuts: dict[str, set[int]]) -> None:
    if isinstance(module, BN_TYPES):
        _prune_norm(module, cuts.get(NORM, set()))
    elif isinstance(module, CONV_TYPES):
        if DEPTHWISE in cuts:
            _prune_depthwise(module, cuts[DEPTHWISE])
        else:
            _prune_conv(module, cuts.get(OUT, set()), cuts.get(IN, set()))
    elif isinstance(module, CONV_TRANSPOSE_TYPES):
        if module.groups != 1 or OUT in cuts:
            raise ValueError("only the input channels of an ungrouped ConvTranspose can be pruned")
        module.weight = _param(module.weight, module.weight.detach()[_keep(module.in_channels, cuts.get(IN, set()))])
        module.in_channels = module.weight.shape[0]
    elif isinstance(module, nn.Linear):
        weight = module.weight.detach()
        keep_out = _keep(module.out_features, cuts.get(OUT, set()))
        keep_in = _keep(module.in_features, cuts.get(IN, set()))
        module.weight = _param(module.weight, weight[keep_out][:, keep_in])
        if module.bias is not None:
            module.bias = _param(module.bias, module.bias.detach()[keep_out])
        module.out_features, module.in_features = len(keep_out), len(keep_in)
    else:
        raise ValueError("only Conv, ConvTranspose, Linear and BatchNorm layers can lose channels")


def _keep(size: int, removed: set[int]) -> list[int]:
    bad = sorted(i for i in removed if not 0 <= i < size)
    if bad:
        raise IndexError(f"channel index {bad[0]} is out of range for {size} channels")
    if len(removed) >= size:
        raise ValueError(f"cannot remove all {size} channels")
    return [i for i in range(size) if i not in removed]


def _param(old: nn.Parameter, value: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(value.clone().contiguous(), requires_grad=old.requires_grad)


def _per_group(removed: set[int], size: int, groups: int) -> list[set[int]]:
    """Split absolute indices into per-group local indices; every group must lose as many."""
    length = size // groups
    local = [{i - g * length for i in removed if g * length <= i < (g + 1) * length} for g in range(groups)]
    if len({len(part) for part in local}) > 1:
        raise ValueError(f"the {groups} conv groups would lose different channel counts "
                         f"{[len(p) for p in local]}")
    return local


def _prune_conv(conv: nn.Module, out_removed: set[int], in_removed: set[int]) -> None:
    groups, weight = conv.groups, conv.weight.detach()
    keep_out = _keep(conv.out_channels, out_removed)
    _keep(conv.in_channels, in_removed)  # range check
    if groups > 1:
        _per_group(out_removed, conv.out_channels, groups)
    new = weight[keep_out]
    if in_removed:
        in_len, out_len = conv.in_channels // groups, conv.out_channels // groups
        local = _per_group(in_removed, conv.in_channels, groups)
        keep_local = [[c for c in range(in_len) if c not in part] for part in local]
        index = torch.tensor([keep_local[row // out_len] for row in keep_out], dtype=torch.long,
                             device=new.device)
        index = index.reshape(*index.shape, *[1] * (new.dim() - 2)).expand(-1, -1, *new.shape[2:])
        new = torch.gather(new, 1, index)
    conv.weight = _param(conv.weight, new)
    if conv.bias is not None:
        conv.bias = _param(conv.bias, conv.bias.detach()[keep_out])
    conv.out_channels = len(keep_out)
    conv.in_channels -= len(in_removed)


def _prune_depthwise(conv: nn.Module, removed: set[int]) -> None:
    keep = _keep(conv.out_channels, removed)
    conv.weight = _param(conv.weight, conv.weight.detach()[keep])
    if conv.bias is not None:
        conv.bias = _param(conv.bias, conv.bias.detach()[keep])
    conv.in_channels = conv.out_channels = conv.groups = len(keep)


def _prune_norm(bn: nn.Module, removed: set[int]) -> None:
    keep = _keep(bn.num_features, removed)
    if bn.weight is not None:
        bn.weight = _param(bn.weight, bn.weight.detach()[keep])
        bn.bias = _param(bn.bias, bn.bias.detach()[keep])
    if bn.running_mean is not None:
        bn.running_mean = bn.running_mean[keep].clone()
        bn.running_var = bn.running_var[keep].clone()
    bn.num_features = len(keep)


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
) -> tuple[list[GroupCut], list[tuple[GroupCut, str]]]:
    """Apply every cut whose removal keeps the forward working; return (applied, [(broken, error)]).

    ``expected``: the unpruned model's output shapes, when already known. Each trial prunes a deep
    copy; bisection finds the breaking groups in O(k log n) trials.
    """
    if not cuts:
        return [], []
    if expected is None:
        expected = output_shapes(model, inputs)

    def failure(subset: list[GroupCut]) -> str | None:
        trial = copy.deepcopy(model)
        try:
            apply_plan(trial, plan_from_cuts(subset))
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
    return applied, broken


def _bisect(cands: list[GroupCut], good: list[GroupCut], bad: list[tuple[GroupCut, str]],
            failure: Callable[[list[GroupCut]], str | None]) -> None:
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
