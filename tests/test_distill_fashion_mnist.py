"""Distillation on real data, labels never used: FP32 teacher -> INT8 student on Fashion-MNIST."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch.utils.data import DataLoader

import amct_engine as amct
from job_process.training import evaluate_accuracy

pytestmark = pytest.mark.slow

DISTILL_IMAGES = 20000


def _ort_accuracy(path, x, y) -> float:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    logits = np.concatenate([session.run(None, {"x": x[i : i + 1000].numpy()})[0] for i in range(0, len(x), 1000)])
    return float((logits.argmax(1) == y.numpy()).mean())


def test_int8_distillation_without_labels_keeps_the_teachers_accuracy(tmp_path, fashion_fp32, fashion_data):
    x_train, _, x_test, y_test = fashion_data
    teacher = fashion_fp32
    teacher_accuracy = evaluate_accuracy(teacher, x_test, y_test)
    example = x_test[:8]
    config = tmp_path / "distill.json"
    amct.create_distill_config(str(config), teacher, example)
    student = amct.create_distill_model(str(config), teacher, example)
    # Images only: the loader yields bare tensors, there are no labels to use.
    loader = DataLoader(
        x_train[:DISTILL_IMAGES], batch_size=128, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    amct.distill(teacher, student, str(config), loader, epochs=1)
    student_accuracy = evaluate_accuracy(student, x_test, y_test)
    paths = amct.save_distill_model(
        student,
        str(tmp_path / "student"),
        example,
        input_names=["x"],
        output_names=["logits"],
        dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}},
    )
    deploy_accuracy = _ort_accuracy(paths["deploy"], x_test, y_test)
    print(f"teacher {teacher_accuracy:.4f}  INT8 student {student_accuracy:.4f}  ORT deploy {deploy_accuracy:.4f}")
    assert student_accuracy >= teacher_accuracy - 0.003
    assert abs(deploy_accuracy - student_accuracy) <= 0.001
