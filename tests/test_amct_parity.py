"""Defects found by reproducing cases of AMCT's own test suite (docs/spec/engine.md §7), on our own models.

Each test pins one case: the compressed API with per-tensor ARQ and fixed ULQ clips on a net whose Linear
works on the last axis of a 4-D tensor (AMCT's ``model_002_compressed.cfg`` on ``DefaultNet``), a
hand-written distill JSON on a conv → Linear net (AMCT's ``Conv2dLinear``), a user optimizer with
``data_dump``, cfg references the model lacks, a norm on another axis than the Linear's channels
(AMCT's ``LinearIn4``), and AMCT's QAT class names.
"""

from __future__ import annotations

import inspect
import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import amct_engine as amct
from amct_engine.blockwise_distill.optim import rebuild_optimizer
from amct_engine.config.errors import ConfigError
from amct_engine.quant.retrain_layer import QuantRetrainLayer


class ConvRowsNet(nn.Module):
    """conv+BN+ReLU twice, then a Linear over the last axis (rows of 32) with a BatchNorm2d of axis 1
    after it, then a head. Input [N, 6, 8, 32]."""

    input_shape = (4, 6, 8, 32)

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(6, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 6, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(6)
        self.relu2 = nn.ReLU()
        self.rows = nn.Linear(32, 32)
        self.rows_bn = nn.BatchNorm2d(6)
        self.relu3 = nn.ReLU()
        self.head = nn.Linear(6 * 8 * 32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu2(self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x))))))
        x = self.relu3(self.rows_bn(self.rows(x)))
        return self.head(torch.flatten(x, 1))


class ConvThenLastAxisLinear(nn.Module):
    """Conv2d → BN2d → Linear on the last axis → BN2d of the conv's channels → ReLU. Input [N, 3, 16, 16]."""

    input_shape = (4, 3, 16, 16)

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 24, 3)
        self.bn = nn.BatchNorm2d(24)
        self.fc = nn.Linear(14, 20, bias=False)
        self.bn2 = nn.BatchNorm2d(24)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn2(self.fc(self.bn(self.conv(x)))))


class LinearOnImages(nn.Module):
    """AMCT's LinearIn4 shape: Linear(16→64) on the last axis, BatchNorm2d(3) of axis 1, Linear(64→32),
    BatchNorm2d(3), ReLU, Linear(32→10). Input [N, 3, 16, 16]."""

    input_shape = (4, 3, 16, 16)

    def __init__(self) -> None:
        super().__init__()
        self.layer1 = nn.Linear(16, 64)
        self.layer2 = nn.BatchNorm2d(3)
        self.layer3 = nn.Linear(64, 32, bias=False)
        self.layer4 = nn.BatchNorm2d(3)
        self.layer5 = nn.ReLU()
        self.layer6 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(1, 7):
            x = getattr(self, f"layer{i}")(x)
        return x


def _trained(model_cls: type[nn.Module]) -> nn.Module:
    """A model with BN statistics of real batches (a fresh BN folds to the identity and hides bugs)."""
    torch.manual_seed(0)
    model = model_cls()
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(*model_cls.input_shape))
    return model.eval()


def _input(model_cls, seed: int = 1) -> torch.Tensor:
    return torch.randn(*model_cls.input_shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------- defect 1


PER_TENSOR_BCP_CFG = """
retrain_data_quant_config { ulq_quantize { clip_max_min { clip_max: 6.0 clip_min: -6.0 } fixed_min: true } }
retrain_weight_quant_config { arq_retrain { channel_wise: false dst_type: INT8 } }
prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.3 ascend_optimized: false } } }
"""


def test_bcp_with_per_tensor_arq_and_fixed_clips_trains_restores_and_saves(tmp_path):
    # AMCT's model_002_compressed.cfg; the Linear over rows is followed by a BatchNorm2d of axis 1,
    # which must not be folded into it (6 factors for 32 rows was the shape error)
    cfg, record, pth = tmp_path / "c.cfg", tmp_path / "record.txt", tmp_path / "m.pth"
    cfg.write_text(PER_TENSOR_BCP_CFG)
    x = _input(ConvRowsNet)
    model = amct.create_compressed_retrain_model(_trained(ConvRowsNet), x, str(cfg), str(record))
    assert model.conv1.layer.out_channels == 11  # 16 - round(16 * 0.3)
    assert model.rows.bn is None and isinstance(model.rows_bn, nn.BatchNorm2d)
    assert model.conv1.weight_quant.wts_scales.numel() == 1  # per tensor, as the cfg asks
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for seed in range(2):
        model(_input(ConvRowsNet, seed)).square().mean().backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        expected = model(x)
    torch.save(model.state_dict(), pth)
    restored = amct.restore_compressed_retrain_model(_trained(ConvRowsNet), x, str(cfg), str(record), str(pth))
    restored.eval()
    with torch.no_grad():
        assert torch.equal(restored(x), expected)
    paths = amct.save_compressed_retrain_model(restored, str(record), str(tmp_path / "out"), x)
    assert all(p.endswith(".onnx") for p in paths.values())


# ---------------------------------------------------------------------- defect 2 and 3


def _hand_written_distill_json(path, data_dump: bool = False) -> None:
    """A distill JSON as AMCT's docs write it (docs/spec/engine.md §3.1), not by create_distill_config."""
    layer = {"quant_enable": True, "distill_data_config": {"algo": "ulq_quantize", "dst_type": "INT8"}}
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "batch_num": 1,
                "group_size": 1,
                "data_dump": data_dump,
                "distill_group": [["conv", "bn"], ["fc", "bn2", "relu"]],
                "conv": {
                    **layer,
                    "distill_weight_config": {"algo": "arq_distill", "channel_wise": True, "dst_type": "INT8"},
                },
                "fc": {
                    **layer,
                    "distill_weight_config": {"algo": "arq_distill", "channel_wise": False, "dst_type": "INT8"},
                },
            },
            indent=4,
        )
    )


