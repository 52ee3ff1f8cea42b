"""PTQ (create_quant_config -> quantize_model -> batch_num batches -> save_model) on real data.

Fashion-MNIST CNN trained once per session (tests/conftest.py); calibration on 512 training images,
the same images ONNX Runtime's quantize_static gets in the peer (bench/ptq.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

import amct_engine as amct
from amct_engine.export.deploy_target import detect_deploy_target
from amct_engine.quant.hfmg import hfmg_search
from amct_engine.quant.ifmr import ifmr_search
from amct_engine.quant.primitives import fake_quantize
from amct_engine.record import RecordFile
from tests.deploy_targets import record_exact_target

CALIBRATION, BATCH = 512, 256


def _ort_logits(path, x: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.concatenate([session.run(None, {name: x[i : i + 2000].numpy()})[0] for i in range(0, len(x), 2000)])


def ptq(tmp_path, model, x_calibration, example, cfg_text=None, batch=BATCH, **save_options):
    """The AMCT PTQ workflow; returns (calibration model, paths)."""
    cfg = None
    if cfg_text is not None:
        cfg = tmp_path / "ptq.cfg"
        cfg.write_text(cfg_text)
    batch_num = len(x_calibration) // batch
    config, onnx_file, record = tmp_path / "ptq.json", tmp_path / "fused.onnx", tmp_path / "record.txt"
    amct.create_quant_config(
        str(config), model, example, batch_num=batch_num, config_defination=str(cfg) if cfg else None
    )
    calibration = amct.quantize_model(
        str(config),
        str(onnx_file),
        str(record),
        model,
        example,
        input_names=["x"],
        output_names=["logits"],
        dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}},
    )
    with torch.no_grad():
        for i in range(batch_num):
            calibration(x_calibration[i * batch : (i + 1) * batch])
    return calibration, amct.save_model(str(onnx_file), str(record), str(tmp_path / "ptq"), **save_options)


@pytest.mark.parametrize(("bits", "vs_ifmr", "inside"), [(8, 1.0, 0.95), (4, 0.5, 0.8)])
def test_hfmg_clips_heavy_tails_better_than_ifmr_and_min_max(bits, vs_ifmr, inside):
    """Laplace data: the MSE-best clip is far inside the range; IFMR only searches 0.7..1.3 x max."""
    torch.manual_seed(0)
    x = torch.distributions.Laplace(0.0, 1.0).sample((200_000,))
    low, high = float(x.min()), float(x.max())
    result = hfmg_search(torch.histc(x.double(), 4096, low, high), low, high, bits, with_offset=True)
    assert float(result.clip_max) < inside * high and float(result.clip_min) > inside * low
    min_max_scale = (x.max() - x.min()) / (2**bits - 1)
    min_max = fake_quantize(x, min_max_scale, torch.round(-(2 ** (bits - 1)) - x.min() / min_max_scale), bits)
    mse_hfmg = (fake_quantize(x, result.scale, result.offset, bits) - x).square().mean()
    mse_ifmr = (fake_quantize(x, *ifmr_search(x, bits, True)[:2], bits) - x).square().mean()
    assert mse_hfmg <= vs_ifmr * mse_ifmr and mse_hfmg < 0.9 * (min_max - x).square().mean()


@pytest.mark.slow
@pytest.mark.parametrize(
    "cfg_text", [None, "common_config { hfmg_quantize { num_of_bins: 4096 } }\n"], ids=["ifmr", "hfmg"]
)
def test_ptq_int8_deploy_matches_fp32_and_ort_static(tmp_path, fashion_fp32, fashion_data, cfg_text):
    from bench.ptq import quantize
    from examples.fashion_mnist import fashion_mnist_available  # noqa: F401  (fixture skips without data)

    x_train, _, x_test, y_test = fashion_data
    fp32 = float((fashion_fp32(x_test).argmax(1) == y_test).float().mean())
    # The record's 8-bit codes on this CPU's exact kernels: the deploy model computes the calibration model.
    exact = {"deploy_target": record_exact_target()}
    calibration, paths = ptq(tmp_path, fashion_fp32, x_train[:CALIBRATION], x_test[:8], cfg_text, **exact)
    deploy_logits = _ort_logits(paths["deploy"], x_test)
    deploy = float((deploy_logits.argmax(1) == y_test.numpy()).mean())
    with torch.no_grad():
        torch_logits = calibration(x_test).numpy()
    # The calibration model computes what the deploy model computes.
    assert (deploy_logits.argmax(1) == torch_logits.argmax(1)).mean() >= 0.999
    assert np.abs(deploy_logits - torch_logits).max() < 0.05
    assert np.abs(_ort_logits(paths["fake_quant"], x_test[:500]) - torch_logits[:500]).max() < 0.05
    fp32_onnx = tmp_path / "fp32.onnx"
    torch.onnx.export(
        fashion_fp32, (x_test[:8],), str(fp32_onnx), input_names=["x"], dynamo=False, dynamic_axes={"x": {0: "n"}}
    )
    ort_static = quantize(fp32_onnx, x_train[:CALIBRATION].numpy(), tmp_path / "ort.onnx")
    ort_accuracy = float((_ort_logits(ort_static["onnx"], x_test).argmax(1) == y_test.numpy()).mean())
    algo = "HFMG" if cfg_text else "IFMR"
    print(f"\nPTQ {algo}: FP32 {fp32:.4f} ours deploy {deploy:.4f} ORT static {ort_accuracy:.4f}")
    assert deploy >= fp32 - 0.002
    # Level with ORT's quantize_static: within 5 of 10,000 images. Both sides move by a few images with the
    # FP32 weights (they differ with the thread count); the bench's ptq rows give the measured pair.
    assert deploy >= ort_accuracy - 0.0005
    assert set(RecordFile(tmp_path / "record.txt").quant_layers()) == {"conv1", "conv2", "fc"}
    # This machine's own kind (auto: 7-bit conv codes on AVX2 without VNNI) keeps FP32's top-1 too.
    auto = amct.save_model(str(tmp_path / "fused.onnx"), str(tmp_path / "record.txt"), str(tmp_path / "auto"))
    auto_accuracy = float((_ort_logits(auto["deploy"], x_test).argmax(1) == y_test.numpy()).mean())
    print(f"PTQ {algo}, deploy_target auto ({detect_deploy_target()}): {auto_accuracy:.4f}")
    assert auto_accuracy >= fp32 - 0.003


def test_save_before_calibration_says_what_to_run(tmp_path):
    from examples.models import SmallFashionCnn

    model = SmallFashionCnn().eval()
    example = torch.randn(4, 1, 28, 28)
    amct.create_quant_config(str(tmp_path / "c.json"), model, example, batch_num=2)
    calibration = amct.quantize_model(
        str(tmp_path / "c.json"), str(tmp_path / "m.onnx"), str(tmp_path / "r.txt"), model, example
    )
    calibration(example)  # one batch of two
    with pytest.raises(RuntimeError, match="run batch_num=2 calibration batches"):
        amct.save_model(str(tmp_path / "m.onnx"), str(tmp_path / "r.txt"), str(tmp_path / "out"))
    calibration(example)
    paths = amct.save_model(str(tmp_path / "m.onnx"), str(tmp_path / "r.txt"), str(tmp_path / "out"))
    assert all(Path(p).stat().st_size > 1000 for p in paths.values())


def test_cfg_naming_a_missing_layer_is_a_positioned_error(tmp_path):
    from examples.models import SmallFashionCnn

    cfg = tmp_path / "bad.cfg"
    cfg.write_text('batch_num: 1\nskip_layers: "conv9"\n')
    with pytest.raises(amct.ConfigError, match=r"bad.cfg:2:1: \"conv9\" is not a quantizable layer"):
        amct.create_quant_config(
            str(tmp_path / "c.json"), SmallFashionCnn(), torch.randn(2, 1, 28, 28), config_defination=str(cfg)
        )


def test_calibration_writes_the_record_once_per_forward_and_the_model_still_copies(tmp_path, monkeypatch):
    """Every layer that finishes calibrating in one forward lands in one rewrite of the record."""
    import copy
    import io

    from examples.models import SmallFashionCnn

    model, example = SmallFashionCnn().eval(), torch.randn(4, 1, 28, 28)
    amct.create_quant_config(str(tmp_path / "c.json"), model, example, batch_num=2)
    calibration = amct.quantize_model(
        str(tmp_path / "c.json"), str(tmp_path / "m.onnx"), str(tmp_path / "r.txt"), model, example
    )
    writes = []
    original = RecordFile._write
    monkeypatch.setattr(
        RecordFile, "_write", lambda self, record: (writes.append(len(record.record)), original(self, record))
    )
    calibration(example)
    assert writes == []  # still collecting: nothing to write
    calibration(example)
    assert writes == [3]  # conv1, conv2 and fc together
    assert set(RecordFile(tmp_path / "r.txt").quant_layers()) == {"conv1", "conv2", "fc"}
    torch.save(calibration, io.BytesIO())  # the record hooks are objects, not closures
    copy.deepcopy(calibration)(example)
    assert writes == [3]  # a copy's forward writes nothing new


@pytest.mark.parametrize("with_offset", [False, True])
@pytest.mark.parametrize("bits", [8, 4])
def test_histogram_ifmr_picks_the_exact_searchs_clip(bits, with_offset):
    """PTQ's IFMR evaluates the candidates on a 65,536-bin histogram; it must choose what the exact search does."""
    torch.manual_seed(bits + with_offset)
    for x in (
        torch.randn(1_500_000),
        torch.relu(torch.randn(1_500_000)) * 3,
        torch.distributions.Laplace(0.0, 1.0).sample((1_500_000,)),
    ):
        exact = ifmr_search(x, bits, with_offset)
        fast = ifmr_search(x, bits, with_offset, histogram_bins=1 << 16)
        assert float(fast.scale) == float(exact.scale) and int(fast.offset) == int(exact.offset)


