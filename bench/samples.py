"""The README's and docs/service.md's sample jobs, as a newcomer runs them (issue 42): each should give a deploy
model faster than FP32 at batch 1 and 8 and within half a point of its held-out accuracy.

Runs `make samples`' script (examples/samples.py) into --out, then `amct compress` for each kind the samples
have a cfg for, with the settings the docs give (one epoch, everything else at its default), and prints each
job's report figures: held-out top-1 FP32 -> deploy, the speed-ups the report timed side by side (batch 1 and
8), sizes, and the report's warnings. Prints the CPU's ISA flags first: int8 speed depends on them.

Run: ``.venv/bin/python bench/samples.py [--out /tmp/amct-samples] [--reuse]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import isa_flags  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# kind -> the sample cfg the docs run it with
JOBS = {"compressed_retrain": "compress.cfg", "quant_retrain": "quant.cfg", "distill": "distill.cfg"}


def run_job(samples: Path, kind: str, out: Path) -> dict:
    command = [
        sys.executable, "-m", "service", "compress", "--model", str(samples / "cnn.pt"),
        "--cfg", str(samples / JOBS[kind]), "--data", str(samples / "fmnist.npz"), "--kind", kind,
        "--epochs", "1", "--out", str(out),
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        return {"kind": kind, "failed": done.stderr.strip().splitlines()[-1:], "wall_s": wall}
    report = json.loads((out / "report.json").read_text())
    latency = report["latency_ms"]
    speedups = {latency["fp32"]["batch"]: latency["speedup"]}
    speedups |= {row["batch"]: row["speedup"] for row in latency.get("other_batches", [])}
    return {
        "kind": kind,
        "accuracy_fp32": report["accuracy"]["fp32"],
        "accuracy_deploy": report["accuracy"]["deploy"],
        "drop_pts": round(100 * report["accuracy_drop"], 2),
        "held_out": report["eval"]["samples"],
        "speedup_by_batch": {str(b): round(x, 2) for b, x in speedups.items()},
        "size_ratio": round(report["size_ratio"], 3),
        "deploy_target": report.get("deploy", {}).get("deploy_target"),
        "warnings": report.get("warnings", []),
        "wall_s": round(wall, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/amct-samples"))
    parser.add_argument("--reuse", action="store_true", help="keep the samples already in --out/samples")
    args = parser.parse_args()
    samples = args.out / "samples"
    print(f"CPU ISA: {', '.join(isa_flags()) or 'none of ' + 'avx2/avx512/vnni/amx'}; load {os.getloadavg()}")
    if not (args.reuse and (samples / "cnn.pt").exists()):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "examples.samples", "--out", str(samples)], cwd=ROOT, check=True)
        print(f"make samples: {time.perf_counter() - started:.1f} s")
    rows = [run_job(samples, kind, args.out / kind) for kind in JOBS]
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