def _images_loader(model_cls, batches: int = 3) -> DataLoader:
    x = torch.randn(4 * batches, *model_cls.input_shape[1:], generator=torch.Generator().manual_seed(3))
    return DataLoader(TensorDataset(x), batch_size=4)


def test_hand_written_distill_json_on_a_conv_then_last_axis_linear(tmp_path):
    config = tmp_path / "distill.json"
    _hand_written_distill_json(config)
    teacher, x = _trained(ConvThenLastAxisLinear), _input(ConvThenLastAxisLinear)
    student = amct.create_distill_model(str(config), teacher, x)
    amct.distill(teacher, student, str(config), _images_loader(ConvThenLastAxisLinear), epochs=1)
    assert student.fc.following_bn is None  # bn2 normalises the conv's 24 channels, not fc's 20 features
    paths = amct.save_distill_model(student, str(tmp_path / "s"), x)
    with torch.no_grad():
        assert torch.isfinite(student(x)).all()
    assert set(paths) >= {"fake_quant", "deploy", "record"}


def test_distill_with_a_user_adamw_and_data_dump(tmp_path):
    config = tmp_path / "distill.json"
    _hand_written_distill_json(config, data_dump=True)
    teacher, x = _trained(ConvThenLastAxisLinear), _input(ConvThenLastAxisLinear)
    student = amct.create_distill_model(str(config), teacher, x)
    user = torch.optim.AdamW(student.parameters(), lr=2e-4, weight_decay=0.05, betas=(0.8, 0.9))
    losses = []
    amct.distill(
        teacher,
        student,
        str(config),
        _images_loader(ConvThenLastAxisLinear),
        epochs=2,
        optimizer=user,
        progress=lambda e: losses.append(e["loss"]),
    )
    assert len(losses) == 2 * 2 * 3 and all(torch.isfinite(torch.tensor(losses)))


def _optimizer_classes():
    return sorted(
        (
            cls
            for cls in vars(torch.optim).values()
            if inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer
        ),
        key=lambda c: c.__name__,
    )


@pytest.mark.parametrize("cls", _optimizer_classes(), ids=lambda c: c.__name__)
def test_every_torch_optimizer_is_rebuilt_with_its_hyper_parameters(cls):
    # 2-D parameters: every optimizer takes them (Muon takes nothing else)
    first, second = nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(3, 2))
    kwargs = {"lr": 0.0123} if "lr" in inspect.signature(cls.__init__).parameters else {}
    user = cls([first], **kwargs)
    rebuilt = rebuild_optimizer(user, [second])
    assert type(rebuilt) is cls and rebuilt.param_groups[0]["params"] == [second]
    for key, value in user.param_groups[0].items():
        if key != "params":
            assert rebuilt.param_groups[0][key] == value, key


@pytest.mark.parametrize(
    "cls", [torch.optim.SGD, torch.optim.AdamW, torch.optim.LBFGS, torch.optim.Rprop], ids=lambda c: c.__name__
)
def test_distill_trains_with_user_optimizers_that_need_a_closure_or_not(tmp_path, cls):
    config = tmp_path / "distill.json"
    _hand_written_distill_json(config)
    teacher, x = _trained(ConvThenLastAxisLinear), _input(ConvThenLastAxisLinear)
    student = amct.create_distill_model(str(config), teacher, x)
    amct.distill(
        teacher,
        student,
        str(config),
        _images_loader(ConvThenLastAxisLinear, 2),
        epochs=1,
        optimizer=cls(student.parameters(), lr=1e-3),
    )


