"""Distillation (docs/spec/engine.md §1.5, §3.1, §6): config JSON, student creation, block-wise loop, save."""

from __future__ import annotations

import copy
import json
import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import amct_engine as amct
from amct_engine.config.errors import ConfigError
from amct_engine.quant.retrain_layer import QuantRetrainLayer
from amct_engine.record import RecordFile
from tests.deploy_targets import record_exact_target
from tests.models import BranchesNet, ConvBnReluNet

# Copies of ../shared/examples, so the suite runs from any checkout.
EXAMPLES = os.path.join(os.path.dirname(__file__), "fixtures", "cfg")
INPUT = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(0))


def _loader(n=64, batch=16, labels=True):
    x = torch.randn(n, 1, 28, 28, generator=torch.Generator().manual_seed(5))
    if labels:
        return DataLoader(TensorDataset(x, torch.zeros(n, dtype=torch.long)), batch_size=batch)
    return DataLoader(x, batch_size=batch)


def _teacher():
    torch.manual_seed(0)
    model = ConvBnReluNet()
    model.train()
    with torch.no_grad():  # realistic BN statistics
        for xb, _ in _loader():
            model(xb)
    return model.eval()


def _config(tmp_path, model, cfg=None):
    path = tmp_path / "distill.json"
    amct.create_distill_config(str(path), model, INPUT, cfg)
    return path


def test_default_config_has_one_group_per_conv_bn_relu_and_per_layer_entries(tmp_path):
    data = json.loads(_config(tmp_path, ConvBnReluNet()).read_text())
    assert data["distill_group"] == [["conv1", "bn", "relu"], ["conv2", "bn2", "relu2"], ["fc"]]
    with open(os.path.join(EXAMPLES, "distill_config_int8.json")) as f:
        example = json.load(f)
    for key in ("version", "batch_num", "group_size", "data_dump"):
        assert data[key] == example[key]
    assert data["conv1"] == example["conv1"] and data["conv2"] == example["conv2"]
    assert data["fc"]["distill_weight_config"] == {"algo": "arq_distill", "channel_wise": False, "dst_type": "INT8"}


@pytest.mark.parametrize("kind", ["script", "trace"])
def test_torchscript_files_give_the_same_config(tmp_path, kind):
    model = ConvBnReluNet().eval()
    ts = torch.jit.script(model) if kind == "script" else torch.jit.trace(model, INPUT)
    path = tmp_path / "m.pt"
    torch.jit.save(ts, str(path))
    from_module = json.loads(_config(tmp_path, model).read_text())
    out = tmp_path / "ts.json"
    amct.create_distill_config(str(out), str(path), INPUT)
    assert json.loads(out.read_text()) == from_module


class FullCfgNet(nn.Module):
    """Module names that distill_full.cfg refers to."""

    def __init__(self):
        super().__init__()
        self.layer1 = nn.Conv2d(3, 8, 3, padding=1)
        self.layer2 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.layer3 = nn.Conv2d(8, 8, 3, padding=1)
        self.layer4 = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.layer4(self.layer3(self.relu(self.layer2(self.layer1(x)))))


