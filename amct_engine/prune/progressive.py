"""Progressive filter pruning (our ``prune_schedule`` extension; AMCT's overview: 渐进式剪枝).

One-shot pruning (AMCT's) removes every channel at creation. A schedule instead *masks* them during
retraining and lets the mask grow: at creation ``start_ratio`` of each group's channels, then after
every ``interval`` training batches one step more, up to the cfg's ``prune_ratio`` after ``steps``
steps (docs/spec/engine.md §2.2). The network adapts to each loss of capacity before the next.

- A masked channel has every tensor that carries it zeroed (the producers' filters and biases, the
  BatchNorm's γ and β, the consumers' input columns), in place before every forward, so the masked
  forward computes exactly what the model with those channels removed computes.
- At each step the group's criterion re-ranks the channels on the current weights; masked ones stay
  masked (the mask only grows).
- Save removes the channels physically: the mask of the target ratio (taken now if training ended
  before the last step), the same channel counts as one-shot pruning.
- The state (steps taken, batches seen, masked channels per group) is written next to the record as
  ``<record_file>.prune_schedule.json`` at creation, at every step and at the first eval forward after
  training batches; restore replays it exactly.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from amct_engine.config.specs import PruneScheduleSpec
from amct_engine.prune.apply import GroupCut, apply_plan, plan_from_cuts
from amct_engine.prune.bcp import remain_count, select_pruned_channels
from amct_engine.prune.channel_groups import IN, OP, OUT, ChannelGroup
from amct_engine.prune.importance import IMPORTANCE_CRITERIA
from amct_engine.prune.layer_pruners import layer_pruner_for
from amct_engine.quant.retrain_layer import QuantRetrainLayer

ATTR = "amct_prune_schedule"  # the model attribute that holds the ProgressivePruning
STATE_SUFFIX = ".prune_schedule.json"
STATE_FORMAT = 1


def describe_schedule(schedule: PruneScheduleSpec | None, target: float) -> str:
    """For the report: how the group reaches its mask (docs/spec/engine.md §2.2)."""
    if schedule is None:
        return f"masked at {target:.4g} from creation, removed at save"
    return (
        f"progressive: {schedule.start_ratio:.4g} → {target:.4g} in {schedule.steps} steps, one every "
        f"{schedule.interval} training batches; removed at save"
    )


def state_path(record_file) -> str:
    return os.fspath(record_file) + STATE_SUFFIX


@dataclass
class ScheduledGroup:
    """One channel group under a schedule: its target, the steps it has taken and its masked channels."""

    group: ChannelGroup
    target_ratio: float
    ascend_optimized: bool
    importance: str
    schedule: PruneScheduleSpec | None  # None: masked at the target from creation on
    step: int = 0
    masked: tuple[int, ...] = ()

    @property
    def steps(self) -> int:
        return self.schedule.steps if self.schedule is not None else 0

    def ratio(self, step: int) -> float:
        return self.schedule.ratio_at(step, self.target_ratio) if self.schedule else self.target_ratio

    def due(self, batches: int) -> int:
        """The step this group should be at after ``batches`` training batches."""
        return min(self.steps, batches // self.schedule.interval) if self.schedule else 0

    def as_json(self) -> dict:
        schedule = (
            None
            if self.schedule is None
            else {
                "steps": self.schedule.steps,
                "start_ratio": self.schedule.start_ratio,
                "interval": self.schedule.interval,
            }
        )
        return {
            "producers": self.group.producer_names,
            "channels": self.group.size,
            "target_ratio": self.target_ratio,
            "ascend_optimized": self.ascend_optimized,
            "importance": self.importance,
            "schedule": schedule,
            "step": self.step,
            "masked": list(self.masked),
        }


@dataclass
class ProgressivePruning:
    """The scheduled groups of one model, the batch counter, and where the state is written."""

    groups: list[ScheduledGroup]
    modules: dict[str, nn.Module]  # member path -> the float module holding its tensors (QAT: wrapper.layer / .bn)
    state_file: str | None = None
    batches: int = 0
    history: list[dict] = field(default_factory=list)  # (step, group, masked count) as they happened
    _written: int = -1  # the batch count the state file holds
    # (group id, member, kind, device) -> the masked channel indices: built when a mask changes, not per forward
    _indices: dict = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ masks

    def start(self) -> None:
        """The masks at creation (step 0: ``start_ratio``; groups without a schedule: the target)."""
        for entry in self.groups:
            self._mask_at(entry, 0)
        self.apply_masks()
        self.write_state()

    def before_forward(self, training: bool) -> None:
        """Take the steps now due, zero the masked tensors, then count the batch when training."""
        stepped = False
        for entry in self.groups:
            due = entry.due(self.batches)
            if due > entry.step:
                self._mask_at(entry, due)
                stepped = True
        self.apply_masks()
        if training:
            self.batches += 1
        # the file follows every step, and the batch count at the first eval forward after training (as
        # the 4:2 masks reach the record): the state a checkpoint taken after evaluating belongs to
        if stepped or (not training and self._written != self.batches):
            self.write_state()

    def _mask_at(self, entry: ScheduledGroup, step: int) -> None:
        count = _masked_count(entry, entry.ratio(step))
        entry.masked = self._select(entry, entry.ratio(step)) if count else ()
        entry.step = step
        self._indices = {k: v for k, v in self._indices.items() if k[0] != entry.group.id}
        self.history.append({"group": entry.group.id, "step": step, "masked": len(entry.masked)})

    def _select(self, entry: ScheduledGroup, ratio: float) -> tuple[int, ...]:
        # a weight-based criterion (bcp, group_l2): the cfg check refuses data-driven ones with a schedule
        criterion = IMPORTANCE_CRITERIA[entry.importance]
        scores = criterion(entry.group, _FloatView(self.modules)).to(torch.float64).clone()
        if entry.masked:
            scores[list(entry.masked)] = -float("inf")  # the mask only grows
        chosen = select_pruned_channels(scores, ratio, entry.ascend_optimized, entry.group.divisions)
        return tuple(sorted(set(chosen) | set(entry.masked)))

    @torch.no_grad()
    def apply_masks(self) -> None:
        for entry in self.groups:
            if entry.masked:
                for tensor, axis, index in self._tensors(entry):
                    tensor.index_fill_(axis, index, 0)

    def _tensors(self, entry: ScheduledGroup):
        """(tensor, axis, indices) of every parameter that carries the group's masked channels."""
        for member in entry.group.members:
            if member.kind == OP:
                continue
            module = self.modules[member.name]
            for name, axis in channel_tensors(module, member.kind):
                param = getattr(module, name)
                key = (entry.group.id, member.name, member.kind, param.device)
                if key not in self._indices:
                    self._indices[key] = torch.tensor(
                        member.indices(list(entry.masked)), dtype=torch.long, device=param.device
                    )
                yield param.data, axis, self._indices[key]

    # ------------------------------------------------------------------ save

    def final_cuts(self) -> list[GroupCut]:
        """Every group's channels at the target ratio: its last step's mask, or taken now from the
        current weights if training ended before the last step."""
        for entry in self.groups:
            if entry.step < entry.steps:
                self._mask_at(entry, entry.steps)
        return [GroupCut(e.group, e.masked) for e in self.groups if e.masked]

    # ------------------------------------------------------------------ state

    def as_json(self) -> dict:
        return {
            "format": STATE_FORMAT,
            "batches": self.batches,
            "groups": [g.as_json() for g in self.groups],
            "history": self.history,
        }

    def write_state(self) -> None:
        self._written = self.batches
        if self.state_file is not None:
            with open(self.state_file, "w", encoding="utf-8") as f:
                json.dump(self.as_json(), f, indent=1)


