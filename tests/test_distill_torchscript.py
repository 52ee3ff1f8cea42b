"""Distillation starting from a TorchScript file (issue 5): trace -> torch.jit.save -> path.

The file must give the same distill config as the nn.Module it was traced from, and the student built
from the file must distil (no labels) and export like one built from the module.
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch.utils.data import DataLoader

import amct_engine as amct
from amct_engine.quant.retrain_layer import QuantRetrainLayer
from job_process.training import evaluate_accuracy

pytestmark = pytest.mark.slow

DISTILL_IMAGES, TEST_IMAGES = 8000, 5000


def _ts_file(tmp_path, model, example) -> str:
    path = tmp_path / "fashion_cnn.pt"
    torch.jit.save(torch.jit.trace(model.eval(), example), str(path))
    return str(path)


def test_torchscript_file_gives_the_same_config_and_a_working_int8_student(tmp_path, fashion_fp32, fashion_data):
    x_train, _, x_test, y_test = fashion_data
    x_test, y_test = x_test[:TEST_IMAGES], y_test[:TEST_IMAGES]
    example = x_test[:8]
    teacher_module = fashion_fp32.eval()
    ts_path = _ts_file(tmp_path, teacher_module, example)

    from_module, from_file = tmp_path / "module.json", tmp_path / "file.json"
    amct.create_distill_config(str(from_module), teacher_module, example)
    amct.create_distill_config(str(from_file), ts_path, example)
    config = json.loads(from_file.read_text())
    assert config == json.loads(from_module.read_text())
    assert config["distill_group"] == [["conv1", "bn1", "relu1"], ["conv2", "bn2", "relu2"], ["fc"]]

    student = amct.create_distill_model(str(from_file), ts_path, example)
    assert {n for n, m in student.named_modules() if isinstance(m, QuantRetrainLayer)} == {"conv1", "conv2", "fc"}
    teacher = torch.jit.load(ts_path)
    teacher_accuracy = evaluate_accuracy(teacher, x_test, y_test)

    loader = DataLoader(
        x_train[:DISTILL_IMAGES], batch_size=128, shuffle=True, generator=torch.Generator().manual_seed(1)
    )  # images only, no labels
    events = []
    amct.distill(ts_path, student, str(from_file), loader, epochs=1, progress=events.append)
    assert len(events) == 3 * len(loader) and events[-1]["step"] == events[-1]["total_steps"]
    student_accuracy = evaluate_accuracy(student, x_test, y_test)

    paths = amct.save_distill_model(
        student,
        str(tmp_path / "student"),
        example,
        input_names=["x"],
        output_names=["logits"],
        dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}},
    )
    session = ort.InferenceSession(paths["deploy"], providers=["CPUExecutionProvider"])
    logits = np.concatenate(
        [session.run(None, {"x": x_test[i : i + 1000].numpy()})[0] for i in range(0, len(x_test), 1000)]
    )
    deploy_accuracy = float((logits.argmax(1) == y_test.numpy()).mean())
    print(f"teacher {teacher_accuracy:.4f}  INT8 student {student_accuracy:.4f}  ORT deploy {deploy_accuracy:.4f}")
    assert student_accuracy >= teacher_accuracy - 0.01
    assert abs(deploy_accuracy - student_accuracy) <= 0.002
