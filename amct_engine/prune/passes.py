"""The pruning passes the prune / compressed APIs run: filter pruning and 4:2 masks, create and replay.

Each pass is a plain function over a captured model and the parsed settings; the API module only
strings them together (parse → prune → re-capture → quantise → record).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from torch.fx import GraphModule

from amct_engine.config.specs import FilterPruneSpec
from amct_engine.graph.analysis import shared_weights
from amct_engine.graph.capture import CapturedModel
from amct_engine.layer_table import selective_type_names
from amct_engine.layers import entry_of
from amct_engine.prune.apply import GroupCut, apply_plan, output_shapes, prune_with_forward_check
from amct_engine.prune.attention_heads import (
    HEAD,
    HeadGroup,
    add_head_groups,
    find_head_groups,
    free_head_counts,
    head_bcp_importance,
    sync_head_attributes,
)
from amct_engine.prune.bcp import remain_count, select_pruned_channels
from amct_engine.prune.dependency import OP, ChannelDependencies, ChannelGroup, build_channel_groups
from amct_engine.prune.importance import IMPORTANCE_CRITERIA, ImportanceCriterion, ImportanceData, prepare_criterion
from amct_engine.prune.progressive import (
    ProgressivePruning,
    ScheduledGroup,
    describe_schedule,
    float_modules,
)
from amct_engine.prune.records import filter_prune_record, plan_from_records, selective_prune_record
from amct_engine.prune.report import (
    DISABLED,
    NOT_CONFIGURED,
    PRUNED,
    REPLAYED,
    RESTORED,
    UNCHANGED,
    GroupDecision,
    PruneReport,
    SelectiveDecision,
)
from amct_engine.prune.selective import attach_selective_mask, cin_axis
from amct_engine.prune.settings import LayerPruneSettings
from amct_engine.quant.retrain_layer import QuantRetrainLayer
from amct_engine.record import RecordFile


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class _Criteria:
    """The criterion each group is ranked with: the one the caller gives, else the one its first producer's
    spec names (IMPORTANCE_CRITERIA, prepared once per name with the calibration data)."""

    def __init__(self, model: nn.Module, given: ImportanceCriterion | None, data: ImportanceData | None) -> None:
        self.model, self.given, self.data, self.prepared = model, given, data, {}

    def name_for(self, spec: FilterPruneSpec) -> str:
        if self.given is not None:
            return getattr(self.given, "__name__", type(self.given).__name__)
        return spec.importance

    def __call__(self, group: ChannelGroup, spec: FilterPruneSpec) -> torch.Tensor:
        if self.given is not None:
            return self.given(group, self.model)
        if isinstance(group, HeadGroup) and spec.importance == "bcp":
            return head_bcp_importance(group, self.model)  # BCP's filter norms, summed per head
        if spec.importance not in self.prepared:
            self.prepared[spec.importance] = prepare_criterion(
                IMPORTANCE_CRITERIA[spec.importance], self.model, self.data
            )
        return self.prepared[spec.importance](group, self.model)


def _decide(
    group: ChannelGroup, model: nn.Module, settings: LayerPruneSettings, criterion: _Criteria
) -> tuple[GroupDecision, GroupCut | None]:
    producers = group.producer_names
    consumers = list(dict.fromkeys(m.name for m in group.consumers if m.kind != OP))
    decision = GroupDecision(
        group.id, producers, consumers, group.size, group.size, NOT_CONFIGURED, divisions=group.divisions
    )
    if isinstance(group, HeadGroup):
        decision.unit = "heads"
    specs = settings.filter()
    missing = [p for p in producers if p not in specs]
    if missing:
        why = "; ".join(f"{p} {settings.why_not_filter(p)}" for p in missing)
        shared = len(missing) < len(producers)
        decision.reason = f"its channels are shared with a layer that is not filter-pruned: {why}" if shared else why
        return decision, None
    decision.prune_ratio = min(specs[p].prune_ratio for p in producers)  # docs/spec/engine.md §4.4: merged records
    decision.ascend_optimized = any(specs[p].ascend_optimized for p in producers)
    lead = specs[producers[0]]  # our extension (the criterion) follows the group's first producer
    decision.importance = criterion.name_for(lead)
    if group.disabled:
        decision.status, decision.reason = DISABLED, "; ".join(group.disabled)
        return decision, None
    kept = remain_count(group.size, decision.prune_ratio, decision.ascend_optimized, group.divisions)
    if kept >= group.size:
        decision.status = UNCHANGED
        decision.reason = f"{group.size} channels at prune_ratio {decision.prune_ratio:.4g} keep all {group.size}" + (
            " (ascend_optimized keeps a multiple of 16)" if decision.ascend_optimized else ""
        )
        return decision, None
    scores = criterion(group, lead)
    channels = select_pruned_channels(scores, decision.prune_ratio, decision.ascend_optimized, group.divisions)
    decision.status, decision.kept = PRUNED, group.size - len(channels)
    return decision, GroupCut(group, tuple(channels))


def filter_prune(
    cm: CapturedModel,
    settings: LayerPruneSettings,
    report: PruneReport,
    criterion: ImportanceCriterion | None = None,
    data: ImportanceData | None = None,
) -> list[GroupCut]:
    """Filter pruning over the channel groups of ``cm`` (docs/spec/engine.md §4.4); removes channels from ``cm.module``
    in place. ``criterion`` ranks every group's channels (importance.py); None: each group's cfg names
    one (BCP unless the ``importance`` extension says otherwise). ``data``: the calibration batches a
    data-driven criterion (Taylor) learns from."""
    specs = settings.filter()
    if not specs:
        return []
    deps: ChannelDependencies = build_channel_groups(cm)
    heads = add_head_groups(cm, deps, {n for n, s in specs.items() if s.granularity == HEAD})
    criteria = _Criteria(cm.module, criterion, data)
    applied, _ = _decide_and_cut(cm, deps, settings, criteria, report, cm.module, heads)
    pruned = {m.name for cut in applied for m in cut.group.members}
    report.layers.update({n: why for n, why in deps.not_prunable.items() if n in specs and n not in pruned})
    return applied


def _decide_and_cut(
    cm: CapturedModel,
    deps: ChannelDependencies,
    settings: LayerPruneSettings,
    criteria,
    report: PruneReport,
    target: nn.Module,
    heads: Sequence[HeadGroup] = (),
):
    """Decide every group (in the report), remove the chosen channels from ``target`` where the forward on
    ``input_data`` still runs, and mark the others restored. The cuts applied, and each group's decision."""
    cuts, by_group = [], {}
    for group in deps.groups:
        decision, cut = _decide(group, cm.module, settings, criteria)
        report.groups.append(decision)
        by_group[group.id] = decision
        if cut is not None:
            cuts.append(cut)
    finish = (lambda m: sync_head_attributes(m, heads)) if heads else None
    applied, broken = prune_with_forward_check(target, cuts, cm.example_inputs, deps.output_shapes, finish)
    for cut, error in broken:
        decision = by_group[cut.group.id]
        decision.status, decision.kept = RESTORED, decision.channels
        decision.reason = f"removing its channels breaks the forward with input_data ({error})"
    return applied, by_group


