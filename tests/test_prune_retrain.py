"""Prune retrain API (docs/spec/engine.md §1.3): BCP filter pruning on real graph shapes, restore, save, the report."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

import amct_engine.prune_retrain as amct
from amct_engine.config.errors import ConfigError
from amct_engine.prune.records import read_prune_records
from amct_engine.prune.report import NOT_CONFIGURED, PRUNED, RESTORED
from tests.prune_models import EltwiseConv, HardcodedViewNet, PruneResNet, example_input

FILTER_50 = "prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 } } }\n"


def _cfg(tmp_path, text: str, name: str = "prune.cfg") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _train_steps(model: nn.Module, shape, steps: int = 3) -> None:
    gen = torch.Generator().manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model.train()
    for _ in range(steps):
        loss = model(torch.randn((4, *shape[1:]), generator=gen)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.fixture
def pruned_resnet(tmp_path):
    torch.manual_seed(0)
    model = PruneResNet()
    record = tmp_path / "record.txt"
    pruned = amct.create_prune_retrain_model(model, example_input(PruneResNet), _cfg(tmp_path, FILTER_50), str(record))
    return model, pruned, record


def test_half_pruning_keeps_the_forward_and_removes_over_40_percent(pruned_resnet):
    model, pruned, _ = pruned_resnet
    assert pruned(example_input(PruneResNet)).shape == (2, 10)
    assert _params(pruned) <= 0.6 * _params(model)
    assert pruned.layer2.conv2.out_channels == 32 and pruned.fc.in_features == 16 * 16
    assert pruned.dw.groups == pruned.dw.in_channels == pruned.dw.out_channels == 32


def test_ascend_optimized_leaves_multiples_of_16_channels(pruned_resnet):
    model, pruned, _ = pruned_resnet
    originals = dict(model.named_modules())
    changed = [
        (n, m)
        for n, m in pruned.named_modules()
        if isinstance(m, nn.Conv2d) and m.out_channels != originals[n].out_channels
    ]
    assert len(changed) >= 8
    assert all(m.out_channels % 16 == 0 for _, m in changed)


def test_both_sides_of_each_residual_add_lose_the_same_channels(pruned_resnet):
    _, pruned, record = pruned_resnet
    merged = {}
    for rec in read_prune_records(record):
        indices = {n.name: list(next(a for a in n.attr if a.name == "prune_index").ints) for n in rec.producer}
        merged.update({tuple(indices): indices} if len(indices) > 1 else {})
    assert set(merged) == {("conv1", "layer1.conv2"), ("layer2.downsample.0", "layer2.conv2")}
    for indices in merged.values():
        first, second = indices.values()
        assert first == second and len(first) == len(set(first)) > 0
    assert pruned.conv1.out_channels == pruned.layer1.conv2.out_channels == pruned.layer1.bn2.num_features


def test_report_says_what_was_pruned_and_why_not(pruned_resnet):
    report = pruned_resnet[1].amct_prune_report
    by_producer = {tuple(g.producers): g for g in report.groups}
    assert by_producer[("conv1", "layer1.conv2")].status == PRUNED
    assert by_producer[("conv1", "layer1.conv2")].kept == 16
    assert "model output" in by_producer[("fc",)].reason
    assert report.params_after < report.params_before
    assert "32 → 16 channels" in report.summary()


def test_restore_replays_the_record_bit_exactly(tmp_path, pruned_resnet):
    _, pruned, record = pruned_resnet
    _train_steps(pruned, PruneResNet.input_shape)
    pruned.eval()
    x = example_input(PruneResNet, seed=5)
    with torch.no_grad():
        expected = pruned(x)
    torch.save({"net": pruned.state_dict()}, tmp_path / "pruned.pth")
    restored = amct.restore_prune_retrain_model(
        PruneResNet(),
        example_input(PruneResNet),
        str(record),
        _cfg(tmp_path, FILTER_50),
        str(tmp_path / "pruned.pth"),
        state_dict_name="net",
    ).eval()
    with torch.no_grad():
        assert torch.equal(restored(x), expected)
    assert [g.status for g in restored.amct_prune_report.groups] == ["replayed"] * 7


def test_save_writes_the_pruned_float_model_twice(tmp_path, pruned_resnet):
    _, pruned, _ = pruned_resnet
    pruned.eval()
    x = example_input(PruneResNet)
    paths = amct.save_prune_retrain_model(
        pruned, str(tmp_path / "out"), x, input_names=["x"], dynamic_axes={"x": {0: "n"}}
    )
    assert Path(paths["deploy"]).read_bytes() == Path(paths["fake_quant"]).read_bytes()
    session = ort.InferenceSession(paths["deploy"], providers=["CPUExecutionProvider"])
    x4 = example_input(PruneResNet, seed=3).repeat(2, 1, 1, 1)
    with torch.no_grad():
        np.testing.assert_allclose(session.run(None, {"x": x4.numpy()})[0], pruned(x4).numpy(), atol=1e-4)


def test_add_merged_grouped_convs_keep_120_of_160(tmp_path):
    cfg = _cfg(
        tmp_path,
        "prune_config { filter_pruner { balanced_l2_norm_filter_prune "
        "{ prune_ratio: 0.25 ascend_optimized: false } } }",
    )
    pruned = amct.create_prune_retrain_model(EltwiseConv(), example_input(EltwiseConv), cfg, str(tmp_path / "r.txt"))
    assert [pruned.get_submodule(f"layer{i}.0").out_channels for i in range(1, 5)] == [120] * 4
    assert pruned.layer5[0].in_channels == 120 and pruned.layer5[0].groups == 2
    assert pruned.layer5[0].out_channels == 80  # feeds the output
    y1, y2 = pruned(example_input(EltwiseConv))
    assert y1.shape[1] == y2.shape[1] == 80


def test_a_group_that_breaks_the_forward_is_restored_with_a_warning(tmp_path, caplog):
    cfg = _cfg(
        tmp_path,
        "prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 ascend_optimized: false } } }",
    )
    with caplog.at_level(logging.WARNING, logger="amct_engine.prune"):
        pruned = amct.create_prune_retrain_model(
            HardcodedViewNet(), example_input(HardcodedViewNet), cfg, str(tmp_path / "r.txt")
        )
    assert pruned.conv1.out_channels == 8 and pruned.conv2.out_channels == 16
    restored = [g for g in pruned.amct_prune_report.groups if g.status == RESTORED]
    assert [g.producers for g in restored] == [["conv2"]]
    assert "regular_prune_skip_layers" in caplog.text and "conv2" in caplog.text
    assert len(read_prune_records(tmp_path / "r.txt")) == 1


def test_skip_lists_and_overrides_pick_each_layers_prune(tmp_path):
    cfg = _cfg(
        tmp_path,
        FILTER_50
        + """
        skip_layers: "pw"
        regular_prune_skip_layers: "layer2.conv1"
        override_layer_configs { layer_name: "layer1.conv1" prune_config { filter_pruner {
            balanced_l2_norm_filter_prune { prune_ratio: 0.25 ascend_optimized: false } } } }
        override_layer_types { layer_type: "Linear" prune_config { n_out_of_m_pruner { l1_selective_prune {} } } }
    """,
    )
    pruned = amct.create_prune_retrain_model(PruneResNet(), example_input(PruneResNet), cfg, str(tmp_path / "r.txt"))
    assert (pruned.pw.out_channels, pruned.layer2.conv1.out_channels) == (32, 64)
    assert pruned.layer1.conv1.out_channels == 24
    report = {tuple(g.producers): g for g in pruned.amct_prune_report.groups}
    assert report[("pw",)].status == NOT_CONFIGURED and "skip_layers" in report[("pw",)].reason
    assert "regular_prune_skip_layers" in report[("layer2.conv1",)].reason
    assert [s.layer for s in pruned.amct_prune_report.selective] == ["fc"]
    assert int((pruned.fc.weight == 0).sum()) == pruned.fc.weight.numel() // 2


def test_global_selective_with_a_filter_override_mixes_both_kinds(tmp_path):
    # docs/spec/engine.md §7.3 "Mixed test": 4:2 everywhere, BCP 0.5 on one layer
    cfg = _cfg(
        tmp_path,
        """
        prune_config { n_out_of_m_pruner { l1_selective_prune { n_out_of_m_type: M4N2 } } }
        override_layer_configs { layer_name: "layer1.conv1" prune_config { filter_pruner {
            balanced_l2_norm_filter_prune { prune_ratio: 0.5 ascend_optimized: false } } } }
    """,
    )
    pruned = amct.create_prune_retrain_model(PruneResNet(), example_input(PruneResNet), cfg, str(tmp_path / "r.txt"))
    assert pruned.layer1.conv1.out_channels == 16 and pruned.layer1.conv2.in_channels == 16
    masked = {s.layer for s in pruned.amct_prune_report.selective if s.status == "masked"}
    assert "layer1.conv2" in masked and "layer1.conv1" not in masked
    _train_steps(pruned, PruneResNet.input_shape)
    pruned.eval()
    with torch.no_grad():
        expected = pruned(example_input(PruneResNet))
    torch.save(pruned.state_dict(), tmp_path / "mixed.pth")
    restored = amct.restore_prune_retrain_model(
        PruneResNet(), example_input(PruneResNet), str(tmp_path / "r.txt"), cfg, str(tmp_path / "mixed.pth")
    ).eval()
    with torch.no_grad():
        assert torch.equal(restored(example_input(PruneResNet)), expected)
    paths = amct.save_prune_retrain_model(pruned, str(tmp_path / "mixed"), example_input(PruneResNet))
    assert sorted(paths) == ["deploy", "fake_quant"]
    original = pruned.layer1.conv2.parametrizations.weight.original  # the model itself keeps its mask
    assert original.count_nonzero() > 0.5 * original.numel()


def test_a_torchscript_file_is_pruned_like_the_python_module(tmp_path, pruned_resnet):
    model, pruned, _ = pruned_resnet
    path = tmp_path / "resnet.pt"
    torch.jit.trace(model.eval(), example_input(PruneResNet)).save(str(path))
    from_file = amct.create_prune_retrain_model(
        str(path), example_input(PruneResNet), _cfg(tmp_path, FILTER_50), str(tmp_path / "ts_record.txt")
    )
    kept = [(g.producers, g.kept) for g in pruned.amct_prune_report.groups]
    assert [(g.producers, g.kept) for g in from_file.amct_prune_report.groups] == kept
    with torch.no_grad():
        torch.testing.assert_close(from_file(example_input(PruneResNet)), pruned.eval()(example_input(PruneResNet)))


def test_no_pruning_at_all_is_a_warning_with_the_reasons(tmp_path, caplog):
    cfg = _cfg(tmp_path, "prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.1 } } }")
    with caplog.at_level(logging.WARNING, logger="amct_engine.prune"):
        amct.create_prune_retrain_model(PruneResNet(), example_input(PruneResNet), cfg, str(tmp_path / "r.txt"))
    assert "no channel was pruned" in caplog.text
    assert "ascend_optimized keeps a multiple of 16" in caplog.text


def test_the_prune_api_refuses_quantization_settings(tmp_path):
    cfg = _cfg(tmp_path, FILTER_50 + "retrain_weight_quant_config { arq_retrain { channel_wise: true } }")
    with pytest.raises(ConfigError, match="not allowed in a prune config"):
        amct.create_prune_retrain_model(PruneResNet(), example_input(PruneResNet), cfg, str(tmp_path / "r.txt"))


def test_restore_without_the_record_says_so(tmp_path):
    torch.save(PruneResNet().state_dict(), tmp_path / "m.pth")
    with pytest.raises(FileNotFoundError, match="record_file"):
        amct.restore_prune_retrain_model(
            PruneResNet(),
            example_input(PruneResNet),
            str(tmp_path / "none.txt"),
            _cfg(tmp_path, FILTER_50),
            str(tmp_path / "m.pth"),
        )