def _masked_count(entry: ScheduledGroup, ratio: float) -> int:
    if ratio <= 0:
        return 0
    group = entry.group
    return group.size - remain_count(group.size, ratio, entry.ascend_optimized, group.divisions)


def channel_tensors(module: nn.Module, kind: str) -> list[tuple[str, int]]:
    """(parameter, axis) of ``module`` that carry a channel of a member of ``kind``: the input columns of
    a consumer, else the output side with its bias (BatchNorm: γ and β), so a masked channel is 0."""
    pruner = layer_pruner_for(module)
    if kind == IN:
        return pruner.in_channel_tensors(module)
    tensors = list(pruner.out_channel_tensors(module))
    if getattr(module, "bias", None) is not None:
        tensors.append(("bias", 0))
    return tensors


class _FloatView:
    """What an importance criterion reads the model through: ``get_submodule`` by the float model's paths,
    so it ranks a QAT model's groups as it ranks the float model's."""

    def __init__(self, modules: dict[str, nn.Module]) -> None:
        self._modules = modules

    def get_submodule(self, name: str) -> nn.Module:
        return self._modules[name]


def float_modules(model: nn.Module, groups: Sequence[ChannelGroup]) -> dict[str, nn.Module]:
    """The module of every member path of ``groups`` in the float ``model`` (before QAT layers go in: the
    wrappers keep these objects, so the map stays valid, and a deepcopy of the model copies it along)."""
    return {m.name: model.get_submodule(m.name) for g in groups for m in g.members if m.kind != OP}


def _pre_hook(module: nn.Module, _args) -> None:
    schedule = getattr(module, ATTR, None)
    if schedule is not None:
        schedule.before_forward(module.training)


