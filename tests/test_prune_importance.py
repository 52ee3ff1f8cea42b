"""Importance criteria beside BCP (group L2, Taylor), their cfg extension field, the report, and BatchNorm
recalibration after physical pruning (issue 18; docs/spec/engine.md §2.2 "Extensions", docs/spec/engine.md §4.4)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import amct_engine.prune_retrain as amct
from amct_engine.calibration import calibration_batches, recalibrate_batch_norm
from amct_engine.config.errors import ConfigError
from amct_engine.graph.capture import capture_model
from amct_engine.prune.dependency import build_channel_groups
from amct_engine.prune.importance import IMPORTANCE_CRITERIA, ImportanceData, prepare_criterion
from examples.models import SmallFashionCnn


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = SmallFashionCnn()
    model.train()
    with torch.no_grad():
        for seed in range(3):
            model(_images(seed))
    return model.eval()


def _images(seed: int, n: int = 16) -> torch.Tensor:
    return torch.randn(n, 1, 28, 28, generator=torch.Generator().manual_seed(seed))


def _batches(count: int = 3):
    return [
        (_images(10 + i), torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(i))) for i in range(count)
    ]


def _groups(model):
    deps = build_channel_groups(capture_model(model, _images(0)[:2]))
    return {g.producer_names[0]: g for g in deps.groups}


def test_group_l2_sums_the_squares_of_every_weight_a_channel_touches():
    model = _model()
    conv1 = _groups(model)["conv1"]
    expected = (
        model.conv1.weight.detach().square().sum(dim=(1, 2, 3))
        + model.bn1.weight.detach().square()
        + model.conv2.weight.detach().square().sum(dim=(0, 2, 3))
    )
    assert torch.allclose(IMPORTANCE_CRITERIA["group_l2"](conv1, model), expected.double())
    # conv2's channels reach fc as blocks of 7x7 features after the flatten
    conv2 = _groups(model)["conv2"]
    fc_columns = model.fc.weight.detach().square().sum(dim=0).reshape(32, 49).sum(dim=1)
    expected = model.conv2.weight.detach().square().sum(dim=(1, 2, 3)) + model.bn2.weight.detach().square() + fc_columns
    assert torch.allclose(IMPORTANCE_CRITERIA["group_l2"](conv2, model), expected.double())


def test_taylor_scores_weight_times_gradient_over_the_calibration_batches():
    model = _model()
    data = ImportanceData([((x,), y) for x, y in _batches()])
    taylor = prepare_criterion(IMPORTANCE_CRITERIA["taylor"], model, data)
    reference = _model()
    for inputs, labels in data.batches:
        F.cross_entropy(reference(*inputs), labels).backward()
    w, g = reference.conv1.weight.detach(), reference.conv1.weight.grad
    bn, bn_g = reference.bn1.weight.detach(), reference.bn1.weight.grad
    w2, g2 = reference.conv2.weight.detach(), reference.conv2.weight.grad
    expected = (w * g).abs().sum(dim=(1, 2, 3)) + (bn * bn_g).abs() + (w2 * g2).abs().sum(dim=(0, 2, 3))
    assert torch.allclose(taylor(_groups(model)["conv1"], model), expected.double(), rtol=1e-5)
    assert all(p.grad is None for p in model.parameters())  # the model is left as it was


def test_taylor_without_calibration_data_says_what_it_needs(tmp_path):
    cfg = tmp_path / "p.cfg"
    cfg.write_text(
        'prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 importance: "taylor" } } }'
    )
    with pytest.raises(ValueError, match="taylor importance criterion needs calibration batches"):
        amct.create_prune_retrain_model(_model(), _images(0)[:2], str(cfg), str(tmp_path / "r.txt"))


def test_the_cfg_names_the_criterion_and_the_report_says_which_ranked_each_group(tmp_path):
    cfg = tmp_path / "p.cfg"
    cfg.write_text(
        "prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 "
        'ascend_optimized: false importance: "group_l2" } } }\n'
        'override_layer_configs { layer_name: "conv2" prune_config { filter_pruner { '
        "balanced_l2_norm_filter_prune { prune_ratio: 0.5 ascend_optimized: false } } } }\n"
    )
    model = amct.create_prune_retrain_model(_model(), _images(0)[:2], str(cfg), str(tmp_path / "r.txt"))
    decisions = {g.producers[0]: g for g in model.amct_prune_report.pruned_groups}
    assert decisions["conv1"].importance == "group_l2" and decisions["conv2"].importance == "bcp"
    assert "ranked by group_l2" in model.amct_prune_report.summary()
    # the channels group L2 ranks lowest are the ones that went
    reference = _model()
    scores = IMPORTANCE_CRITERIA["group_l2"](_groups(reference)["conv1"], reference)
    kept = sorted(torch.argsort(scores, stable=True)[8:].tolist())
    assert torch.equal(model.conv1.weight, reference.conv1.weight[kept])


def test_an_unknown_criterion_is_a_config_error_at_its_field(tmp_path):
    cfg = tmp_path / "p.cfg"
    cfg.write_text(
        "prune_config {\n  filter_pruner {\n    balanced_l2_norm_filter_prune {\n      prune_ratio: 0.5\n"
        '      importance: "taylr"\n    }\n  }\n}\n'
    )
    with pytest.raises(
        ConfigError,
        match=r'p.cfg:5:7: importance "taylr" is not a pruning importance criterion; '
        r"known: bcp, group_l2, taylor",
    ):
        amct.create_prune_retrain_model(_model(), _images(0)[:2], str(cfg), str(tmp_path / "r.txt"))


def test_an_amct_cfg_without_the_extension_prunes_as_before(tmp_path):
    cfg = tmp_path / "p.cfg"
    cfg.write_text(
        "prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 ascend_optimized: false } } }"
    )
    model = amct.create_prune_retrain_model(
        _model(), _images(0)[:2], str(cfg), str(tmp_path / "r.txt"), calibration_data=_batches(), recalibrate_bn=False
    )
    from amct_engine.prune.bcp import bcp_importance

    reference = _model()
    kept = sorted(torch.argsort(bcp_importance(_groups(reference)["conv1"], reference), stable=True)[8:].tolist())
    assert torch.equal(model.conv1.weight, reference.conv1.weight[kept])
    assert torch.equal(model.bn1.running_mean, reference.bn1.running_mean[kept])  # recalibration was off


def test_batch_norms_are_recalibrated_on_the_pruned_model(tmp_path):
    cfg = tmp_path / "p.cfg"
    cfg.write_text(
        "prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 ascend_optimized: false } } }"
    )
    batches = _batches()
    model = amct.create_prune_retrain_model(
        _model(), _images(0)[:2], str(cfg), str(tmp_path / "r.txt"), calibration_data=batches
    )
    assert model.amct_prune_report.bn_recalibrated == 2
    # bn2 holds the statistics of its pruned input over the three batches (cumulative average)
    with torch.no_grad():
        feats = [model.conv2(model.pool(model.relu1(model.bn1(model.conv1(x))))) for x, _ in batches]
    means = torch.stack([f.mean(dim=(0, 2, 3)) for f in feats]).mean(dim=0)
    assert torch.allclose(model.bn2.running_mean, means, atol=1e-3)
    assert not model.training and model.bn2.momentum == 0.1


def test_recalibration_leaves_parameters_and_other_modules_alone():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items() if "running" not in k and "num_batches" not in k}
    assert recalibrate_batch_norm(model, calibration_batches(_batches(), limit=2)) == 2
    after = model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())
    assert int(model.bn1.num_batches_tracked) == 2


def test_calibration_batches_take_labels_only_when_they_are_class_indices():
    loader = [(_images(1), torch.zeros(16, dtype=torch.long)), (_images(2), torch.zeros(16, 3)), _images(3)]
    batches = calibration_batches(loader, limit=3)
    assert [b.labels is not None for b in batches] == [True, False, False]
    with pytest.raises(ValueError, match="no batch"):
        calibration_batches([], limit=2)
