"""distill_outputs mixed with the labels (`distill_alpha`, issue 38 item 6), without a server: the loss is the
engine's KD + CE mix, the job rules refuse the mix where it cannot apply, naming the field, and the report's
pruning section counts heads and channels apart."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from amct_engine.prune.report import DISABLED, NOT_CONFIGURED, PRUNED, GroupDecision, PruneReport
from amct_engine.teacher_guided import TeacherGuidedLoss, distillation_loss
from job_host.spec import JobParams
from job_process.objectives import OutputDistillLoss, build_loss
from job_process.runners import pruning_section
from service.job_rules import JobRuleError, check_data
from tests.signature_models import TwoHeadCnn

LOGITS = {"type": "tensor", "shape": [2, 10], "dtype": "float32"}


def _pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 10)).eval()
    student = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 10))
    with torch.no_grad():
        student[1].weight.copy_(teacher[1].weight + 0.3 * torch.randn_like(teacher[1].weight))
    return teacher, student


def test_distill_alpha_mixes_kd_and_cross_entropy_as_the_engine_does():
    teacher, student = _pair()
    x, labels = (torch.randn(16, 3, 4),), torch.randint(0, 10, (16,))
    mixed = OutputDistillLoss(teacher, {"output": "kl"}, 2.0, torch.device("cpu"), alpha=0.5)
    alone = OutputDistillLoss(teacher, {"output": "kl"}, 2.0, torch.device("cpu"))
    with torch.no_grad():
        kd = distillation_loss(student(*x), teacher(*x), 2.0)
        ce = F.cross_entropy(student(*x), labels)
        engine = TeacherGuidedLoss(teacher, alpha=0.5, temperature=2.0)(student, x, labels)
        assert float(mixed(student, x, labels)) == pytest.approx(float(0.5 * kd + 0.5 * ce), rel=1e-6)
        assert float(mixed(student, x, labels)) == pytest.approx(float(engine), rel=1e-6)
        # Without labels, and at the default alpha of 1, the loss is the distillation alone.
        assert float(mixed(student, x, None)) == pytest.approx(float(kd), rel=1e-6)
        assert float(alone(student, x, labels)) == pytest.approx(float(kd), rel=1e-6)


def test_build_loss_mixes_only_where_the_dataset_has_labels():
    model = TwoHeadCnn().eval()
    params = JobParams(objective="distill_outputs", distill_alpha=0.25, temperature=2.0)
    assert build_loss(params, model, None, True, torch.device("cpu")).alpha == 0.25
    assert build_loss(params, model, None, False, torch.device("cpu")).alpha == 1.0


def _description(has_labels: bool) -> dict:
    arrays = {"inputs": {"dtype": "float32", "shape": [64, 12]}}
    if has_labels:
        arrays["labels"] = {"dtype": "int64", "shape": [64], "min": 0, "max": 9}
    return {"arrays": arrays, "has_labels": has_labels, "samples": 64}


@pytest.mark.parametrize(
    ("objective", "has_labels", "says"),
    [
        ("distill_outputs", False, "which it lacks; leave distill_alpha at 1"),
        ("cross_entropy", True, "this job trains with cross_entropy"),
    ],
)
def test_distill_alpha_below_1_is_refused_where_it_cannot_mix(objective, has_labels, says):
    inputs = [{"name": "input", "shape": ["batch", 12], "dtype": "float32"}]
    params = JobParams(objective=objective, distill_alpha=0.5)
    with pytest.raises(JobRuleError, match=says) as refused:
        check_data("compressed_retrain", params, _description(has_labels), inputs, LOGITS, ("data", "model"))
    assert refused.value.field == "distill_alpha"
    mixed = JobParams(objective="distill_outputs", distill_alpha=0.5)
    assert check_data("compressed_retrain", mixed, _description(True), inputs, LOGITS, ("d", "m")) == "distill_outputs"


@pytest.mark.parametrize("alpha", [-0.1, 1.5])
def test_distill_alpha_is_a_weight_between_0_and_1(alpha):
    with pytest.raises(ValidationError) as refused:
        JobParams(distill_alpha=alpha)
    assert refused.value.errors()[0]["loc"] == ("distill_alpha",)
    assert "distill_alpha" not in JobParams(objective="distill_outputs").stored()  # the default is not stored


def test_the_pruning_section_counts_heads_and_channels_apart():
    report = PruneReport(params_before=100, params_after=60)
    report.groups = [
        GroupDecision(0, ["l0.q", "l0.k", "l0.v"], ["l0.out"], 12, 6, PRUNED, unit="heads"),
        GroupDecision(1, ["l0.ffn"], ["l0.down"], 1536, 768, PRUNED),
        GroupDecision(2, ["l0.down"], [], 384, 384, DISABLED, reason="a residual add"),
        GroupDecision(3, ["head"], [], 5, 5, NOT_CONFIGURED),
    ]
    section = pruning_section(report)
    assert section["heads"] == {"groups": 1, "before": 12, "after": 6}
    assert section["channels"] == {"groups": 1, "before": 1536, "after": 768}
    assert section["parameters"] == {"before": 100, "after": 60} and section["not_pruned"] == 1
    assert [g["unit"] for g in section["groups"]] == ["heads", "channels"]
    assert "12 → 6 heads" in report.groups[0].describe()
