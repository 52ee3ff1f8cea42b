"""Teacher-guided compressed retraining: the FP32 model teaches the pruned / quantised one (our extension).

A compressed model retrained on labels alone forgets what the float model knew about the classes it
confuses; matching the float model's softened outputs (knowledge distillation, Hinton et al.) keeps
it, and needs no labels at all. ``TeacherGuidedLoss`` is a loss over ``(student, inputs, labels)``
that any training loop can call instead of its own (``job_process.training.train_epochs`` takes it
as ``loss_fn``; the service's ``objective`` uses the same object):

    loss = (1 - α) · CE(student(x), y) + α · T² · KL(softmax(teacher(x) / T) ‖ softmax(student(x) / T))
           + β · Σ_blocks MSE(student block output, teacher block output)

With no labels (``y`` is None) the CE term is left out. The block term matches module outputs by
path (the distill groups' last modules, docs/spec/engine.md §6.1), where the shapes agree: a pruned
block has fewer channels than the teacher's and is skipped. The teacher runs under ``no_grad`` in
eval mode and is never changed.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from contextlib import ExitStack

import torch
import torch.nn.functional as F
from torch import nn


class TeacherGuidedLoss:
    """CE + α·KD (+ β·block features) of a student against a frozen teacher; call it per batch."""

    def __init__(
        self,
        teacher: nn.Module,
        alpha: float = 0.7,
        temperature: float = 4.0,
        feature_layers: Sequence[str] = (),
        feature_weight: float = 0.0,
    ) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.teacher = copy.deepcopy(teacher).eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.alpha, self.temperature = alpha, temperature
        self.feature_layers, self.feature_weight = tuple(feature_layers), feature_weight

    def __call__(self, student: nn.Module, inputs, labels: torch.Tensor | None = None) -> torch.Tensor:
        """The loss of one batch; ``inputs`` is a tensor or a tuple of tensors."""
        inputs = inputs if isinstance(inputs, tuple) else (inputs,)
        layers = self.feature_layers if self.feature_weight else ()
        self.teacher.to(inputs[0].device)
        with torch.no_grad():
            teacher_out, teacher_feats = _forward_with_features(self.teacher, inputs, layers)
        student_out, student_feats = _forward_with_features(student, inputs, layers)
        loss = self.alpha * distillation_loss(student_out, teacher_out, self.temperature)
        if labels is not None and self.alpha < 1.0:
            loss = loss + (1.0 - self.alpha) * F.cross_entropy(student_out, labels.to(student_out.device))
        if layers:
            matched = [
                F.mse_loss(s, teacher_feats[n])
                for n, s in student_feats.items()
                if teacher_feats.get(n) is not None and s.shape == teacher_feats[n].shape
            ]
            if matched:
                loss = loss + self.feature_weight * torch.stack(matched).mean()
        return loss


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """T² · KL(teacher ‖ student) of the temperature-softened class distributions (batch mean)."""
    t = temperature
    return F.kl_div(
        F.log_softmax(student_logits / t, dim=-1),
        F.log_softmax(teacher_logits / t, dim=-1),
        reduction="batchmean",
        log_target=True,
    ) * (t * t)


def teacher_guided_step(
    student: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss: TeacherGuidedLoss,
    inputs,
    labels: torch.Tensor | None = None,
) -> float:
    """One optimisation step of ``student`` on one batch; returns the loss value."""
    optimizer.zero_grad(set_to_none=True)
    value = loss(student, inputs, labels)
    value.backward()
    optimizer.step()
    return float(value.detach())


def _forward_with_features(model: nn.Module, inputs, layers: Sequence[str]):
    """The model's output, and the outputs of the modules at ``layers`` (by path) during that forward."""
    features: dict[str, torch.Tensor] = {}
    with ExitStack() as stack:
        for name in layers:
            module = _find(model, name)
            if module is not None:
                handle = module.register_forward_hook(lambda _m, _i, out, n=name: features.__setitem__(n, out))
                stack.callback(handle.remove)
        output = model(*inputs)
    return output, features


def _find(model: nn.Module, name: str) -> nn.Module | None:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None
