"""The llm_quant runner: an LLM quantised with AMCT's LLM route on the job's text, measured against FP32
(docs/spec/llm.md; docs/service.md, "LLM weight quantisation").

In the sandboxed job process, as every runner: the model (a Hugging Face folder unpacked from its zip and built
with transformers' own architecture, amct_engine/llm/hf_folder.py; or a TorchScript trace, captured as the
engine captures every TorchScript model, with its tokenizer.json stored in the trace's extra files) and the
text, tokenised with the model's tokenizer. The token stream is cut in rows of `seq_len`; the first part
calibrates, the last `eval_fraction` of it (contiguous, never calibrated on) measures. Steps:

1. FP32 perplexity in PyTorch on the held-out rows, and the FP32 ONNX file (amct.export_onnx of the float model);
2. amct.quantize(model, cfg), `batch_num` calibration forwards of up to `batch_size` rows each, amct.convert;
3. the quantised perplexity in PyTorch; amct.export_onnx: the deploy file (MatMulNBits / W8A8 nodes, external
   data past 1 GiB of weights);
4. both files in onnxruntime: perplexity on the same rows, bytes, and prefill latency of one row of `seq_len`
   tokens (interleaved, one thread), as tokens per second.

report.json's `llm` section holds these; the result lists the deploy file (its `.data` file with it) as `deploy`.
"""

from __future__ import annotations

import json
import math
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from job_host.protocol import emit
from job_host.spec import JobSpec

MAX_EVAL_TOKENS = 65536  # perplexity is measured four times (PyTorch and ORT, FP32 and quantised)
LATENCY_WARMUP, LATENCY_RUNS = 2, 10
TOKENIZER_EXTRA_FILE = "tokenizer.json"  # a TorchScript trace's tokenizer: torch.jit.save(_extra_files=...)
# A causal LM's ONNX signature: the batch and sequence axes dynamic (amct.export_onnx's default for a HF model).
IO = {
    "input_names": ["input_ids"],
    "output_names": ["logits"],
    "dynamic_axes": {"input_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}},
}


class LlmJobError(ValueError):
    """A job that cannot run on what it was given, in the user's terms."""


# -- the model and the text ------------------------------------------------------------------------------
def load_model(path: str, workdir: Path) -> tuple[Any, Any, str]:
    """(model, tokenizer, source): a zipped Hugging Face folder or a TorchScript trace of input_ids -> logits."""
    from amct_engine.llm.hf_folder import is_model_folder, load_folder

    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
        if is_model_folder(names):
            from job_process.validate_llm import unpack

            model, tokenizer = load_folder(unpack(path, workdir / "hf_model"))
            return model, tokenizer, "hf_folder"
    return _load_trace(path, workdir)


def _load_trace(path: str, workdir: Path) -> tuple[Any, Any, str]:
    import torch
    from transformers import PreTrainedTokenizerFast

    from amct_engine.graph.capture import capture_model

    extra = {TOKENIZER_EXTRA_FILE: ""}
    torch.jit.load(path, map_location="cpu", _extra_files=extra)
    if not extra[TOKENIZER_EXTRA_FILE]:
        raise LlmJobError(
            "the TorchScript model has no tokenizer: save it with "
            "torch.jit.save(traced, path, _extra_files={'tokenizer.json': open('tokenizer.json').read()})"
        )
    tokenizer_file = workdir / TOKENIZER_EXTRA_FILE
    content = extra[TOKENIZER_EXTRA_FILE]
    tokenizer_file.write_bytes(content if isinstance(content, bytes) else content.encode())
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file))
    # Captured as the engine captures every TorchScript model: an fx module whose Linears are nn.Linear again,
    # which amct.quantize can wrap (a ScriptModule's are not).
    example = torch.zeros(2, 8, dtype=torch.long)
    return capture_model(path, (example,)).module.eval(), tokenizer, "torchscript"