def attach(model: nn.Module, schedule: ProgressivePruning, restored: bool = False) -> None:
    """Make ``model``'s forward apply (and grow) the masks; a module-level hook, so deepcopy keeps it working.
    ``restored``: the schedule's state comes from its file (restore), so no step 0 is taken."""
    setattr(model, ATTR, schedule)
    model.register_forward_pre_hook(_pre_hook)
    if restored:
        schedule.apply_masks()
        schedule._written = schedule.batches
    else:
        schedule.start()


def schedule_of(model: nn.Module) -> ProgressivePruning | None:
    return getattr(model, ATTR, None)


def carry_over(old: nn.Module, new: nn.Module) -> None:
    """After a re-capture of ``old`` into ``new`` (same module paths, before QAT layers go in): the schedule
    on ``new``'s modules. A plain module's deepcopy carries it already; a GraphModule's (torch.export
    capture) drops attributes and hooks."""
    schedule = schedule_of(old)
    if schedule is None or schedule_of(new) is not None:
        return
    moved = copy.copy(schedule)
    moved.groups = [copy.copy(g) for g in schedule.groups]
    moved.modules = {path: new.get_submodule(path) for path in schedule.modules}
    attach(new, moved, restored=True)


def copy_model(model: nn.Module) -> nn.Module:
    """``copy.deepcopy(model)`` that keeps the schedule on the copy's modules, also for a GraphModule."""
    memo: dict = {}
    copied = copy.deepcopy(model, memo)
    schedule = schedule_of(model)
    if schedule is None or schedule_of(copied) is not None:
        return copied
    missing = [path for path, m in schedule.modules.items() if id(m) not in memo]
    if missing:
        raise RuntimeError(f"copying the model lost the progressive pruning of {', '.join(missing[:3])}")
    attach(copied, copy.deepcopy(schedule, memo), restored=True)
    return copied


def remove_channels(model: nn.Module) -> None:
    """Save: physically remove the target channels from ``model`` (a copy of the trained model) and detach
    the schedule. A QAT layer loses them in its float layer, its BN and its per-channel weight scales."""
    schedule = schedule_of(model)
    if schedule is None:
        return
    cuts = schedule.final_cuts()
    schedule.apply_masks()
    wrappers = {id(w.layer): w for w in model.modules() if isinstance(w, QuantRetrainLayer)}
    plan = plan_from_cuts(cuts)
    for name, cut in plan.items():
        wrapper = wrappers.get(id(schedule.modules[name]))
        if wrapper is not None and OUT in cut:
            _slice_weight_scales(wrapper, schedule.modules[name], cut[OUT])
    apply_plan(_FloatView(schedule.modules), plan)  # apply_plan finds the modules by path only
    for wrapper in wrappers.values():
        wrapper.invalidate()
    delattr(model, ATTR)
    model._forward_pre_hooks = type(model._forward_pre_hooks)(
        (k, h) for k, h in model._forward_pre_hooks.items() if h is not _pre_hook
    )


def _slice_weight_scales(wrapper: QuantRetrainLayer, layer: nn.Module, removed: set[int]) -> None:
    """A learnable per-channel weight scale (ULQ) keeps the scales of the channels that stay; ARQ
    recomputes its scales from the weight at the next forward anyway."""
    quant = wrapper.weight_quant
    scales = getattr(quant, "wts_scales", None)
    channels = layer.weight.shape[0]
    if scales is None or scales.numel() != channels:
        return
    keep = torch.tensor([c for c in range(channels) if c not in removed], dtype=torch.long)
    with torch.no_grad():
        quant.wts_scales.data = quant.wts_scales.data.index_select(0, keep.to(scales.device)).clone()
        quant.wts_offsets.data = quant.wts_offsets.data.index_select(0, keep.to(scales.device)).clone()


def read_state(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"the prune records are progressive but {path} (their schedule state) is missing") from None
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"{path}: unknown prune schedule state format {state.get('format')!r}")
    return state


def restored_groups(state: dict, groups: Sequence[ChannelGroup], path: str) -> list[ScheduledGroup]:
    """The scheduled groups of ``state`` on the channel groups of the re-captured model (by producers)."""
    by_producers = {tuple(g.producer_names): g for g in groups}
    entries = []
    for item in state["groups"]:
        group = by_producers.get(tuple(item["producers"]))
        if group is None or group.size != item["channels"]:
            raise ValueError(
                f"{path}: the scheduled group of {', '.join(item['producers'])} "
                f"({item['channels']} channels) is not in this model"
            )
        schedule = None if item["schedule"] is None else PruneScheduleSpec(**item["schedule"])
        entries.append(
            ScheduledGroup(
                group,
                item["target_ratio"],
                item["ascend_optimized"],
                item["importance"],
                schedule,
                item["step"],
                tuple(item["masked"]),
            )
        )
    return entries