def scheduled_filter_prune(
    cm: CapturedModel, settings: LayerPruneSettings, report: PruneReport, data: ImportanceData | None = None
) -> ProgressivePruning | None:
    """Progressive filter pruning (the ``prune_schedule`` extension, progressive.py): the same groups and
    target counts as ``filter_prune``, checked the same way on a copy, but no channel leaves ``cm.module``:
    the returned schedule masks them from ``start_ratio`` up, and save removes them. None: nothing to prune."""
    specs = settings.filter()
    deps = build_channel_groups(cm)
    applied, by_group = _decide_and_cut(
        cm, deps, settings, _Criteria(cm.module, None, data), report, copy.deepcopy(cm.module)
    )  # checked on a copy: the schedule masks
    entries = []
    for cut in applied:
        decision = by_group[cut.group.id]
        lead = specs[cut.group.producer_names[0]]
        decision.schedule = describe_schedule(lead.schedule, decision.prune_ratio)
        entries.append(
            ScheduledGroup(cut.group, decision.prune_ratio, decision.ascend_optimized, lead.importance, lead.schedule)
        )
    if not entries:
        return None
    return ProgressivePruning(entries, float_modules(cm.module, [e.group for e in entries]))


def replay_filter_prune(cm: CapturedModel, records, path: str, report: PruneReport) -> None:
    """Remove the channels the record lists (restore never recomputes BCP, docs/spec/engine.md §1.3)."""
    plan = plan_from_records(records, cm.module, path)
    if not plan:
        return
    heads = find_head_groups(cm)
    if isinstance(cm.module, GraphModule):
        free_head_counts(cm.module, heads)  # a pruned head count is read from the projections' width
    expected = output_shapes(cm.module, cm.example_inputs)
    apply_plan(cm.module, plan)
    sync_head_attributes(cm.module, heads)
    got = output_shapes(cm.module, cm.example_inputs)
    if got != expected:
        raise RuntimeError(
            f"{path}: replaying the prune records changes the output shapes from {expected} to "
            f"{got}; the record does not belong to this model"
        )
    for i, record in enumerate(r for r in records if len(r.producer)):
        producers = [n.name for n in record.producer]
        first = {a.name: a for a in record.producer[0].attr}
        size = first["end"].i - first["begin"].i
        removed = len(first["prune_index"].ints) if "prune_index" in first else 0
        consumers = [n.name for n in record.consumer]
        report.groups.append(GroupDecision(i, producers, consumers, size, size - removed, REPLAYED))