def token_rows(tokenizer, spec: JobSpec) -> tuple[Any, Any, dict]:
    """(calibration rows, evaluation rows, counts): the text's tokens in rows of seq_len, the last eval_fraction
    of them (a contiguous tail: no text is in both) for evaluation."""
    import torch

    from job_host.text_data import RECORD_SEPARATOR, read_records

    params = spec.params
    text = RECORD_SEPARATOR.join(read_records(spec.dataset, spec.dataset_format))
    ids = torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long)
    rows = len(ids) // params.seq_len
    n_eval = max(1, round(rows * params.eval_fraction))
    if rows - n_eval < 1:
        raise LlmJobError(
            f"the text gives {len(ids)} tokens: {rows} row(s) of seq_len {params.seq_len}; the job needs at least "
            "one row to calibrate on and one to evaluate on: upload more text or lower seq_len"
        )
    table = ids[: rows * params.seq_len].reshape(rows, params.seq_len)
    calibration, evaluation = table[: rows - n_eval], table[rows - n_eval :]
    evaluation = evaluation[: max(1, MAX_EVAL_TOKENS // params.seq_len)]
    counts = {
        "text_tokens": len(ids),
        "seq_len": params.seq_len,
        "calibration_rows": len(calibration),
        "evaluation_rows": len(evaluation),
        "evaluation_tokens": int(evaluation.numel()),
    }
    return calibration, evaluation, counts


def calibration_batches(rows, batch_num: int, batch_size: int) -> list:
    """`batch_num` batches of the calibration rows, each of up to `batch_size` rows (amct.quantize observes its
    first `batch_num` forwards)."""
    if len(rows) < batch_num:
        raise LlmJobError(
            f"the config's batch_num is {batch_num} but the calibration text gives {len(rows)} row(s): upload more "
            "text, lower seq_len or batch_num"
        )
    per = min(batch_size, len(rows) // batch_num)
    return [rows[i * per : (i + 1) * per] for i in range(batch_num)]


# -- measurements -----------------------------------------------------------------------------------------
def _logits(model, ids):
    out = model(input_ids=ids, use_cache=False) if hasattr(model, "config") else model(ids)
    return out.logits if hasattr(out, "logits") else out


def _nll(logits, row) -> float:
    import torch

    return torch.nn.functional.cross_entropy(logits[:-1].float(), row[1:], reduction="sum").item()


def torch_perplexity(model, rows, progress: Callable[[int, int], None]) -> float:
    import torch

    total = 0.0
    with torch.no_grad():
        for i, row in enumerate(rows, 1):
            total += _nll(_logits(model, row[None])[0], row)
            progress(i, len(rows))
    return math.exp(total / (len(rows) * (rows.shape[1] - 1)))


def _session(path: Path, threads: int = 0):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def ort_perplexity(path: Path, rows, progress: Callable[[int, int], None]) -> float:
    import torch

    session = _session(path)
    total = 0.0
    for i, row in enumerate(rows, 1):
        logits = torch.from_numpy(session.run(None, {"input_ids": row[None].numpy()})[0][0])
        total += _nll(logits, row)
        progress(i, len(rows))
    return math.exp(total / (len(rows) * (rows.shape[1] - 1)))


def prefill_latency(files: dict[str, Path], row) -> dict[str, dict]:
    """Median and minimum time of one prefill of `row` per file, on one thread, the files interleaved in
    alternating order so a change of the machine's load falls on all alike (job_process/report.py latency_ms)."""
    import numpy as np

    sessions = {name: _session(path, threads=1) for name, path in files.items()}
    feed = {"input_ids": row[None].numpy()}
    times: dict[str, list[float]] = {name: [] for name in files}
    for run in range(LATENCY_WARMUP + LATENCY_RUNS):
        for name in list(files) if run % 2 == 0 else reversed(list(files)):
            start = time.perf_counter()
            sessions[name].run(None, feed)
            if run >= LATENCY_WARMUP:
                times[name].append(time.perf_counter() - start)
    tokens = int(row.numel())
    return {
        name: {
            "median_ms": float(np.median(t)) * 1e3,
            "min_ms": float(np.min(t)) * 1e3,
            "tokens_per_s": tokens / float(np.median(t)),
        }
        for name, t in times.items()
    }


def file_bytes(path: Path) -> int:
    """The ONNX file and its external-data file, if it has one."""
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.exists() else 0)


# -- the runner ---------------------------------------------------------------------------------------------
def llm_quant(workdir: Path, spec: JobSpec, phase: Callable[..., None]) -> dict:
    import torch

    import amct_engine as amct
    from amct_engine.llm.config import describe_config, load_config_json, parse_config

    out = workdir / "out"
    out.mkdir(parents=True, exist_ok=True)
    params = spec.params
    torch.manual_seed(params.seed)
    started = time.perf_counter()
    seconds: dict[str, float] = {}  # wall time of each step, for the report

    def step(name: str) -> None:
        seconds[name] = time.perf_counter() - started - sum(seconds.values())

    phase("loading", progress=0.02)
    cfg = load_config_json(Path(spec.cfg).read_bytes())  # checked at upload; the same parse here
    parsed = parse_config(cfg)
    model, tokenizer, source = load_model(spec.model, workdir)
    phase("tokenising", progress=0.05)
    calibration, evaluation, counts = token_rows(tokenizer, spec)
    batches = calibration_batches(calibration, parsed.batch_num, params.batch_size)
    # Two rows: torch.export would fix a batch axis traced at 1 (amct.export_onnx does the same for a HF model).
    example = evaluation[:1, : min(16, params.seq_len)].repeat(2, 1)
    step("load_and_tokenise")

    def progress(start: float, end: float):
        last = [0.0]

        def report(done: int, total: int) -> None:
            now = time.monotonic()
            if now - last[0] >= 0.2 or done == total:  # a few lines a second at most (job_process/main.py)
                last[0] = now
                emit("progress", progress=start + (end - start) * done / total, step=done, total_steps=total)

        return report

    phase("baseline", progress=0.08)
    fp32_ppl = torch_perplexity(model, evaluation, progress(0.08, 0.2))
    step("fp32_perplexity")
    fp32_onnx = amct.export_onnx(model, out / "fp32.onnx", example, **IO)
    step("fp32_export")

    phase("calibrating", progress=0.3)
    amct.quantize(model, cfg)
    report_calibration = progress(0.3, 0.4)
    with torch.no_grad():
        for i, batch in enumerate(batches, 1):
            _logits(model, batch)
            report_calibration(i, len(batches))
    phase("converting", progress=0.4)
    amct.convert(model, progress=False, on_layer=progress(0.4, 0.45))
    step("quantisation")
    quant_ppl = torch_perplexity(model, evaluation, progress(0.45, 0.55))

    phase("exporting_onnx", progress=0.55)
    step("perplexity")
    deploy = amct.export_onnx(model, out / "model.onnx", example, **IO)
    step("export")

    phase("measuring", progress=0.7)
    ort_fp32 = ort_perplexity(fp32_onnx, evaluation, progress(0.7, 0.78))
    ort_deploy = ort_perplexity(deploy, evaluation, progress(0.78, 0.86))
    latency = prefill_latency({"fp32": fp32_onnx, "deploy": deploy}, evaluation[0])
    sizes = {"fp32": file_bytes(fp32_onnx), "deploy": file_bytes(deploy)}
    step("onnxruntime")
    report = {
        "kind": spec.kind,
        "llm": {
            "source": source,
            "architecture": "TorchScript trace" if source == "torchscript" else type(model).__name__,
            "config": describe_config(parsed),
            "tokens": {**counts, "calibration_batches": len(batches), "calibration_rows_per_batch": len(batches[0])},
            "perplexity": {
                "fp32": {"pytorch": fp32_ppl, "onnxruntime": ort_fp32},
                "deploy": {"pytorch": quant_ppl, "onnxruntime": ort_deploy},
                "increase": quant_ppl / fp32_ppl - 1,
                "ort_vs_pytorch": ort_deploy / quant_ppl - 1,
            },
            "onnx_size_bytes": sizes,
            "size_ratio": sizes["deploy"] / sizes["fp32"],
            "prefill": {
                "tokens": int(evaluation.shape[1]),
                "threads": 1,
                **latency,
                "speedup": latency["fp32"]["median_ms"] / latency["deploy"]["median_ms"],
            },
            "wall_s": time.perf_counter() - started,
            "step_s": seconds,
        },
    }
    report_path = out / "report.json"
    report_path.write_text(json.dumps(report, indent=2))
    files = {"fp32_onnx": fp32_onnx, "deploy": deploy, "report": report_path}
    for kind, path in (("fp32_onnx_data", fp32_onnx), ("deploy_data", deploy)):
        data = path.with_name(path.name + ".data")
        if data.exists():
            files[kind] = data
    return {"metrics": summary_metrics(report), "artifacts": [_artifact(k, p) for k, p in sorted(files.items())]}


def _artifact(kind: str, path: Path) -> dict:
    media = "application/json" if path.suffix == ".json" else "application/octet-stream"
    return {"kind": kind, "path": str(path), "media_type": media}


def summary_metrics(report: dict) -> dict:
    """The few numbers GET /v1/jobs/{id} shows (the rest is in report.json)."""
    llm = report["llm"]
    ppl, prefill = llm["perplexity"], llm["prefill"]
    return {
        "onnx_size_bytes": llm["onnx_size_bytes"],
        "size_ratio": llm["size_ratio"],
        "perplexity_before": ppl["fp32"]["onnxruntime"],
        "perplexity_after": ppl["deploy"]["onnxruntime"],
        "latency_ms": {"fp32": prefill["fp32"]["median_ms"], "deploy": prefill["deploy"]["median_ms"]},
        "speedup": prefill["speedup"],
    }