class _ViewAfterConv(torch.nn.Module):
    """`.view` of a conv output: it raises on a channels-last tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 28 * 28, 10)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.fc(y.view(y.shape[0], -1))


def _calibrate(tmp_path, model, batches):
    amct.create_quant_config(str(tmp_path / "c.json"), model, batches[0][:4], batch_num=len(batches))
    calibration = amct.quantize_model(
        str(tmp_path / "c.json"), str(tmp_path / "m.onnx"), str(tmp_path / "r.txt"), model, batches[0][:4]
    )
    with torch.no_grad():
        for batch in batches:
            calibration(batch)
    return calibration, RecordFile(tmp_path / "r.txt").quant_layers()


def test_channels_last_calibration_records_the_default_layouts_factors(tmp_path, monkeypatch):
    """On CPU the calibration runs its convs channels-last (faster); the record must not change, and a model
    that `.view`s a conv output keeps the default layout and still calibrates."""
    from amct_engine import ptq as ptq_module
    from amct_engine.export.save import quant_layers
    from examples.models import SmallFashionCnn

    torch.manual_seed(0)
    batches = [torch.rand(64, 1, 28, 28) for _ in range(3)]
    model = SmallFashionCnn().eval()
    calibration, fast = _calibrate(tmp_path / "fast", model, batches)
    assert {n: w.channels_last_output for n, w in quant_layers(calibration).items()} == {
        "conv1": True,
        "conv2": True,
        "fc": False,
    }
    monkeypatch.setattr(ptq_module, "_channels_last_runs_the_same", lambda *args: False)
    _, default = _calibrate(tmp_path / "default", model, batches)
    monkeypatch.undo()
    for name, record in default.items():
        assert fast[name].scale_d == pytest.approx(record.scale_d, rel=1e-5)
        assert fast[name].offset_d == record.offset_d and fast[name].scale_w == record.scale_w
    view_model = _ViewAfterConv().eval()
    calibration, records = _calibrate(tmp_path / "view", view_model, batches)
    assert not any(w.channels_last_output for w in quant_layers(calibration).values())
    assert set(records) == {"conv", "fc"}