class FullCfgNetWithHead(FullCfgNet):
    """FullCfgNet plus a Linear head: a real layer type for the example's placeholder types."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(super().forward(x).mean(dim=(2, 3)))


def test_distill_full_cfg_overrides_reach_the_json(tmp_path):
    path = tmp_path / "full.json"
    example = os.path.join(EXAMPLES, "distill_full.cfg")
    # placeholder layer types in the example: AMCT raises for them (docs/spec/engine.md §1.1), so do we
    with pytest.raises(ConfigError, match=r'distill_full.cfg:26:1: layer type "type1" in quant_skip_layer_types'):
        amct.create_distill_config(str(path), FullCfgNet(), torch.randn(1, 3, 8, 8), example)
    cfg = tmp_path / "full.cfg"
    with open(example) as f:
        cfg.write_text(f.read().replace('"type1"', '"Linear"').replace('"type2"', '"Linear"'))
    amct.create_distill_config(str(path), FullCfgNetWithHead(), torch.randn(1, 3, 8, 8), str(cfg))
    data = json.loads(path.read_text())
    assert data["data_dump"] is True
    assert data["distill_group"][0] == ["layer1", "layer2"]
    assert data["layer1"]["distill_data_config"] == {
        "algo": "ulq_quantize",
        "clip_max": 6.0,
        "clip_min": -6.0,
        "fixed_min": True,
        "dst_type": "INT8",
    }
    assert data["layer3"] == {"quant_enable": False}
    assert data["layer4"]["distill_data_config"]["clip_max"] == 3.0
    assert data["layer4"]["distill_weight_config"] == {"algo": "arq_distill", "channel_wise": False, "dst_type": "INT8"}


def test_linear_layers_get_per_channel_weights_only_when_asked_by_an_override(tmp_path):
    global_cw = "distill_weight_quant_config: { arq_distill: { channel_wise: true } }\n"
    linear_cw = (
        'distill_override_layer_types: { layer_type: "Linear" '
        "distill_weight_quant_config: { arq_distill: { channel_wise: true } } }\n"
    )
    found = {}
    for name, text in (("global", global_cw), ("linear", linear_cw)):
        cfg = tmp_path / f"{name}.cfg"
        cfg.write_text(text)
        data = json.loads(_config(tmp_path, ConvBnReluNet(), str(cfg)).read_text())
        found[name] = (
            data["conv1"]["distill_weight_config"]["channel_wise"],
            data["fc"]["distill_weight_config"]["channel_wise"],
        )
    # A global setting is meant for convs (AMCT keeps Linear per-tensor); a Linear override is honoured.
    assert found == {"global": (True, False), "linear": (True, True)}
    student = amct.create_distill_model(str(tmp_path / "distill.json"), ConvBnReluNet(), INPUT)
    assert student.fc.weight_quant.channel_wise and student.fc.weight_quant.wts_scales.numel() == 10


def test_activation_clips_start_from_the_asymmetric_search(tmp_path):
    teacher = _teacher()
    student = amct.create_distill_model(str(_config(tmp_path, teacher)), teacher, INPUT)
    with torch.no_grad():
        student.eval()(INPUT)
    # conv2 reads a ReLU output: all 256 codes go to [0, clip_max], none to negative values.
    quant = student.conv2.act_quant
    assert quant.acts_clip_min.item() == 0.0 and quant.acts_offset.item() == -128
    assert quant.acts_clip_max.item() > 0
    # conv1 reads the signed input: the range keeps the data's minimum instead of -clip_max.
    first = student.conv1.act_quant
    assert first.acts_clip_min.item() == pytest.approx(INPUT.min().item(), abs=first.acts_scale.item())


def test_missing_cfg_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        amct.create_distill_config(str(tmp_path / "d.json"), ConvBnReluNet(), INPUT, str(tmp_path / "none.cfg"))


def test_create_distill_model_swaps_in_quantised_layers_and_keeps_bn(tmp_path):
    model = ConvBnReluNet()
    student = amct.create_distill_model(str(_config(tmp_path, model)), model, INPUT)
    assert isinstance(student.conv1, QuantRetrainLayer) and isinstance(student.fc, QuantRetrainLayer)
    assert isinstance(student.bn, nn.BatchNorm2d) and student.conv1.bn is None
    assert student.conv1.following_bn == "bn"
    assert student.conv2.act_quant.fixed_min is False  # the distill path does not detect ReLUs
    assert isinstance(model.conv1, nn.Conv2d)


def _student_error(teacher, student, x):
    with torch.no_grad():
        return float(torch.mean((teacher(x) - student.eval()(x)) ** 2))


def _to_a4w4(config):
    data = json.loads(config.read_text())
    for name in ("conv1", "conv2", "fc"):
        data[name]["distill_data_config"]["dst_type"] = "INT4"
        data[name]["distill_weight_config"]["dst_type"] = "INT4"
    config.write_text(json.dumps(data))


def test_distill_trains_group_by_group_and_brings_the_student_closer(tmp_path):
    teacher = _teacher()
    config = _config(tmp_path, teacher)
    _to_a4w4(config)  # 4 bits: a quantisation error large enough to reduce
    student = amct.create_distill_model(str(config), teacher, INPUT)
    calibrated = copy.deepcopy(student)
    amct.distill(teacher, calibrated, str(config), _loader(), epochs=1, lr=0.0)  # calibration only
    events, fc_weights = [], []

    def progress(event):
        events.append(event)
        fc_weights.append(student.fc.layer.weight.detach().clone())

    amct.distill(teacher, student, str(config), _loader(labels=False), epochs=2, lr=1e-4, progress=progress)
    assert [e["group"] for e in events] == [0] * 8 + [1] * 8 + [2] * 8
    assert events[-1]["step"] == events[-1]["total_steps"] == 3 * 2 * 4
    # Only the current group's parameters move: fc (group 2) is untouched while groups 0 and 1 train.
    assert all(torch.equal(w, fc_weights[0]) for w in fc_weights[:16])
    assert not torch.equal(fc_weights[-1], fc_weights[0])
    ratios = []  # the second epoch sees the same 4 batches: its loss over the first epoch's
    for group in (0, 1, 2):
        losses = [e["loss"] for e in events if e["group"] == group]
        ratios.append(np.mean(losses[4:]) / np.mean(losses[:4]))
    assert max(ratios) < 1.02 and np.mean(ratios) < 0.9, ratios
    x = torch.randn(32, 1, 28, 28)
    assert _student_error(teacher, student, x) < _student_error(teacher, calibrated, x)


def test_data_dump_gives_the_same_student_and_leaves_no_files(tmp_path):
    teacher = _teacher()
    config = _config(tmp_path, teacher)
    student = amct.create_distill_model(str(config), teacher, INPUT)
    dumped_config = tmp_path / "dump.json"
    data = json.loads(config.read_text())
    data["data_dump"] = True
    dumped_config.write_text(json.dumps(data))
    live, dumped = copy.deepcopy(student), copy.deepcopy(student)

    def dump_dirs():
        return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("amct_distill_dump_")}

    before = dump_dirs()
    amct.distill(teacher, live, str(config), _loader(), epochs=1)
    amct.distill(teacher, dumped, str(dumped_config), _loader(), epochs=1)
    assert dump_dirs() <= before
    for (name, a), (_, b) in zip(live.state_dict().items(), dumped.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, msg=name)


def test_a_user_optimizer_keeps_all_its_hyper_parameters(tmp_path):
    created = []

    class RecordingSGD(torch.optim.SGD):
        def __init__(self, params, **kwargs):
            created.append(kwargs)
            super().__init__(params, **kwargs)

    teacher = _teacher()
    config = _config(tmp_path, teacher)
    student = amct.create_distill_model(str(config), teacher, INPUT)
    user = RecordingSGD([nn.Parameter(torch.zeros(1))], lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
    amct.distill(teacher, student, str(config), _loader(), optimizer=user)
    assert len(created) == 1 + 3
    assert all(c["momentum"] == 0.9 and c["nesterov"] and c["weight_decay"] == 1e-4 for c in created[1:])


def test_clear_errors(tmp_path):
    teacher = _teacher()
    config = _config(tmp_path, teacher)
    student = amct.create_distill_model(str(config), teacher, INPUT)
    with pytest.raises(ValueError, match="epochs"):
        amct.distill(teacher, student, str(config), _loader(), epochs=0)
    with pytest.raises(OSError):
        amct.distill(teacher, student, str(tmp_path / "none.json"), _loader())
    with pytest.raises(ValueError, match="empty"):
        amct.distill(teacher, student, str(config), DataLoader(TensorDataset(torch.zeros(0, 1, 28, 28))))

    class DictSample(amct.DistillSampleBase):
        @staticmethod
        def get_model_input_data(samples):
            return {"x": samples[0]}

    with pytest.raises(RuntimeError, match="tensor"):
        amct.distill(teacher, student, str(config), _loader(), sample_instance=DictSample())
    data = json.loads(config.read_text())
    data["distill_group"] = [["conv1", "conv2"]]
    config.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="single module chain"):
        amct.distill(teacher, student, str(config), _loader())


def test_save_writes_record_next_to_the_models_and_folds_bn(tmp_path):
    teacher = _teacher()
    config = _config(tmp_path, teacher)
    student = amct.create_distill_model(str(config), teacher, INPUT)
    amct.distill(teacher, student, str(config), _loader(), epochs=1)
    paths = amct.save_distill_model(
        student, str(tmp_path / "out" / "student"), INPUT, deploy_target=record_exact_target()
    )
    assert paths["record"] == str(tmp_path / "out" / "student_record.txt")
    assert set(RecordFile(paths["record"]).quant_layers()) == {"conv1", "conv2", "fc"}
    deploy = onnx.load(paths["deploy"])
    assert "BatchNormalization" not in {n.op_type for n in deploy.graph.node}
    with torch.no_grad():
        expected = student.eval()(INPUT).numpy()
    for path in (paths["fake_quant"], paths["deploy"]):
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        out = session.run(None, {session.get_inputs()[0].name: INPUT.numpy()})[0]
        # BN is folded at save: a rounding may flip against the unfolded student, one step at most.
        np.testing.assert_allclose(out, expected, atol=1e-2 * np.abs(expected).max())
    ascend = amct.save_distill_model(student, str(tmp_path / "asc") + "/", INPUT, deploy_format="ascend")
    assert ascend["deploy"].endswith("asc/deploy_model.onnx") and os.path.exists(ascend["record"])


def test_groups_do_not_share_quantisers_so_a_trained_group_stays_as_it_was(tmp_path):
    teacher = BranchesNet().eval()
    x = torch.randn(8, 3, 8, 8)
    config = tmp_path / "branches.json"
    amct.create_distill_config(str(config), teacher, x)
    student = amct.create_distill_model(str(config), teacher, x)
    assert student.branch1.act_quant is not student.branch2.act_quant
    loader = DataLoader(torch.randn(32, 3, 8, 8), batch_size=8)
    amct.distill(teacher, student, str(config), loader, epochs=1)
    refrozen = copy.deepcopy(student)
    for module in refrozen.modules():
        if isinstance(module, QuantRetrainLayer):
            module.invalidate()
    with torch.no_grad():
        assert torch.equal(student(x), refrozen.eval()(x))


def test_groups_reading_one_tensor_train_in_one_pass(tmp_path):
    teacher = BranchesNet().eval()
    x = torch.randn(8, 3, 8, 8)
    config = tmp_path / "branches.json"
    amct.create_distill_config(str(config), teacher, x)
    assert json.loads(config.read_text())["distill_group"] == [["stem", "relu"], ["branch1"], ["branch2"]]
    student = amct.create_distill_model(str(config), teacher, x)
    stem_calls, events = [], []
    student.stem.register_forward_hook(lambda *_: stem_calls.append(1))
    loader = DataLoader(torch.randn(32, 3, 8, 8), batch_size=8)
    amct.distill(teacher, student, str(config), loader, epochs=1, progress=events.append)
    # Calibration, the stem group's own steps, then one partial forward per batch that serves both
    # branch groups (one after the other would take two).
    assert len(stem_calls) == 1 + len(loader) + len(loader)
    assert [e["group"] for e in events] == [0] * 4 + [1, 2] * 4
