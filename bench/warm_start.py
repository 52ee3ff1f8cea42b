"""Queue → running → first training step: cold, warm job processes (worker/warm.py) and the fork server
(worker/fork_server.py), through the real service.

For each mode, `python -m service serve` (PostgreSQL + Redis, its embedded Celery worker; cold:
`AMCT_WARM_START=0`, warm: `AMCT_FORK_SERVER=0`, fork: the defaults) runs small jobs one at a time on an
idle worker: the tiny TorchScript model of
bench/service_load.py (conv 1→4, linear 256→10), 64 samples, 1 epoch of INT8 QAT. Every time comes from
the database, stamped by the API and the worker: `created_at` (submit), `started_at` (claimed), and the
first recorded `progress` event (the worker records a progress line when it reads it; with several lines
in one read only the newest is kept, so this is an upper bound on the first step). Before each warm
sample the bench waits until the worker says its warm job process (or, once, its fork server) is ready
(its log line), so the number is for an idle warm worker; cold samples wait the same idle time.

    .venv/bin/python bench/warm_start.py [--samples 5] [--idle 5]

Prints JSON: per mode the samples and their medians, and warm / cold and fork / cold ratios. ``make bench``
runs it as its ``warm_start`` section (``run``), rendered by bench/report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.service_stack import TERMINAL, backend_env, job_body, log, running_server, upload_inputs  # noqa: E402

# Per mode: the environment, and the worker's log line that says it is ready for a job (a warm process says
# it once per job, a fork server once).
MODES = {
    "cold": ({"AMCT_WARM_START": "0"}, None),
    "warm": ({"AMCT_FORK_SERVER": "0"}, "warm job process ready"),
    "fork": ({"AMCT_FORK_SERVER": "1"}, "fork server ready"),
}


def _times(database_url: str, job_id: str) -> dict[str, float | None]:
    from sqlalchemy import select

    from core.db.models import Job, JobEvent
    from core.db.session import session_factory

    with session_factory(database_url)() as session:
        job = session.get(Job, job_id)
        events = session.execute(
            select(JobEvent.ts, JobEvent.type, JobEvent.payload).where(JobEvent.job_id == job_id).order_by(JobEvent.seq)
        ).all()
    step = next((ts for ts, type_, payload in events if type_ == "progress" and payload.get("step")), None)
    training = next(
        (ts for ts, type_, payload in events if type_ == "phase" and payload.get("phase") == "training"), None
    )
    warm = next(
        (p["message"] for _, t, p in events if t == "log" and str(p.get("message", "")).startswith("warm")), None
    )

    def since(a, b):
        return (b - a).total_seconds() if a is not None and b is not None else None

    return {
        "submit_to_running_s": since(job.created_at, job.started_at),
        "running_to_training_s": since(job.started_at, training),
        "running_to_first_step_s": since(job.started_at, step),
        "submit_to_first_step_s": since(job.created_at, step),
        "status": job.status,
        "warm_log": warm,
    }


def _wait_ready(log: Path, ready: str, count: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while log.read_text(errors="replace").count(ready) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the warm job process was not ready after {timeout:.0f} s")
        time.sleep(0.2)


def run_mode(mode: str, samples: int, idle_s: float) -> dict[str, Any]:
    extra, ready = MODES[mode]
    with (
        tempfile.TemporaryDirectory(prefix="amct-warm-bench-", ignore_cleanup_errors=True) as tmp,
        backend_env("postgres") as env,
    ):
        env = {**env, **extra}
        with (
            running_server(Path(tmp), env, max_jobs=samples) as server,
            httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as client,
        ):
            ids = upload_inputs(client)
            rows = []
            for i in range(samples):
                time.sleep(idle_s)
                if ready:
                    _wait_ready(server.data_dir / "serve.log", ready, 1 if mode == "fork" else i + 1)
                job = client.post("/v1/jobs", json=job_body(ids, seed=i)).json()
                deadline = time.monotonic() + 300
                while client.get(f"/v1/jobs/{job['id']}").json()["status"] not in TERMINAL:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"job {job['id']} did not finish")
                    time.sleep(0.2)
                rows.append(_times(server.database_url, job["id"]))
                log(f"{mode} {i + 1}/{samples}: {rows[-1]}")
    keys = ("submit_to_running_s", "running_to_training_s", "running_to_first_step_s", "submit_to_first_step_s")
    medians = {k: statistics.median(r[k] for r in rows if r[k] is not None) for k in keys}
    return {"samples": rows, "median": medians}


def run(quick: bool = False, samples: int | None = None, idle_s: float | None = None) -> dict[str, Any]:
    """Cold, warm, fork, and warm / cold and fork / cold of the medians: the ``warm_start`` section of ``make bench``
    (bench/run_all.py; ``quick``: 2 samples after 1 s idle), rendered by bench/report.py."""
    samples = samples or (2 if quick else 5)
    idle_s = idle_s if idle_s is not None else (1.0 if quick else 5.0)
    load_before = os.getloadavg()
    results: dict[str, Any] = {"setup": {"samples": samples, "idle_s": idle_s, "backend": "PostgreSQL + Redis"}}
    results.update({mode: run_mode(mode, samples, idle_s) for mode in MODES})
    cold = results["cold"]["median"]
    for mode in ("warm", "fork"):
        results[f"{mode}_over_cold"] = {k: results[mode]["median"][k] / cold[k] for k in cold if cold[k]}
    results["load_average"] = {"before": load_before, "after": os.getloadavg()}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds the worker idles before each submit")
    args = parser.parse_args(argv)
    print(json.dumps(run(samples=args.samples, idle_s=args.idle), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
