"""Importance criteria: how the channels of a group are ranked for filter pruning (docs/spec/engine.md §4.4 step 3).

A criterion is a callable ``(group, model) -> scores``: one score per channel of the ``ChannelGroup``
(a 1-D tensor of ``group.size``), computed from the group's layers in ``model``; the lowest scores
are pruned first. How many go, and the equal share of each grouped-conv part, are the spec's count
rules (``bcp.remain_count`` / ``bcp.select_pruned_channels``), the same for every criterion. A
criterion that learns from data has a ``prepare(model, data)`` that returns the criterion to use
for this model (``prepare_criterion``). ``IMPORTANCE_CRITERIA`` names them; a cfg picks one with the
``importance`` extension field of ``balanced_l2_norm_filter_prune`` (docs/spec/engine.md §2.2):

- ``bcp`` (the default, AMCT's): balanced L2 norms of the producers' filters;
- ``group_l2``: Torch-Pruning's group magnitude: Σ w² over every weight the channel touches, the
  producers' filters, the BN's γ and the consumers' input columns;
- ``taylor``: first order Taylor, Σ |w · ∂L/∂w| over the same weights, the gradients accumulated over
  a few calibration batches (cross-entropy on their labels, or on the model's own predictions).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from amct_engine.config.specs import DEFAULT_IMPORTANCE
from amct_engine.prune.bcp import bcp_importance
from amct_engine.prune.channel_groups import IN, OP, ChannelGroup
from amct_engine.prune.layer_pruners import layer_pruner_for
from amct_engine.registry import Registry

ImportanceCriterion = Callable[[ChannelGroup, nn.Module], torch.Tensor]
# A value per parameter element, from (module path, parameter name, parameter).
ElementValue = Callable[[str, str, nn.Parameter], torch.Tensor]

IMPORTANCE_CRITERIA: Registry[ImportanceCriterion] = Registry("pruning importance criterion")

__all__ = ["DEFAULT_IMPORTANCE", "IMPORTANCE_CRITERIA", "ImportanceData", "coupled_channel_sums", "prepare_criterion"]


@dataclass
class ImportanceData:
    """Batches a data-driven criterion learns from: model inputs and, when the data has them, labels."""

    batches: Sequence[tuple[tuple[torch.Tensor, ...], torch.Tensor | None]] = field(default_factory=list)
    loss: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor] | None = None  # default: cross-entropy


def prepare_criterion(criterion: ImportanceCriterion, model: nn.Module, data: ImportanceData | None):
    """The criterion to rank ``model``'s groups with: ``criterion.prepare(model, data)`` when it has one."""
    prepare = getattr(criterion, "prepare", None)
    return prepare(model, data) if prepare is not None else criterion


def coupled_channel_sums(group: ChannelGroup, model: nn.Module, value: ElementValue) -> torch.Tensor:
    """Σ ``value`` over every parameter element that belongs to each channel of ``group``: the producers'
    output rows, pass-through and depthwise layers' channels and the consumers' input columns (a
    Linear after a flatten reads a channel as ``block`` columns). One float64 score per channel."""
    total = torch.zeros(group.size, dtype=torch.float64)
    for member in group.members:
        if member.kind == OP:
            continue
        module = model.get_submodule(member.name)
        pruner = layer_pruner_for(module)
        tensors = pruner.in_channel_tensors(module) if member.kind == IN else pruner.out_channel_tensors(module)
        for name, axis in tensors:
            param = getattr(module, name)
            values = value(member.name, name, param).detach().movedim(axis, 0)[member.begin : member.end]
            per_feature = values.reshape(values.shape[0], -1).sum(dim=1).to(torch.float64).cpu()
            total += per_feature.reshape(group.size, member.block).sum(dim=1)
    return total


def group_l2_importance(group: ChannelGroup, model: nn.Module) -> torch.Tensor:
    """Torch-Pruning's GroupMagnitudeImportance(p=2): Σ w² over the channel's coupled weights."""
    return coupled_channel_sums(group, model, lambda _m, _n, p: p.detach().square())


class TaylorImportance:
    """First-order Taylor: Σ |w · ∂L/∂w| over the coupled weights (Torch-Pruning's TaylorImportance)."""

    def __init__(self, gradients: dict[tuple[str, str], torch.Tensor] | None = None) -> None:
        self.gradients = gradients

    def prepare(self, model: nn.Module, data: ImportanceData | None) -> TaylorImportance:
        if data is None or not data.batches:
            raise ValueError(
                "the taylor importance criterion needs calibration batches (pass calibration_data "
                "to create_prune_retrain_model / create_compressed_retrain_model)"
            )
        return TaylorImportance(accumulated_gradients(model, data))

    def __call__(self, group: ChannelGroup, model: nn.Module) -> torch.Tensor:
        if self.gradients is None:
            raise ValueError("the taylor importance criterion was not prepared with calibration batches")
        zero = torch.zeros(())
        return coupled_channel_sums(group, model, lambda m, n, p: (p.detach() * self.gradients.get((m, n), zero)).abs())


def accumulated_gradients(model: nn.Module, data: ImportanceData) -> dict[tuple[str, str], torch.Tensor]:
    """∂L/∂w summed over the batches, per (module path, parameter name); eval mode, so BN statistics and
    the model's parameters and gradients are left as they were."""
    was_training = {m: m.training for m in model.modules()}
    saved = {p: p.grad for p in model.parameters()}
    model.eval()
    try:
        for p in model.parameters():
            p.grad = None
        for inputs, labels in data.batches:
            with torch.enable_grad():
                output = model(*inputs)
                loss = data.loss(output, labels) if data.loss is not None else _cross_entropy(output, labels)
                loss.backward()
        return {
            (module_name, name): p.grad.detach().clone()
            for module_name, module in model.named_modules()
            for name, p in module.named_parameters(recurse=False)
            if p.grad is not None
        }
    finally:
        for p, grad in saved.items():
            p.grad = grad
        for m, mode in was_training.items():
            m.training = mode


def _cross_entropy(output, labels: torch.Tensor | None) -> torch.Tensor:
    if not isinstance(output, torch.Tensor) or output.dim() != 2:
        raise ValueError(
            "the taylor criterion's default loss is cross-entropy over [N, classes] outputs; pass a "
            "loss for other outputs"
        )
    target = labels if labels is not None else output.detach().argmax(dim=1)  # the model's own predictions
    return F.cross_entropy(output, target.to(output.device).long())


# docs/spec/engine.md §4.4 step 3: balanced L2-norm filter scores, averaged over the group's producers
IMPORTANCE_CRITERIA.register(DEFAULT_IMPORTANCE, bcp_importance)
IMPORTANCE_CRITERIA.register("group_l2", group_l2_importance)
IMPORTANCE_CRITERIA.register("taylor", TaylorImportance())
