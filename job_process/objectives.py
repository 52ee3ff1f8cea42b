"""The loss a retrain job trains with, picked by its `objective` (job_host/objective_names.py).

- `cross_entropy`: the first output against `labels` (train_epochs' own loss; today's behaviour).
- `mse` / `l1`: each output that has a target array (named after it, or `targets`) against it.
- `distill_outputs`: the original FP32 model (the uploaded file, loaded again in this child, eval
  mode, frozen) is the teacher on the same batch; every output of the student matches the teacher's:
  `kl` is the temperature-softened class-distribution loss of knowledge distillation
  (amct_engine.teacher_guided.distillation_loss, T² · KL), `mse` the mean squared difference,
  `cosine` 1 − cosine similarity per sample. `auto`: kl for a classifier's logits (the dataset has
  labels and the first output is [batch, classes]), mse otherwise. No labels are needed; with them,
  `distill_alpha` < 1 mixes in cross-entropy: distill_alpha · distillation + (1 − distill_alpha) · CE of
  the first output against the labels (amct_engine.teacher_guided.TeacherGuidedLoss's mix).

Each loss is a `loss_fn(model, inputs, targets)` for job_process.training.train_epochs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from amct_engine.teacher_guided import distillation_loss
from job_host.objective_names import CROSS_ENTROPY, TARGET_OBJECTIVES
from job_host.signature import flatten_outputs, output_leaves
from job_host.spec import JobParams
from job_process.training import forward


def _output_names(outputs: dict | None) -> list[str]:
    return [name for name, _ in output_leaves(outputs)] if outputs else ["output"]


def target_loss(kind: str, outputs: dict | None):
    """mse / l1 of the outputs that have targets."""
    names, measure = _output_names(outputs), F.mse_loss if kind == "mse" else F.l1_loss

    def loss(model, x, targets: dict[str, torch.Tensor]) -> torch.Tensor:
        produced = dict(zip(names, flatten_outputs(forward(model, x)), strict=False))
        terms = [measure(produced[name], t.to(produced[name].dtype)) for name, t in targets.items()]
        return torch.stack(terms).sum()

    return loss


def _leaf_loss(choice: str, temperature: float):
    if choice == "kl":
        return lambda s, t: distillation_loss(s, t, temperature)
    if choice == "cosine":
        return lambda s, t: (1 - F.cosine_similarity(s.flatten(1), t.flatten(1), dim=1)).mean()
    return F.mse_loss


def leaf_choices(distill_loss: str, outputs: dict | None, has_labels: bool) -> dict[str, str]:
    """The loss of each output under `distill_loss` (auto resolved); recorded in the report."""
    leaves = output_leaves(outputs) if outputs else [("output", {"shape": []})]
    choices = {}
    for index, (name, leaf) in enumerate(leaves):
        if distill_loss != "auto":
            choices[name] = distill_loss
        else:
            # The labels score the first output (cross_entropy's); that one is the classifier's logits.
            classifier = index == 0 and has_labels and len(leaf.get("shape", [])) == 2 and leaf["shape"][1] > 1
            choices[name] = "kl" if classifier else "mse"
    return choices


class OutputDistillLoss:
    """distill_outputs: the student's outputs against the frozen FP32 teacher's on the same batch."""

    def __init__(
        self, teacher: torch.nn.Module, choices: dict[str, str], temperature: float, device, alpha: float = 1.0
    ) -> None:
        self.teacher = teacher.eval().to(device)  # the job's FP32 model, loaded once by the job process
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.losses = [_leaf_loss(choices[name], temperature) for name in choices]
        self.alpha = alpha  # the distillation's weight; 1 - alpha goes to cross-entropy on the labels

    def __call__(self, model, x, labels=None) -> torch.Tensor:
        with torch.no_grad():
            teacher = flatten_outputs(forward(self.teacher, x))
        student = flatten_outputs(forward(model, x))
        terms = [fn(s.float(), t.float()) for fn, s, t in zip(self.losses, student, teacher, strict=True)]
        loss = torch.stack(terms).sum()
        if self.alpha < 1.0 and isinstance(labels, torch.Tensor):
            ce = F.cross_entropy(student[0].float(), labels.to(student[0].device))
            loss = self.alpha * loss + (1.0 - self.alpha) * ce
        return loss


def build_loss(params: JobParams, original: torch.nn.Module, outputs: dict | None, has_labels: bool, device):
    """The `loss_fn` of the job's objective; None means train_epochs' cross-entropy."""
    objective = params.objective or CROSS_ENTROPY
    if objective in TARGET_OBJECTIVES:
        return target_loss(objective, outputs)
    if objective == "distill_outputs":
        choices = leaf_choices(params.distill_loss, outputs, has_labels)
        alpha = params.distill_alpha if has_labels else 1.0  # the API refuses distill_alpha < 1 without labels
        return OutputDistillLoss(original, choices, params.temperature, device, alpha)
    return None
