"""`make demo`: FP32 CNN on Fashion-MNIST -> INT8 QAT -> fake-quant and deploy ONNX, with a summary.

Run: python -m examples.demo [--out DIR] [--train-limit N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import onnxruntime as ort
import torch
from tqdm import tqdm

import amct_engine as amct
from amct_engine.export.save import export_onnx
from examples.fashion_mnist import fashion_mnist_available, load_fashion_mnist
from examples.models import SmallFashionCnn
from job_process.training import evaluate_accuracy, make_loader, train_epochs


def _train(model, loader, lr, label):
    bar = tqdm(total=len(loader), desc=label, unit="step", disable=not sys.stderr.isatty())

    def progress(event):
        bar.update(1)
        bar.set_postfix(loss=f"{event['loss']:.3f}")

    train_epochs(model, loader, 1, lr, progress=progress)
    bar.close()


def _ort_accuracy(path, x, y) -> float:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    logits = np.concatenate([session.run(None, {"x": x[i : i + 1000].numpy()})[0] for i in range(0, len(x), 1000)])
    return float((logits.argmax(1) == y.numpy()).mean())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="artifacts/demo", help="output folder (default: %(default)s)")
    parser.add_argument("--train-limit", type=int, default=60000, help="training images to use")
    args = parser.parse_args(argv)
    if not fashion_mnist_available():
        print(
            "demo: Fashion-MNIST is missing; install it with `apt-get install dataset-fashion-mnist`", file=sys.stderr
        )
        return 2
    torch.manual_seed(0)
    x_train, y_train = load_fashion_mnist("train", limit=args.train_limit)
    x_test, y_test = load_fashion_mnist("test")
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()

    model = SmallFashionCnn()
    _train(model, make_loader(x_train, y_train, 128, seed=0), 2e-3, "FP32 training")
    fp32_accuracy = evaluate_accuracy(model, x_test, y_test)

    config = os.path.join(args.out, "retrain.json")
    record = os.path.join(args.out, "record.txt")
    example = x_test[:8]
    amct.create_quant_retrain_config(config, model, example)
    qmodel = amct.create_quant_retrain_model(config, model, record, example)
    _train(qmodel, make_loader(x_train, y_train, 128, seed=1), 5e-4, "INT8 QAT")
    qat_accuracy = evaluate_accuracy(qmodel, x_test, y_test)
    paths = amct.save_quant_retrain_model(
        config,
        qmodel,
        record,
        os.path.join(args.out, "fmnist"),
        example,
        input_names=["x"],
        output_names=["logits"],
        dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}},
    )
    fp32_path = os.path.join(args.out, "fmnist_fp32.onnx")
    export_onnx(model.eval(), fp32_path, (example,), ["x"], ["logits"], {"x": {0: "n"}, "logits": {0: "n"}})

    rows = [
        ("FP32, 1 epoch (PyTorch)", fp32_accuracy, fp32_path),
        ("INT8 QAT, +1 epoch", qat_accuracy, None),
        ("INT8 fake-quant ONNX", _ort_accuracy(paths["fake_quant"], x_test, y_test), paths["fake_quant"]),
        ("INT8 deploy ONNX", _ort_accuracy(paths["deploy"], x_test, y_test), paths["deploy"]),
    ]
    print(f"\n{'model':<26}{'test acc':>10}{'file KiB':>10}")
    for label, accuracy, path in rows:
        size = f"{os.path.getsize(path) / 1024:.1f}" if path else "-"
        print(f"{label:<26}{accuracy:>10.4f}{size:>10}")
    print("(the QAT epoch is extra training: bench/qat.py compares against an FP32 control with the same epoch)")
    print(f"\nrecord: {record}\nconfig: {config}\ndone in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