# ---------------------------------------------------------------------- defect 4


def test_an_override_naming_a_missing_layer_is_a_config_error(tmp_path):
    cfg = tmp_path / "c.cfg"
    cfg.write_text(
        PER_TENSOR_BCP_CFG + 'override_layer_configs {\n  layer_name: "conv_1"\n'
        "  retrain_weight_quant_config { arq_retrain { channel_wise: true } }\n}\n"
    )
    with pytest.raises(ConfigError) as info:
        amct.create_compressed_retrain_model(
            _trained(ConvRowsNet), _input(ConvRowsNet), str(cfg), str(tmp_path / "r.txt")
        )
    assert (info.value.line, info.value.column) == (6, 3)
    assert 'layer "conv_1" in override_layer_configs[0].layer_name is not in the model (did you mean "conv1"' in str(
        info.value
    )


def test_an_override_of_an_unsupported_type_is_a_config_error(tmp_path):
    cfg = tmp_path / "q.cfg"
    cfg.write_text(
        'override_layer_types {\n  layer_type: "Conv2D"\n  retrain_data_quant_config { ulq_quantize { } }\n}\n'
    )
    with pytest.raises(
        ConfigError,
        match=r'q.cfg:2:3: layer type "Conv2D" in override_layer_types\[0\].layer_type '
        r'is not a supported layer type \(did you mean "Conv2d", ',
    ):
        amct.create_quant_retrain_config(str(tmp_path / "q.json"), _trained(ConvRowsNet), _input(ConvRowsNet), str(cfg))


def test_a_distill_override_of_a_type_the_model_lacks_is_a_config_error(tmp_path):
    cfg = tmp_path / "d.cfg"
    cfg.write_text('distill_override_layer_types {\n  layer_type: "ConvTranspose2d"\n}\n')
    with pytest.raises(ConfigError, match=r'd.cfg:2:3: layer type "ConvTranspose2d"'):
        amct.create_distill_config(str(tmp_path / "d.json"), _trained(ConvRowsNet), _input(ConvRowsNet), str(cfg))


# ---------------------------------------------------------------------- defect 5


def test_a_norm_of_another_axis_lets_the_linear_channels_through(tmp_path):
    cfg, record, pth = tmp_path / "p.cfg", tmp_path / "r.txt", tmp_path / "p.pth"
    cfg.write_text("prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 } } }")
    x = _input(LinearOnImages)
    model = amct.create_prune_retrain_model(_trained(LinearOnImages), x, str(cfg), str(record))
    assert (model.layer1.out_features, model.layer3.in_features, model.layer3.out_features) == (32, 32, 16)
    assert model.layer6.in_features == 16 and model.layer2.num_features == 3  # the norms keep their 3 channels
    model.eval()
    with torch.no_grad():
        expected = model(x)
    assert expected.shape == (4, 3, 16, 10)
    torch.save(model.state_dict(), pth)
    restored = amct.restore_prune_retrain_model(_trained(LinearOnImages), x, str(record), str(cfg), str(pth)).eval()
    with torch.no_grad():
        assert torch.equal(restored(x), expected)


# ---------------------------------------------------------------------- defect 6


def test_quantised_layers_carry_amct_class_names(tmp_path):
    config = tmp_path / "distill.json"
    _hand_written_distill_json(config)
    student = amct.create_distill_model(str(config), _trained(ConvThenLastAxisLinear), _input(ConvThenLastAxisLinear))
    assert type(student.conv).__name__ == "Conv2dQAT" and type(student.fc).__name__ == "LinearQAT"
    assert isinstance(student.conv, QuantRetrainLayer) and isinstance(student.fc, QuantRetrainLayer)

    class Decoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.ConvTranspose2d(4, 4, 2, stride=2)
            self.conv = nn.Conv1d(4, 4, 1)

        def forward(self, x):
            return self.conv(self.up(x).flatten(2))

    x = torch.randn(2, 4, 4, 4)
    amct.create_quant_retrain_config(str(tmp_path / "q.json"), Decoder(), x)
    qmodel = amct.create_quant_retrain_model(str(tmp_path / "q.json"), Decoder(), str(tmp_path / "r.txt"), x)
    assert [type(qmodel.up).__name__, type(qmodel.conv).__name__] == ["ConvTranspose2dQAT", "Conv1dQAT"]
    assert all(isinstance(m, QuantRetrainLayer) for m in (qmodel.up, qmodel.conv))