def selective_prune(
    model: nn.Module,
    cm: CapturedModel,
    settings: LayerPruneSettings,
    record: RecordFile | None,
    report: PruneReport,
    masks: dict | None = None,
) -> dict:
    """Attach 4:2 masks to the configured layers of ``model`` (or to those ``masks`` from a record lists).

    Returns {layer: SelectiveMask}. ``cm`` is the capture the layers were found in (for reuse checks).
    """
    attached = {}
    names = list(masks) if masks is not None else list(settings.selective())
    for name in names:
        spec = settings.selective().get(name)
        update_freq = spec.update_freq if spec is not None else 0
        try:
            target = model.get_submodule(name)
        except AttributeError:
            raise ValueError(f"4:2 selective pruning: the model has no layer '{name}'") from None
        layer = target.layer if isinstance(target, QuantRetrainLayer) else target
        why = _selective_skip_reason(cm, name, layer)
        if why and masks is None:
            report.selective.append(SelectiveDecision(name, "skipped", why))
            continue
        mask_module = attach_selective_mask(model, name, update_freq, record, None if masks is None else masks[name])
        attached[name] = mask_module
        sparsity = 1.0 - float(mask_module.mask.float().mean())
        report.selective.append(SelectiveDecision(name, "masked", sparsity=sparsity))
    return attached


def _selective_skip_reason(cm: CapturedModel, name: str, layer: nn.Module) -> str | None:
    entry = entry_of(layer)
    if entry is None or not entry.selective_prune:
        kinds = ", ".join(selective_type_names())
        return f"{type(layer).__name__} is not one of {kinds} (docs/spec/engine.md §4.5)"
    calls = cm.call_count(name)
    if calls != 1:
        return f"it is called {calls} times in forward (reused modules are never pruned)"
    sharers = shared_weights(cm.module).get(name)
    if sharers:
        return f"it shares its weight with {', '.join(sharers)} (shared weights are never pruned)"
    if layer.weight.shape[cin_axis(layer)] < 4:
        return f"it has {layer.weight.shape[cin_axis(layer)]} input channels per group, fewer than 4"
    return None


def prune_records(cuts: list[GroupCut], masks: dict) -> list:
    return [filter_prune_record(c) for c in cuts] + [selective_prune_record(n, m.mask) for n, m in masks.items()]
