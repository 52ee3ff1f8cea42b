"""End to end on real data: FP32 CNN on Fashion-MNIST, then one epoch of INT8 / A8W4 QAT.

Like for like: the FP32 control gets the same extra epoch as the QAT models.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import numpy_helper

import amct_engine as amct
from amct_engine.export.ascend import ascend_to_standard_onnx, unpack_dequant_param
from amct_engine.export.save import export_onnx
from amct_engine.record import RecordFile
from examples.fashion_mnist import fashion_mnist_available
from job_process.training import evaluate_accuracy, make_loader, train_epochs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not fashion_mnist_available(), reason="apt-get install dataset-fashion-mnist"),
]

LR, BATCH, SEED = 2e-3, 128, 0


@pytest.fixture(scope="module")
def data(fashion_data):
    return fashion_data


@pytest.fixture(scope="module")
def fp32(_fashion_fp32_trained, data):
    """FP32 model after 1 epoch, and the FP32 control after 1 more (same data order as QAT)."""
    x_train, y_train, x_test, y_test = data
    model = copy.deepcopy(_fashion_fp32_trained)
    control = copy.deepcopy(model)
    torch.manual_seed(SEED + 1)
    train_epochs(control, make_loader(x_train, y_train, BATCH, seed=SEED + 1), 1, LR / 4)
    return model.eval(), evaluate_accuracy(control, x_test, y_test)


def _qat(tmp_path, fp32_model, data, cfg_text=None):
    x_train, y_train, x_test, y_test = data
    example = x_test[:8]
    config, record = tmp_path / "retrain.json", tmp_path / "record.txt"
    cfg = None
    if cfg_text:
        cfg = tmp_path / "qat.cfg"
        cfg.write_text(cfg_text)
    amct.create_quant_retrain_config(str(config), fp32_model, example, str(cfg) if cfg else None)
    qmodel = amct.create_quant_retrain_model(str(config), fp32_model, str(record), example)
    torch.manual_seed(SEED + 1)
    train_epochs(qmodel, make_loader(x_train, y_train, BATCH, seed=SEED + 1), 1, LR / 4)
    accuracy = evaluate_accuracy(qmodel, x_test, y_test)  # the eval forward fills the record
    paths = amct.save_quant_retrain_model(
        str(config),
        qmodel,
        str(record),
        str(tmp_path / "fmnist"),
        example,
        input_names=["x"],
        output_names=["logits"],
        dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}},
    )
    return qmodel, accuracy, paths


def _ort_logits(model, x) -> np.ndarray:
    """Logits of an ONNX file or ModelProto over `x`, in chunks of 1000."""
    source = model if isinstance(model, str) else model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"x": x[i : i + 1000].numpy()})[0] for i in range(0, len(x), 1000)])


def _ort_accuracy(model, x, y) -> float:
    return float((_ort_logits(model, x).argmax(1) == y.numpy()).mean())


def test_fp32_baseline_reaches_088(fp32, data):
    model, control_accuracy = fp32
    assert evaluate_accuracy(model, data[2], data[3]) >= 0.88
    assert control_accuracy >= 0.88


@pytest.fixture(scope="module")
def int8(tmp_path_factory, fp32, data):
    tmp_path = tmp_path_factory.mktemp("int8")
    qmodel, accuracy, paths = _qat(tmp_path, fp32[0], data)
    return qmodel, accuracy, paths, tmp_path


def test_int8_qat_keeps_accuracy_and_deploy_model_agrees(int8, fp32, data):
    model, control_accuracy = fp32
    _, qat_accuracy, paths, tmp_path = int8
    x_test, y_test = data[2], data[3]
    print(f"FP32 control {control_accuracy:.4f}  INT8 QAT {qat_accuracy:.4f}")
    assert qat_accuracy >= control_accuracy - 0.003
    assert abs(_ort_accuracy(paths["fake_quant"], x_test, y_test) - qat_accuracy) <= 0.001
    deploy_accuracy = _ort_accuracy(paths["deploy"], x_test, y_test)
    print(f"ORT deploy {deploy_accuracy:.4f}")
    assert abs(deploy_accuracy - qat_accuracy) <= 0.001
    fp32_onnx = str(tmp_path / "fp32.onnx")
    export_onnx(model, fp32_onnx, (x_test[:8],))
    ratio = os.path.getsize(paths["deploy"]) / os.path.getsize(fp32_onnx)
    print(f"deploy/FP32 file size {ratio:.3f}")
    assert ratio <= 0.3


def test_ascend_deploy_model_agrees_with_the_fake_quant_model(int8, data):
    qmodel, _, paths, tmp_path = int8
    x_test, y_test = data[2], data[3]
    config, record = tmp_path / "retrain.json", tmp_path / "record.txt"
    ascend = amct.save_quant_retrain_model(
        str(config),
        qmodel,
        str(record),
        str(tmp_path / "ascend"),
        x_test[:8],
        input_names=["x"],
        output_names=["logits"],
        dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}},
        deploy_format="ascend",
    )
    deploy = onnx.load(ascend["deploy"])
    onnx.checker.check_model(deploy)
    reference = _ort_logits(ascend_to_standard_onnx(deploy), x_test)
    fake = _ort_logits(paths["fake_quant"], x_test)
    print(f"ascend reference vs fake-quant: max abs logit diff {np.abs(reference - fake).max():.2e}")
    assert np.abs(reference - fake).max() <= 1e-3
    assert abs((reference.argmax(1) == y_test.numpy()).mean() - (fake.argmax(1) == y_test.numpy()).mean()) <= 0.001
    records = RecordFile(record).quant_layers()
    for layer, entry in records.items():
        words = next(numpy_helper.to_array(i) for i in deploy.graph.initializer if i.name == f"{layer}.dequant.param")
        deq_scale, _, _ = unpack_dequant_param(words)
        np.testing.assert_array_equal(deq_scale, np.float32(entry.scale_d) * np.asarray(entry.scale_w, np.float32))


def test_a8w4_qat_stays_within_one_and_a_half_points(tmp_path, fp32, data):
    model, control_accuracy = fp32
    cfg = "retrain_weight_quant_config { ulq_retrain { channel_wise: true dst_type: INT4 } }"
    _, accuracy, paths = _qat(tmp_path, model, data, cfg)
    print(f"FP32 control {control_accuracy:.4f}  A8W4 QAT {accuracy:.4f}")
    assert accuracy >= control_accuracy - 0.015
    assert abs(_ort_accuracy(paths["deploy"], data[2], data[3]) - accuracy) <= 0.002
