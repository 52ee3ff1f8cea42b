"""What the size checks of every ONNX file cost (docs/spec/engine.md §5.2).

Times the PTQ pipeline's file writes (`quantize_model`, which writes the fused model, and `save_model`,
which writes the fake-quant and deploy models) and the FP32 export a job makes, each with the size checks
and with them replaced by a no-op, on the Fashion-MNIST CNN (batch 64) and MiniLM (TorchScript, batch 16 x
32 tokens, `batch` and `seq` dynamic). Interleaved, so both variants see the same machine load.

Run: ``.venv/bin/python bench/size_checks.py [--repeats 3]``; prints the CPU's ISA flags and JSON
(seconds, median over repeats, and the checks' share).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import amct_engine as amct  # noqa: E402
from amct_engine.export import save  # noqa: E402
from bench.common import isa_flags  # noqa: E402
from examples.models import SmallFashionCnn  # noqa: E402


@contextmanager
def _checks(enabled: bool):
    if enabled:
        yield
        return
    with mock.patch.object(save, "check_file_sizes", lambda *args, **kwargs: {}):
        yield


def _fashion() -> tuple:
    model = SmallFashionCnn().eval()
    x = torch.randn(64, 1, 28, 28)
    return model, (x,), ["input"], {"input": {0: "batch"}, "output": {0: "batch"}}


def _minilm(folder: Path) -> tuple | None:
    from tests.minilm import SentenceEncoder, load_minilm, minilm_available, train_and_eval_sentences

    if not minilm_available():
        return None
    bert, tokenizer = load_minilm()
    encoder = SentenceEncoder(bert).eval()
    text, _ = train_and_eval_sentences(16, 1)
    rows = tokenizer(text, padding="max_length", max_length=32, truncation=True, return_tensors="pt")
    example = (rows["input_ids"], rows["attention_mask"])
    path = folder / "minilm.pt"
    with torch.no_grad():
        torch.jit.trace(encoder, example, strict=False).save(str(path))
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}, "output": {0: "batch"}}
    return str(path), example, ["input_ids", "attention_mask"], axes


def _pipeline(model, example, names, axes, folder: Path, checks: bool) -> dict[str, float]:
    config, fused, record = str(folder / "q.json"), str(folder / "fused.onnx"), str(folder / "r.txt")
    amct.create_quant_config(config, model, example)
    times = {}
    with _checks(checks):
        start = time.perf_counter()
        calibration = amct.quantize_model(config, fused, record, model, example, names, ["output"], axes)
        times["quantize_model"] = time.perf_counter() - start
        with torch.no_grad():
            calibration(*example)
        start = time.perf_counter()
        amct.save_model(fused, record, str(folder / "out"))
        times["save_model"] = time.perf_counter() - start
        original = torch.jit.load(model) if isinstance(model, str) else model
        start = time.perf_counter()
        save.export_onnx(original, str(folder / "fp32.onnx"), example, names, ["output"], axes)
        times["fp32_export"] = time.perf_counter() - start
    return times


def measure(name: str, case: tuple, folder: Path, repeats: int) -> dict:
    samples: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for _ in range(repeats):
        for checks in (True, False):
            samples[checks].append(_pipeline(*case, folder, checks))
    result = {}
    for step in samples[True][0]:
        with_checks = sorted(s[step] for s in samples[True])[repeats // 2]
        without = sorted(s[step] for s in samples[False])[repeats // 2]
        result[step] = {
            "with_checks_s": round(with_checks, 3),
            "without_s": round(without, 3),
            "checks_s": round(with_checks - without, 3),
        }
    total_with = sum(r["with_checks_s"] for r in result.values())
    total_checks = sum(r["checks_s"] for r in result.values())
    result["total"] = {
        "with_checks_s": round(total_with, 3),
        "checks_s": round(total_checks, 3),
        "checks_share": round(total_checks / total_with, 3),
    }
    return {name: result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    print(f"CPU: {platform.processor() or platform.machine()}; ISA: {', '.join(isa_flags())}")
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        report.update(measure("fashion_cnn", _fashion(), folder, args.repeats))
        minilm = _minilm(folder)
        if minilm is not None:
            report.update(measure("minilm", minilm, folder, args.repeats))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
