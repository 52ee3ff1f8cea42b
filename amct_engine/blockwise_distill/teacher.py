"""Where the teacher's block inputs and outputs come from: computed live, or dumped once.

`data_dump` (docs/spec/engine.md §3.1) runs the teacher once per batch for all groups and keeps the block
inputs/outputs in a private temporary directory that is always removed (AMCT used a fixed
`./tmp`). Both sources yield, per training step, the model inputs, the teacher's input of a stage
(groups that read the same tensor) and the teacher's output of each of its groups.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from amct_engine.blockwise_distill.blocks import group_input, run_chain
from amct_engine.blockwise_distill.sample import DistillSampleBase, model_inputs

Step = tuple[tuple[torch.Tensor, ...], torch.Tensor, list[torch.Tensor]]


def _to(inputs: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(device) for t in inputs)


class LiveTeacher:
    """Recomputes the teacher's group input/output for every step."""

    def __init__(self, teacher, groups, loader: Iterable, sample: DistillSampleBase, device):
        self.teacher, self.groups, self.loader, self.sample, self.device = teacher, groups, loader, sample, device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @torch.no_grad()
    def steps(self, epoch: int, stage: list[int]) -> Iterator[Step]:
        """One partial teacher forward per batch serves every group of the stage."""
        for batch in self.loader:
            inputs = _to(model_inputs(self.sample, batch), self.device)
            teacher_in = group_input(self.teacher, self.groups[stage[0]][0], inputs)
            yield inputs, teacher_in, [run_chain(self.groups[g], teacher_in) for g in stage]


class DumpedTeacher:
    """Runs the teacher once per batch for every group; steps read the files back."""

    def __init__(self, teacher, groups, loader: Iterable, sample: DistillSampleBase, device, epochs: int):
        self.teacher, self.groups, self.loader, self.sample, self.device = teacher, groups, loader, sample, device
        self.epochs = epochs
        self._dir: tempfile.TemporaryDirectory | None = None
        self._counts: list[int] = []

    def __enter__(self):
        self._dir = tempfile.TemporaryDirectory(prefix="amct_distill_dump_")
        for epoch in range(self.epochs):
            self._counts.append(self._dump_epoch(epoch))
        return self

    def __exit__(self, *exc):
        self._dir.cleanup()
        return False

    def _path(self, epoch: int, step: int) -> str:
        return os.path.join(self._dir.name, f"e{epoch}_s{step}.pt")

    @torch.no_grad()
    def _dump_epoch(self, epoch: int) -> int:
        step = -1
        for step, batch in enumerate(self.loader):
            inputs = _to(model_inputs(self.sample, batch), self.device)
            captured = self._group_inputs(inputs)
            blocks = [(captured[i], run_chain(modules, captured[i])) for i, modules in enumerate(self.groups)]
            torch.save(
                {"inputs": [t.cpu() for t in inputs], "blocks": [(i.cpu(), o.cpu()) for i, o in blocks]},
                self._path(epoch, step),
            )
        return step + 1

    def _group_inputs(self, inputs) -> dict[int, torch.Tensor]:
        """One teacher forward, a pre-hook on each group's first module."""
        captured: dict[int, torch.Tensor] = {}
        handles = [
            modules[0].register_forward_pre_hook(lambda _m, args, i=i: captured.setdefault(i, args[0]))
            for i, modules in enumerate(self.groups)
        ]
        try:
            self.teacher(*inputs)
        finally:
            for handle in handles:
                handle.remove()
        return captured

    def steps(self, epoch: int, stage: list[int]) -> Iterator[Step]:
        for step in range(self._counts[epoch]):
            saved = torch.load(self._path(epoch, step), weights_only=True)
            teacher_in = saved["blocks"][stage[0]][0]
            outputs = [saved["blocks"][g][1].to(self.device) for g in stage]
            yield _to(tuple(saved["inputs"]), self.device), teacher_in.to(self.device), outputs


def teacher_source(teacher: nn.Module, groups, loader, sample, device, epochs: int, data_dump: bool):
    if data_dump:
        return DumpedTeacher(teacher, groups, loader, sample, device, epochs)
    return LiveTeacher(teacher, groups, loader, sample, device)
