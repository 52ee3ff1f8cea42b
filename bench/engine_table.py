"""The Fashion-MNIST engine table: the FP32 row, every method row, then the deploy measurements.

Run: ``python bench/engine_table.py [--quick] [--only ptq|qat|compress|peers|<row name part> ...]``
(``--only ptq`` is the FP32 base, the FP32 row and the ORT PTQ row). ``make bench`` runs the whole
table as its ``engine`` section (bench/run_all.py). The rows come from bench/ptq.py, bench/qat.py and
bench/compress.py (with their peers, bench/peers.py); the shared setting is bench/fashion.py.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import compress, ptq, qat  # noqa: E402
from bench.fashion import BASELINE, FashionSetup, Row, fp32_control, measure_deploy, prepare, run_row  # noqa: E402

# --only presets: the rows each method module contributes (matched as parts of row names).
PRESETS = {
    "ptq": ["PTQ"],
    "qat": ["QAT", "distill"],
    "compress": ["BCP", "M4N2", "Torch-Pruning"],
    "peers": ["torchao", "NNCF", "Torch-Pruning"],
}


def sections(setup: FashionSetup) -> list[tuple[str, str, Callable[[], Row]]]:
    """Every method of the engine table as ``(name, family, fn)``, FP32 first (the PTQ row needs its model)."""
    return [
        (BASELINE, "baseline", lambda: fp32_control(setup)),
        *ptq.methods(setup),
        *qat.methods(setup),
        *compress.methods(setup),
    ]


def run(workdir: Path, quick: bool = False, threads: int = 2, only: list[str] | None = None) -> dict[str, Any]:
    """The whole engine table: base model once, every method, then the deploy measurements."""
    torch.set_num_threads(threads)
    start = time.perf_counter()
    setup = prepare(workdir, quick=quick, threads=threads)
    print(f"[engine] FP32 base: top-1 {setup.base_accuracy:.4f} in {setup.base_train_s:.1f} s", file=sys.stderr)
    rows = [
        run_row(name, family, fn)
        for name, family, fn in sections(setup)
        if not only or name == BASELINE or any(o.lower() in name.lower() for o in only)
    ]
    measure_deploy(setup, rows)
    for row in rows:
        row.pop("onnx", None)  # temporary paths: not worth keeping in the results
    return {"setup": setup.describe(), "rows": rows, "total_s": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    from bench import report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few thousand images, for a smoke run")
    parser.add_argument("--threads", type=int, default=2, help="torch and onnxruntime threads")
    parser.add_argument(
        "--only", action="append", default=[], help=f"a preset ({', '.join(PRESETS)}) or part of a row name; repeatable"
    )
    args = parser.parse_args(argv)
    only = [name for o in args.only for name in PRESETS.get(o, [o])] or None
    with tempfile.TemporaryDirectory(prefix="amct-engine-bench-") as tmp:
        result = run(Path(tmp), quick=args.quick, threads=args.threads, only=only)
    print(report.engine_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
