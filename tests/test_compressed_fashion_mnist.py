"""End to end on real data: 30 % BCP filter pruning + INT8 QAT of the Fashion-MNIST CNN, 2 epochs.

Like for like: the FP32 control gets the same 2 extra epochs, with the same batches in the same order.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import onnxruntime as ort
import pytest
import torch

import amct_engine.prune_retrain as amct
from amct_engine.export.save import export_onnx
from examples.fashion_mnist import fashion_mnist_available, load_fashion_mnist
from examples.models import SmallFashionCnn
from job_process.training import evaluate_accuracy, make_loader, train_epochs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not fashion_mnist_available(), reason="apt-get install dataset-fashion-mnist"),
]

LR, BATCH, SEED, EPOCHS = 2e-3, 128, 0, 2
CFG = """
prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.3 ascend_optimized: false } } }
retrain_data_quant_config { ulq_quantize { } }
retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }
"""


def _ort_accuracy(path: str, x: torch.Tensor, y: torch.Tensor) -> float:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    logits = np.concatenate([session.run(None, {"x": x[i : i + 1000].numpy()})[0] for i in range(0, len(x), 1000)])
    return float((logits.argmax(1) == y.numpy()).mean())


def test_30_percent_filter_prune_plus_int8_keeps_accuracy_in_a_fifth_of_the_bytes(tmp_path):
    x_train, y_train = load_fashion_mnist("train")
    x_test, y_test = load_fashion_mnist("test")
    torch.manual_seed(SEED)
    model = SmallFashionCnn()
    train_epochs(model, make_loader(x_train, y_train, BATCH, seed=SEED), 1, LR)
    model.eval()
    control = copy.deepcopy(model)
    train_epochs(control, make_loader(x_train, y_train, BATCH, seed=SEED + 1), EPOCHS, LR / 4)
    control_accuracy = evaluate_accuracy(control, x_test, y_test)

    cfg, record = tmp_path / "compressed.cfg", tmp_path / "record.txt"
    cfg.write_text(CFG)
    example = x_test[:8]
    compressed = amct.create_compressed_retrain_model(model, example, str(cfg), str(record))
    assert (compressed.conv1.layer.out_channels, compressed.conv2.layer.out_channels) == (11, 22)
    assert compressed.fc.layer.in_features == 22 * 7 * 7
    torch.manual_seed(SEED + 1)
    train_epochs(compressed, make_loader(x_train, y_train, BATCH, seed=SEED + 1), EPOCHS, LR / 4)
    accuracy = evaluate_accuracy(compressed, x_test, y_test)  # the eval forward fills the record
    paths = amct.save_compressed_retrain_model(
        compressed,
        str(record),
        str(tmp_path / "fmnist"),
        example,
        input_names=["x"],
        output_names=["logits"],
        dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}},
    )
    fp32_onnx = str(tmp_path / "fp32.onnx")
    export_onnx(model, fp32_onnx, (example,))
    ratio = os.path.getsize(paths["deploy"]) / os.path.getsize(fp32_onnx)
    deploy_accuracy = _ort_accuracy(paths["deploy"], x_test, y_test)
    print(
        f"FP32 control {control_accuracy:.4f}  pruned+INT8 {accuracy:.4f}  ORT deploy {deploy_accuracy:.4f}  "
        f"deploy/FP32 bytes {ratio:.3f}  params {compressed.amct_prune_report.params_after}/"
        f"{compressed.amct_prune_report.params_before}"
    )
    assert accuracy >= control_accuracy - 0.010
    assert abs(deploy_accuracy - accuracy) <= 0.002
    assert ratio <= 0.2
