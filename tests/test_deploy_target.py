"""`deploy_target`: the weight codes of the "onnx" deploy model follow the CPU it is written for
(amct_engine/export/deploy_target.py), and the deploy model stays exact on this machine's CPU."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import amct_engine as amct
from amct_engine.export.deploy_target import (
    REWRITE_NAMES,
    TARGETS,
    DeployTarget,
    check_deploy_target,
    deploy_target_names,
    detect_deploy_target,
    register_deploy_target,
)
from amct_engine.export.qdq.finalize import TARGET_REWRITES
from amct_engine.export.qdq.fusion_report import deploy_report
from amct_engine.export.save import build_export_model, export_layers
from amct_engine.quant_retrain import records_for_save
from job_host.spec import JobParams
from tests.deploy_targets import full_int8_exact_here
from tests.test_quant_retrain import INPUT, trained_qat_model


@pytest.mark.parametrize(
    "machine, flags, target",
    [
        ("x86_64", {"avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8"}, "x86_amx"),
        ("x86_64", {"avx2", "avx512f", "avx512_vnni"}, "x86_vnni"),
        ("x86_64", {"avx2", "avx_vnni"}, "x86_vnni"),
        ("x86_64", {"avx2", "fma"}, "x86_avx2"),
        ("aarch64", set(), "arm"),
    ],
)
def test_auto_detects_the_kind_of_cpu(machine, flags, target):
    assert detect_deploy_target(machine, flags) == target


def test_an_unknown_target_names_the_option_and_the_choices():
    with pytest.raises(ValueError, match="deploy_target.*x86_vnni"):
        check_deploy_target("tpu")


def _weight_codes(path: str) -> dict[str, tuple[np.dtype, set[int]]]:
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    zero = np.zeros(1, np.int8)  # an absent zero point is 0
    return {
        layer: (inits[f"{layer}.weight"].dtype, set(inits.get(f"{layer}.weight_zero_point", zero).reshape(-1).tolist()))
        for layer in ("conv1", "conv2", "fc")
    }


@pytest.fixture(scope="module")
def qat(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("target")
    return tmp_path, *trained_qat_model(tmp_path)


@pytest.mark.parametrize(
    "target, dtype, zero",
    [
        ("x86_amx", np.int8, 0),
        ("x86_vnni", np.int8, 0),
        ("arm", np.int8, 0),
        ("x86_avx2", np.int8, 0),
        ("x86_avx2_reduce_range", np.int8, 0),
        ("x86_avx2_u8u8", np.uint8, 128),
    ],
)
def test_weight_codes_follow_the_target_and_the_report_says_which(qat, target, dtype, zero):
    tmp_path, config, qmodel, record, expected = qat
    paths = amct.save_quant_retrain_model(
        str(config), qmodel, str(record), str(tmp_path / target), INPUT, deploy_target=target
    )
    codes = {layer: (np.dtype(dtype), {zero}) for layer in ("conv1", "conv2", "fc")}
    if target == "x86_avx2":  # the Linear keeps the record's 8 bits there, on the exact u8u8 kernels
        codes["fc"] = (np.dtype(np.uint8), {128})
    assert _weight_codes(paths["deploy"]) == codes
    # One input channel under a 3x3 kernel: on the x86 int8 targets conv1 runs float on its codes (conv_float_stems.py).
    x86_signed = target in ("x86_vnni", "x86_amx", "x86_avx2", "x86_avx2_reduce_range")
    assert deploy_report(paths["deploy"])["conv_layout"]["float_stems"] == (["conv1/Conv"] if x86_signed else [])
    assert deploy_report(paths["deploy"])["deploy_target"] == target
    if target == "x86_avx2_u8u8" or (not target.startswith("x86_avx2") and full_int8_exact_here()):
        # Exact kernels for this target on this CPU: the deploy model computes the eval model bit for bit
        # (this chain requantises only through ReLU/flatten, with the next layer's own quantiser).
        session = ort.InferenceSession(paths["deploy"], providers=["CPUExecutionProvider"])
        np.testing.assert_array_equal(session.run(None, {session.get_inputs()[0].name: INPUT.numpy()})[0], expected)


@pytest.mark.parametrize("target, fc_bits", [("x86_avx2", 8), ("x86_avx2_reduce_range", 7)])
def test_avx2_stores_7_bit_codes_that_its_u8s8_kernels_sum_exactly(qat, target, fc_bits):
    """x86_avx2: the convs' record clip range on 7-bit codes (2 x 255 x 64 < 2^15: no pair of u8s8 products
    saturates), so the deploy model computes the export model at those codes bit for bit on any x86 CPU, and
    stays within a few 8-bit steps of the eval model's 8-bit codes; the Linear keeps 8 bits (u8u8) there, and
    takes 7-bit signed codes too on x86_avx2_reduce_range."""
    tmp_path, config, qmodel, record, expected = qat
    paths = amct.save_quant_retrain_model(
        str(config), qmodel, str(record), str(tmp_path / f"{target}_7bit"), INPUT, deploy_target=target
    )
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(paths["deploy"]).graph.initializer}
    for layer in ("conv1", "conv2", "fc") if fc_bits == 7 else ("conv1", "conv2"):
        codes = inits[f"{layer}.weight"].astype(int)
        assert codes.min() >= -64 and codes.max() <= 63 and np.abs(codes).max() >= 62  # the range is used
    records = records_for_save(qmodel, str(record))
    narrowed = export_layers(qmodel, records, target)
    assert {path: layer.factors.wts_bits for path, layer in narrowed.items()} == {"conv1": 7, "conv2": 7, "fc": fc_bits}
    for path, layer in narrowed.items():
        if layer.factors.wts_bits == 8:
            continue
        qmodel_layer = qmodel.get_submodule(path)
        scale = np.asarray(records[qmodel_layer.layer_name].scale_w) * 127 / 63
        np.testing.assert_allclose(layer.factors.scale_w.numpy(), scale, rtol=1e-6)
    session = ort.InferenceSession(paths["deploy"], providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: INPUT.numpy()})[0]
    with torch.no_grad():
        reference = build_export_model(qmodel, narrowed)(INPUT).numpy()
    np.testing.assert_array_equal(got, reference)
    assert np.abs(got - expected).max() <= 0.05 * np.abs(expected).max()


def test_depthwise_convs_keep_8_bit_codes_on_avx2(tmp_path):
    """ORT's int8 depthwise kernel sums in 32 bits (measured exact at ±127 x 255): 7 bits would only cost accuracy."""
    net = nn.Sequential(nn.Conv2d(3, 8, 1), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=8), nn.ReLU(), nn.Conv2d(8, 4, 1))
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    config, record = tmp_path / "c.json", tmp_path / "r.txt"
    amct.create_quant_retrain_config(str(config), net.eval(), x)
    qmodel = amct.create_quant_retrain_model(str(config), net, str(record), x).eval()
    with torch.no_grad():
        qmodel(x)
    layers = export_layers(qmodel, records_for_save(qmodel, str(record)), "x86_avx2")
    assert {path: layer.factors.wts_bits for path, layer in layers.items()} == {"0": 7, "2": 8, "4": 7}


