"""The block-wise distillation loop (docs/spec/engine.md §6.2), labels never needed."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch
from torch import fx, nn
from tqdm import tqdm

from amct_engine.blockwise_distill.blocks import group_input, pick_student_input, resolve_group, run_chain
from amct_engine.blockwise_distill.optim import rebuild_optimizer
from amct_engine.blockwise_distill.sample import DistillSampleBase, ModelSingleTensorInput, model_inputs
from amct_engine.blockwise_distill.teacher import teacher_source
from amct_engine.config.quant_json import DISTILL, read_json_config
from amct_engine.graph.analysis import quantizable_layers
from amct_engine.graph.capture import CapturedModel, capture_model
from amct_engine.layer_table import distill_type_names
from amct_engine.quant.retrain_layer import QuantRetrainLayer

ProgressFn = Callable[[dict], None]
CLIP_LR, WEIGHT_SCALE_LR = 0.1, 1e-4  # docs/spec/engine.md §6.2 default optimizer


def distill(
    model,
    compress_model: nn.Module,
    config_file,
    train_loader,
    epochs: int = 1,
    lr: float = 1e-3,
    sample_instance: DistillSampleBase | None = None,
    loss: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    progress: ProgressFn | None = None,
) -> nn.Module:
    """Train each distill group of `compress_model` to reproduce the float `model`'s block output.

    Groups go in topological order; only the current group's parameters are optimised. Consecutive
    groups whose first modules read the same tensor (a transformer's query, key and value) train in
    the same pass over the data (`_stages`). `progress` receives `{group, epoch, step, total_steps,
    loss}` after every step of every group; without it a progress bar is drawn when stderr is a
    terminal.
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an integer >= 1, got {epochs!r}")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"distill config not found: {config_file}")
    sample = sample_instance or ModelSingleTensorInput()
    first = _first_batch(train_loader)
    captured = capture_model(model, model_inputs(sample, first))
    teacher = captured.module.eval()
    layer_types = {info.name: info.type_name for info in quantizable_layers(captured, distill_type_names())}
    config = read_json_config(config_file, DISTILL, layer_types)
    device = next(compress_model.parameters()).device
    teacher.to(device)
    for names in config.distill_groups:
        check_module_chain(captured, names)
    groups = [
        (names, resolve_group(teacher, names, "teacher"), resolve_group(compress_model, names, "student"))
        for names in config.distill_groups
    ]
    _calibrate(compress_model, train_loader, sample, config.batch_num, device)
    steps = _steps_per_epoch(train_loader)
    report = _reporter(progress, len(groups) * epochs * steps if steps else None)
    with teacher_source(
        teacher, [g[1] for g in groups], train_loader, sample, device, epochs, config.data_dump
    ) as source:
        for stage in _stages(captured, config.distill_groups):
            members = [(index, groups[index][0], groups[index][2]) for index in stage]
            _train_stage(compress_model, members, source, epochs, lr, loss or nn.MSELoss(), optimizer, report)
    report(None)
    # Layers frozen while later groups trained re-derive their factors at the next eval forward.
    for module in compress_model.modules():
        if isinstance(module, QuantRetrainLayer):
            module.invalidate()
    return compress_model.eval()


def check_module_chain(captured: CapturedModel, names: list[str]) -> None:
    """A group runs its modules one after another, so each must feed only the next (docs/spec/engine.md §6.2)."""
    for name in names:
        if captured.call_count(name) != 1:
            raise ValueError(f"distill group {names}: module {name!r} is not called exactly once by the model")
    for current, following in zip(names, names[1:], strict=False):
        users = captured.consumers(current)
        if len(users) != 1 or users[0].op != "call_module" or users[0].target != following:
            raise ValueError(
                f"distill group {names} is not a single module chain: the output of {current!r} "
                f"does not go only to {following!r}"
            )


def _first_batch(loader):
    for batch in loader:
        return batch
    raise ValueError("train_loader is empty")


def _steps_per_epoch(loader) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


@torch.no_grad()
def _calibrate(student: nn.Module, loader, sample, batch_num: int, device) -> None:
    """IFMR initialisation of the activation quantisers over `batch_num` batches (docs/spec/engine.md §6.2 step 1).

    Eval mode, so BN running statistics stay those of the float model.
    """
    student.eval()
    for count, batch in enumerate(loader):
        if count == batch_num:
            break
        student(*(t.to(device) for t in model_inputs(sample, batch)))


def _stages(captured: CapturedModel, groups: list[list[str]]) -> list[list[int]]:
    """Consecutive groups whose first modules read the same tensor form one stage.

    Training one of them changes neither that tensor nor the other groups' outputs (each group is
    a module chain of its own), so training them side by side on the same batches gives what
    training them one after another does, with one partial forward per batch instead of one per
    group: a third of MiniLM's forwards.
    """
    stages: list[list[int]] = []
    previous = None
    for index, names in enumerate(groups):
        node = captured.nodes_of(names[0])[0]
        source = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
        if stages and source is not None and source is previous:
            stages[-1].append(index)
        else:
            stages.append([index])
        previous = source
    return stages


def _train_stage(student, members, source, epochs, lr, loss_fn, user_optimizer, report) -> None:
    """Train the groups of one stage; `members` holds (group index, names, student modules)."""
    optimizers = [_group_optimizer(user_optimizer, modules, _unique_params(modules), lr) for _, _, modules in members]
    # The rest of the student runs frozen in eval mode; the stage's quantised layers train.
    student.eval()
    for _, _, modules in members:
        for module in modules:
            if isinstance(module, QuantRetrainLayer):
                module.train()
    first = members[0][2][0]
    stage = [index for index, _, _ in members]
    for epoch in range(epochs):
        for step, (inputs, teacher_in, teacher_outs) in enumerate(source.steps(epoch, stage)):
            with torch.no_grad():
                student_in = pick_student_input(teacher_in, group_input(student, first, inputs))
            for (index, names, modules), optimizer, teacher_out in zip(members, optimizers, teacher_outs, strict=True):
                value = _group_step(names, modules, optimizer, loss_fn, student_in, teacher_out)
                report({"group": index, "group_names": names, "epoch": epoch, "step": step, "loss": value})
    for _, _, modules in members:
        for module in modules:
            module.eval()


def _group_step(names, modules, optimizer, loss_fn, student_in, teacher_out) -> float:
    output = run_chain(modules, student_in)
    if output.numel() != teacher_out.numel():
        raise RuntimeError(
            f"distill group {names}: student output has {output.numel()} elements, the teacher's {teacher_out.numel()}"
        )
    target = teacher_out.reshape(output.shape)
    first = [loss_fn(output, target)]

    def closure():  # every torch optimizer takes one; LBFGS calls it several times
        optimizer.zero_grad(set_to_none=True)
        value = first.pop() if first else loss_fn(run_chain(modules, student_in), target)
        value.backward()
        return value

    return float(optimizer.step(closure).detach())


def _unique_params(modules: list[nn.Module]) -> list[nn.Parameter]:
    seen, params = set(), []
    for module in modules:
        for param in module.parameters():
            if param.requires_grad and id(param) not in seen:
                seen.add(id(param))
                params.append(param)
    return params


def _group_optimizer(user_optimizer, modules, params, lr: float) -> torch.optim.Optimizer:
    """A fresh optimizer over this group's parameters.

    A user optimizer is re-created with *all* its hyper-parameters (AMCT kept only lr; optim.py). The
    default is AMCT's AdamW with larger steps for the clips and smaller ones for learned weight scales.
    """
    if user_optimizer is not None:
        return rebuild_optimizer(user_optimizer, params)
    clips, scales = [], []
    for module in modules:
        for name, param in module.named_parameters():
            if name.endswith(("acts_clip_max", "acts_clip_min")):
                clips.append(param)
            elif name.endswith(("wts_scales", "wts_offsets")):
                scales.append(param)
    special = {id(p) for p in clips + scales}
    clips = list({id(p): p for p in clips}.values())
    groups = [{"params": [p for p in params if id(p) not in special], "lr": lr}]
    if clips:
        groups.append({"params": clips, "lr": CLIP_LR})
    if scales:
        groups.append({"params": scales, "lr": WEIGHT_SCALE_LR})
    return torch.optim.AdamW([g for g in groups if g["params"]])


def _reporter(progress: ProgressFn | None, total_steps: int | None) -> Callable[[dict | None], None]:
    """Counts global steps; calls `progress` or draws a bar on a terminal. `None` closes it."""
    bar = None
    if progress is None and sys.stderr.isatty():
        bar = tqdm(total=total_steps, desc="distill", unit="step")
    done = 0

    def report(event: dict | None) -> None:
        nonlocal done
        if event is None:
            if bar is not None:
                bar.close()
            return
        done += 1
        event = {**event, "step": done, "total_steps": total_steps}
        if progress is not None:
            progress(event)
        elif bar is not None:
            bar.update(1)
            # Shown from 1, as `amct distill-config` and the service's events number groups (the
            # callback's `group` stays the 0-based index into distill_group).
            bar.set_postfix(group=event["group"] + 1, loss=f"{event['loss']:.4g}")

    return report
