"""Progressive filter pruning (the prune_schedule extension, amct_engine/prune/progressive.py)."""

from __future__ import annotations

import json

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import amct_engine.prune_retrain as amct
from amct_engine.config.errors import ConfigError
from amct_engine.prune import progressive
from examples.models import SmallFashionCnn

# SmallFashionCnn: conv1 16 → conv2 32 channels (the output Linear is never pruned)
SCHEDULE_CFG = (
    "prune_config {{\n  filter_pruner {{\n    balanced_l2_norm_filter_prune {{\n"
    '      prune_ratio: 0.5\n      ascend_optimized: false\n      importance: "group_l2"\n'
    "      prune_schedule {{ {schedule} }}\n    }}\n  }}\n}}\n"
)
ONE_SHOT_CFG = (
    "prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 "
    'ascend_optimized: false importance: "group_l2" } } }'
)
QUANT_CFG = (
    "retrain_data_quant_config { ulq_quantize { } }\n"
    "retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }\n"
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return SmallFashionCnn().eval()


def _batch(seed: int, n: int = 16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def _cfg(tmp_path, schedule="steps: 3 start_ratio: 0.2 interval: 2", extra="") -> str:
    path = tmp_path / "progressive.cfg"
    path.write_text(SCHEDULE_CFG.format(schedule=schedule) + extra)
    return str(path)


def _train(model, batches: int, start: int = 0) -> None:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for i in range(start, start + batches):
        x, y = _batch(i)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def _masked(model) -> dict[str, int]:
    """Zeroed output channels of conv1 and conv2 (a masked channel has its filter zeroed)."""
    return {
        name: int((getattr(model, name).weight.detach().flatten(1).abs().sum(1) == 0).sum())
        for name in ("conv1", "conv2")
    }


def _onnx_channels(path: str) -> dict[str, int]:
    """Output channels of every 3×3 conv weight in the file (initializers, or Constant nodes)."""
    graph = onnx.load(path).graph
    tensors = {i.name: list(i.dims) for i in graph.initializer}
    tensors.update({n.output[0]: list(n.attribute[0].t.dims) for n in graph.node if n.op_type == "Constant"})
    return {name: dims[0] for name, dims in tensors.items() if len(dims) == 4 and dims[2:] == [3, 3]}


def test_the_mask_grows_to_the_scheduled_counts_at_each_step(tmp_path):
    model = amct.create_prune_retrain_model(_model(), _batch(0)[0][:2], _cfg(tmp_path), str(tmp_path / "r.txt"))
    # step k masks round(C · (0.2 + 0.3 · k / 3)) channels; nothing is removed before save
    expected = [(3, 6), (5, 10), (6, 13), (8, 16)]  # (conv1 of 16, conv2 of 32) at steps 0..3
    assert model.conv1.out_channels == 16 and model.conv2.out_channels == 32
    model(_batch(0)[0])
    assert tuple(_masked(model).values()) == expected[0]
    seen = []
    for i in range(8):  # interval 2: a step after every 2 training batches, the last after 6
        _train(model, 1, start=i)
        model.eval()
        with torch.no_grad():
            model(_batch(100)[0])
        seen.append(tuple(_masked(model).values()))
    assert seen == [
        expected[0],
        expected[1],
        expected[1],
        expected[2],
        expected[2],
        expected[3],
        expected[3],
        expected[3],
    ]
    state = json.loads((tmp_path / "r.txt.prune_schedule.json").read_text())
    assert state["batches"] == 8 and [g["step"] for g in state["groups"]] == [3, 3]
    assert [len(g["masked"]) for g in state["groups"]] == [8, 16]
    report = model.amct_prune_report.summary()
    assert "progressive: 0.2 → 0.5 in 3 steps, one every 2 training batches" in report


def test_masked_forward_equals_the_saved_model_with_the_channels_removed(tmp_path):
    model = amct.create_prune_retrain_model(_model(), _batch(0)[0][:2], _cfg(tmp_path), str(tmp_path / "r.txt"))
    _train(model, 7)
    model.eval()
    x = _batch(50)[0]
    with torch.no_grad():
        masked = model(x)
    paths = amct.save_prune_retrain_model(model, str(tmp_path / "p"), x)
    import onnxruntime as ort

    session = ort.InferenceSession(paths["deploy"])
    saved = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    assert torch.allclose(masked, torch.from_numpy(saved), atol=1e-4)


def test_save_removes_as_many_channels_as_one_shot_pruning_even_before_the_last_step(tmp_path):
    one_shot_cfg = tmp_path / "one_shot.cfg"
    one_shot_cfg.write_text(ONE_SHOT_CFG)
    one_shot = amct.create_prune_retrain_model(_model(), _batch(0)[0][:2], str(one_shot_cfg), str(tmp_path / "o.txt"))
    expected = _onnx_channels(amct.save_prune_retrain_model(one_shot, str(tmp_path / "o"), _batch(0)[0][:2])["deploy"])
    model = amct.create_prune_retrain_model(_model(), _batch(0)[0][:2], _cfg(tmp_path), str(tmp_path / "r.txt"))
    _train(model, 2)  # step 1 of 3 only
    got = _onnx_channels(amct.save_prune_retrain_model(model, str(tmp_path / "p"), _batch(0)[0][:2])["deploy"])
    assert sorted(got.values()) == sorted(expected.values()) == [8, 16]
    assert model.conv1.out_channels == 16  # the trained model keeps its masks; only the saved copy lost channels
    assert model.amct_prune_report.params_after == one_shot.amct_prune_report.params_after


def test_restore_replays_the_schedule_exactly(tmp_path):
    cfg, record = _cfg(tmp_path), str(tmp_path / "r.txt")
    model = amct.create_prune_retrain_model(_model(), _batch(0)[0][:2], cfg, record)
    _train(model, 3)
    model.eval()
    with torch.no_grad():
        model(_batch(0)[0])  # the eval forward after training writes the batch count
    torch.save(model.state_dict(), tmp_path / "ckpt.pth")
    restored = amct.restore_prune_retrain_model(_model(), _batch(0)[0][:2], record, cfg, str(tmp_path / "ckpt.pth"))
    x = _batch(60)[0]
    model.eval(), restored.eval()
    with torch.no_grad():
        assert torch.equal(model(x), restored(x))
    ours, theirs = progressive.schedule_of(model), progressive.schedule_of(restored)
    assert theirs.batches == ours.batches == 3
    assert theirs.history == ours.history  # steps 0 and 1 of both groups, not taken again
    assert [(h["step"], h["masked"]) for h in ours.history] == [(0, 3), (0, 6), (1, 5), (1, 10)]
    assert [(e.step, e.masked) for e in theirs.groups] == [(e.step, e.masked) for e in ours.groups]
    # training on from there takes the same next step on both
    torch.manual_seed(5)
    _train(model, 3, start=3)
    torch.manual_seed(5)
    _train(restored, 3, start=3)
    model.eval(), restored.eval()
    with torch.no_grad():
        assert torch.equal(model(x), restored(x))  # the forward after batch 6 takes step 3 on both
    assert [e.masked for e in theirs.groups] == [e.masked for e in ours.groups]
    assert [e.step for e in ours.groups] == [3, 3]


def test_compressed_retrain_with_a_schedule_saves_an_int8_model_with_the_one_shot_channel_counts(tmp_path):
    cfg = _cfg(tmp_path, "steps: 2 start_ratio: 0.25 interval: 1", extra=QUANT_CFG)
    record = str(tmp_path / "r.txt")
    model = amct.create_compressed_retrain_model(_model(), _batch(0)[0][:2], cfg, record)
    _train(model, 3)
    model.eval()
    x = _batch(70)[0]
    with torch.no_grad():
        model(x)
    paths = amct.save_compressed_retrain_model(model, record, str(tmp_path / "c"), x)
    import onnxruntime as ort

    session = ort.InferenceSession(paths["deploy"])
    out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    assert out.shape == (16, 10)
    fake = ort.InferenceSession(paths["fake_quant"])
    fake_out = fake.run(None, {fake.get_inputs()[0].name: x.numpy()})[0]
    assert (out.argmax(1) == fake_out.argmax(1)).mean() >= 0.9
    assert sorted(_onnx_channels(paths["fake_quant"]).values()) == [8, 16]


@pytest.mark.parametrize(
    ("schedule", "where", "message"),
    [
        ("steps: 0 start_ratio: 0.1", "7:24", "prune_schedule needs steps >= 1, got 0"),
        (
            "steps: 2 start_ratio: 0.5",
            "7:33",
            "prune_schedule start_ratio must be >= 0 and below prune_ratio 0.5, got 0.5",
        ),
        ("steps: 2 interval: 0", "7:33", "prune_schedule needs interval >= 1"),
    ],
)
def test_a_bad_schedule_is_a_config_error_at_its_field(tmp_path, schedule, where, message):
    with pytest.raises(ConfigError, match=rf"progressive.cfg:{where}: {message}"):
        amct.create_prune_retrain_model(_model(), _batch(0)[0][:2], _cfg(tmp_path, schedule), str(tmp_path / "r.txt"))


def test_a_schedule_with_the_taylor_criterion_is_refused(tmp_path):
    cfg = tmp_path / "t.cfg"
    cfg.write_text(SCHEDULE_CFG.format(schedule="steps: 2").replace("group_l2", "taylor"))
    with pytest.raises(ConfigError, match=r"t.cfg:7:7: prune_schedule needs a weight-based importance"):
        amct.create_prune_retrain_model(_model(), _batch(0)[0][:2], str(cfg), str(tmp_path / "r.txt"))


def test_batch_norms_can_be_recalibrated_again_after_the_qat_layers_go_in(tmp_path):
    """recalibrate_quantized_bn: the BN inside conv1's QAT layer ends with the statistics of the
    fake-quantised conv output over the calibration batches (not of the float output)."""
    cfg = tmp_path / "c.cfg"
    cfg.write_text(ONE_SHOT_CFG + "\n" + QUANT_CFG)
    batches = [_batch(200 + i) for i in range(3)]
    kwargs = dict(calibration_data=batches, recalibrate_bn=True)
    float_only = amct.create_compressed_retrain_model(
        _model(), _batch(0)[0][:2], str(cfg), str(tmp_path / "a.txt"), **kwargs
    )
    model = amct.create_compressed_retrain_model(
        _model(), _batch(0)[0][:2], str(cfg), str(tmp_path / "b.txt"), recalibrate_quantized_bn=True, **kwargs
    )
    layer = model.conv1
    assert layer.act_quant.calibrated  # IFMR took its start from the first calibration batch
    with torch.no_grad():
        outputs = [
            F.conv2d(
                layer.act_quant(x),
                layer.weight_quant(layer.layer.weight),
                layer.layer.bias,
                padding=layer.layer.padding,
            )
            for x, _ in batches
        ]
    expected = torch.stack([y.mean(dim=(0, 2, 3)) for y in outputs]).mean(0)
    error = (layer.bn.running_mean - expected).abs().max()
    float_error = (float_only.conv1.bn.running_mean - expected).abs().max()  # the statistics of the float output
    assert error < 1e-6 < float_error / 10, (error, float_error)
    assert model.amct_prune_report.bn_recalibrated_quantized == 2
    assert "2 BatchNorms recalibrated on the fake-quantised model" in model.amct_prune_report.summary()
    assert float_only.amct_prune_report.bn_recalibrated_quantized == 0


class _ShapeBranchCnn(SmallFashionCnn):
    """torch.fx cannot trace a branch on an input size: captured with torch.export (a GraphModule)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] > 8:
            return super().forward(x)
        return super().forward(F.pad(x, (10, 10, 10, 10)))


def test_a_schedule_survives_the_torch_export_capture_of_a_compressed_model(tmp_path):
    cfg = _cfg(tmp_path, "steps: 2 start_ratio: 0.25 interval: 1", extra=QUANT_CFG)
    record = str(tmp_path / "r.txt")
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="torch.export"):
        model = amct.create_compressed_retrain_model(_ShapeBranchCnn().eval(), _batch(0)[0][:2], cfg, record)
    assert isinstance(model, torch.fx.GraphModule)
    assert progressive.schedule_of(model) is not None
    _train(model, 3)
    assert [e.step for e in progressive.schedule_of(model).groups] == [2, 2]
    model.eval()
    x = _batch(70)[0]
    with torch.no_grad():
        model(x)
    paths = amct.save_compressed_retrain_model(model, record, str(tmp_path / "c"), x)
    assert sorted(_onnx_channels(paths["fake_quant"]).values()) == [8, 16]
    assert model.amct_prune_report.params_after < model.amct_prune_report.params_before