def test_auto_is_the_exporting_machine(qat):
    tmp_path, config, qmodel, record, _ = qat
    paths = amct.save_quant_retrain_model(str(config), qmodel, str(record), str(tmp_path / "auto"), INPUT)
    assert deploy_report(paths["deploy"])["deploy_target"] == detect_deploy_target()


@pytest.fixture
def stems_only_target():
    """A throw-away target (docs/architecture.md, "Add a deploy target"): signed codes, the float stems only."""
    register_deploy_target(DeployTarget("arm_float_stems", True, ("float_stems",)))
    yield "arm_float_stems"
    TARGETS.unregister("arm_float_stems")


def test_a_registered_target_is_accepted_everywhere_and_applies_its_rewrites(qat, stems_only_target):
    tmp_path, config, qmodel, record, expected = qat
    assert stems_only_target in deploy_target_names()
    assert JobParams(deploy_target=stems_only_target).deploy_target == stems_only_target
    paths = amct.save_quant_retrain_model(
        str(config), qmodel, str(record), str(tmp_path / stems_only_target), INPUT, deploy_target=stems_only_target
    )
    assert _weight_codes(paths["deploy"]) == {layer: (np.dtype(np.int8), {0}) for layer in ("conv1", "conv2", "fc")}
    report = deploy_report(paths["deploy"])
    assert report["deploy_target"] == stems_only_target
    assert report["conv_layout"]["float_stems"] == ["conv1/Conv"]
    if full_int8_exact_here():  # 8-bit signed codes run exactly on this CPU
        session = ort.InferenceSession(paths["deploy"], providers=["CPUExecutionProvider"])
        np.testing.assert_array_equal(session.run(None, {session.get_inputs()[0].name: INPUT.numpy()})[0], expected)


def test_a_target_naming_an_unknown_rewrite_fails_when_registered():
    with pytest.raises(ValueError, match="unknown rewrite 'fuse_everything'.*float_stems"):
        register_deploy_target(DeployTarget("x86_magic", True, ("fuse_everything",)))
    assert "x86_magic" not in TARGETS
    with pytest.raises(ValueError, match="reserved"):
        register_deploy_target(DeployTarget("auto", True))


def test_the_rewrite_names_are_the_finalisers_table():
    assert set(REWRITE_NAMES) == set(TARGET_REWRITES)
