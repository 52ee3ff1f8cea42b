"""Teacher-guided compressed retraining (issue 18): CE + α·KD against the FP32 model, usable from any loop."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import amct_engine.prune_retrain as amct
from amct_engine.teacher_guided import TeacherGuidedLoss, distillation_loss, teacher_guided_step
from examples.models import SmallFashionCnn
from job_process.training import make_loader, train_epochs


def _teacher() -> SmallFashionCnn:
    torch.manual_seed(0)
    return SmallFashionCnn().eval()


def _data(n: int = 64):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_kd_is_zero_for_a_student_equal_to_its_teacher_and_ce_weighs_in_with_labels():
    teacher = _teacher()
    x, y = _data(8)
    loss = TeacherGuidedLoss(teacher, alpha=1.0)
    assert float(loss(copy.deepcopy(teacher), x)) == pytest.approx(0.0, abs=1e-6)
    mixed = TeacherGuidedLoss(teacher, alpha=0.25, temperature=2.0)
    student = SmallFashionCnn().eval()
    with torch.no_grad():
        s, t = student(x), teacher(x)
    expected = 0.25 * distillation_loss(s, t, 2.0) + 0.75 * F.cross_entropy(s, y)
    assert float(mixed(student, x, y)) == pytest.approx(float(expected), rel=1e-5)
    assert float(mixed(student, x)) == pytest.approx(float(0.25 * distillation_loss(s, t, 2.0)), rel=1e-5)


def test_block_features_are_matched_where_the_shapes_agree():
    teacher = _teacher()
    student = copy.deepcopy(teacher)
    with torch.no_grad():
        student.conv2.weight.mul_(1.5)
    x, _ = _data(8)
    plain = TeacherGuidedLoss(teacher, alpha=1.0)
    with_blocks = TeacherGuidedLoss(
        teacher, alpha=1.0, feature_layers=["relu1", "relu2", "missing"], feature_weight=1.0
    )
    with torch.no_grad():
        gap = float(with_blocks(student, x)) - float(plain(student, x))
        expected = F.mse_loss(
            student.relu2(student.bn2(student.conv2(student.pool(student.relu1(student.bn1(student.conv1(x))))))),
            teacher.relu2(teacher.bn2(teacher.conv2(teacher.pool(teacher.relu1(teacher.bn1(teacher.conv1(x))))))),
        )
    assert gap == pytest.approx(float(expected) / 2, rel=1e-4)  # relu1 matches exactly: the mean of 0 and that


def test_the_teacher_is_never_trained_and_a_step_lowers_the_loss():
    teacher = _teacher()
    before = copy.deepcopy(teacher.state_dict())
    student = SmallFashionCnn()
    loss = TeacherGuidedLoss(teacher, alpha=0.5)
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    x, y = _data(32)
    first = teacher_guided_step(student, optimizer, loss, x, y)
    for _ in range(10):
        last = teacher_guided_step(student, optimizer, loss, x, y)
    assert last < first
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in before.items())


def test_train_epochs_takes_it_as_its_loss_on_a_compressed_model(tmp_path):
    cfg = tmp_path / "c.cfg"
    cfg.write_text(
        "prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 "
        "ascend_optimized: false } } }\nretrain_data_quant_config { ulq_quantize { } }\n"
        "retrain_weight_quant_config { arq_retrain { } }\n"
    )
    teacher = _teacher()
    torch.manual_seed(5)  # a student that starts far from its teacher
    x, y = _data()
    model = amct.create_compressed_retrain_model(SmallFashionCnn(), x[:2], str(cfg), str(tmp_path / "r.txt"))
    loss = TeacherGuidedLoss(teacher, alpha=1.0)  # labels unused: pure KD
    losses = train_epochs(model, make_loader(x, y, 16, seed=0), 4, 3e-3, loss_fn=loss)
    assert len(losses) == 16 and sum(losses[-4:]) < sum(losses[:4])
