"""Service load: read latency at a fixed request rate, submit → running, and 1,000 jobs none lost or run twice.

For each back end (the embedded `amct serve`: SQLite + filesystem queue; and PostgreSQL + Redis) this
starts the service on a free port: `python -m service serve` with its embedded worker, or for PostgreSQL
+ Redis the production shape (`--api-workers N` API processes of `python -m service api` and two
Celery workers, each with its fork server), and measures, from client processes separate from the
server:

- submit → running: client-observed seconds from ``POST /v1/jobs`` to status ``running`` on an idle
  worker (each sampled job is cancelled once running);
- p50 / p99 of ``GET /v1/jobs/{id}`` and ``GET /v1/jobs`` at a fixed request rate (open loop: latency
  counts from the scheduled send time, so a slow server cannot hide behind fewer requests), once on an
  idle server and once while the job queue drains;
- a batch of jobs (1,000 by default) on a no-op-sized model (a 2-layer TorchScript net, 64 samples,
  1 epoch): submit rate, drain time and throughput; then the database is audited: every job reached a
  terminal state (none lost), every job was claimed exactly once with ``attempt == 1`` (none ran twice).

PostgreSQL (trust auth, default ``postgresql://postgres@127.0.0.1:5432/postgres``) gets a throwaway
database, dropped at the end; Redis (``redis://127.0.0.1:6379/12``) a unique queue prefix. The server runs
with API keys (``Authorization: Bearer``) and with the per-project active-job quota raised above the
batch size, so the batch measures the queue rather than the quota.

    .venv/bin/python bench/service_load.py [--quick] [--jobs 1000] [--backends embedded postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.service_audit import audit_database, cancel_queued, wait_settled  # noqa: E402
from bench.service_stack import (  # noqa: E402
    FORK_SERVER_ENV,
    TERMINAL,
    WORKER_ENV,
    Server,
    backend_env,
    backend_label,
    extra_worker,
    job_body,
    log,
    running_server,
    upload_inputs,
    wait_status,
    workdir,
)

# --------------------------------------------------------------------------- measurements


def submit_to_running(client: httpx.Client, ids: dict, samples: int, idle_s: float) -> list[float]:
    """Client-observed seconds from POST /v1/jobs to status running; each job is then cancelled.

    `idle_s` before each submit lets the worker settle after the cancelled job: the number is for an
    idle worker, not one still cleaning up.
    """
    latencies = []
    for i in range(samples):
        time.sleep(idle_s)
        start = time.perf_counter()
        job = client.post("/v1/jobs", json=job_body(ids, seed=10_000 + i, epochs=50)).json()
        wait_status(client, job["id"], {"running", *TERMINAL})
        latencies.append(time.perf_counter() - start)
        client.post(f"/v1/jobs/{job['id']}/cancel")
        wait_status(client, job["id"], TERMINAL)
    return latencies


async def _open_loop(url: str, headers: dict, paths: dict[str, list[str]], rate: float, seconds: float) -> dict:
    """Each endpoint gets `rate` requests a second on a fixed schedule; latency counts from the schedule.

    aiohttp, not httpx: the load shares the server's cores, and per request httpx took 3.3-3.6 ms of this
    process's CPU against aiohttp's 1.0 ms (50 + 50 requests/s, measured 2026-12-03)."""
    samples: dict[str, list[float]] = {name: [] for name in paths}
    errors: Counter[str] = Counter()
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(
        base_url=url, headers=headers, connector=connector, timeout=aiohttp.ClientTimeout(total=30)
    ) as client:
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def one(name: str, path: str, due: float) -> None:
            await asyncio.sleep(max(0.0, due - loop.time()))
            try:
                async with client.get(path) as response:
                    await response.read()
                    if response.status != 200:
                        errors[f"{name}: HTTP {response.status}"] += 1
                        return
            except (aiohttp.ClientError, TimeoutError) as e:
                errors[f"{name}: {type(e).__name__}"] += 1
                return
            samples[name].append((loop.time() - due) * 1000)

        tasks = []
        count = int(rate * seconds)
        for i in range(count):
            for k, (name, choices) in enumerate(paths.items()):
                # the endpoints are offset by half an interval: the server sees an even stream
                due = start + (i + k / len(paths)) / rate
                tasks.append(asyncio.create_task(one(name, choices[i % len(choices)], due)))
        await asyncio.gather(*tasks)
    return {"samples": samples, "errors": dict(errors)}


def _load_process(url: str, headers: dict, paths: dict, rate: float, seconds: float, out: mp.Queue) -> None:
    out.put(asyncio.run(_open_loop(url, headers, paths, rate, seconds)))


def _percentiles(samples: Sequence[float]) -> dict[str, float]:
    if len(samples) < 2:
        return {"requests": len(samples)}
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return {"requests": len(samples), "p50_ms": q[49], "p99_ms": q[98], "max_ms": max(samples)}


class ReadLoad:
    """A fixed-rate GET load from a second process (spawned: nothing shared with this one)."""

    def __init__(self, server: Server, job_ids: list[str], rate: float, seconds: float) -> None:
        self.rate, self.seconds = rate, seconds
        paths = {"GET /v1/jobs/{id}": [f"/v1/jobs/{j}" for j in job_ids], "GET /v1/jobs": ["/v1/jobs?limit=50"]}
        ctx = mp.get_context("spawn")
        self.queue: mp.Queue = ctx.Queue()
        # A daemon: a load that outlives its measurement (a server too slow to answer) dies with the bench.
        self.proc = ctx.Process(
            target=_load_process, args=(server.url, server.headers, paths, rate, seconds, self.queue), daemon=True
        )

    def start(self) -> ReadLoad:
        self.proc.start()
        return self

    def result(self) -> dict[str, Any]:
        try:
            raw = self.queue.get(timeout=self.seconds + 300)
        except queue.Empty:  # the server answered too slowly for the load to finish: say so, keep the rest
            self.proc.terminate()
            return {
                "rate_per_endpoint": self.rate,
                "seconds": self.seconds,
                "endpoints": {},
                "errors": {"the load did not finish within its time": 1},
            }
        self.proc.join()
        endpoints = {name: _percentiles(s) for name, s in raw["samples"].items()}
        return {
            "rate_per_endpoint": self.rate,
            "seconds": self.seconds,
            "endpoints": endpoints,
            "errors": raw["errors"],
        }


def submit_batch(client: httpx.Client, ids: dict, jobs: int) -> tuple[list[str], list[float], float]:
    """Submit `jobs` jobs as fast as one client can; (ids, per-request ms, seconds)."""
    job_ids, latencies = [], []
    start = time.perf_counter()
    for i in range(jobs):
        t = time.perf_counter()
        response = client.post("/v1/jobs", json=job_body(ids, seed=i), headers={"Idempotency-Key": f"batch-{i}"})
        response.raise_for_status()
        latencies.append((time.perf_counter() - t) * 1000)
        job_ids.append(response.json()["id"])
    return job_ids, latencies, time.perf_counter() - start


def run_batch(
    client: httpx.Client, server: Server, ids: dict, jobs: int, window_s: float, rate: float, seconds: float
) -> dict[str, Any]:
    """Submit the batch, read-load the API while it drains, close the window, audit the database."""
    log(f"submitting {jobs} jobs")
    job_ids, submit_ms, submit_s = submit_batch(client, ids, jobs)
    log(f"{jobs} jobs submitted in {submit_s:.1f} s; GET load while they drain; window {window_s:.0f} s")
    busy = ReadLoad(server, job_ids, rate, seconds).start().result()
    drained = wait_settled(server.database_url, job_ids, max(0.0, window_s - seconds))
    cancelled = 0
    if not drained:
        cancelled = cancel_queued(client, job_ids, server.database_url)
        log(f"window closed: cancelled {cancelled} jobs still queued; waiting for the running ones")
        # The worker still receives the cancelled jobs' messages and must skip each one.
        wait_settled(server.database_url, job_ids, 600)
    audit = audit_database(server.database_url, job_ids)
    succeeded = audit["statuses"].get("succeeded", 0)
    log(f"audit {audit}")
    return {
        "jobs": jobs,
        "window_s": window_s,
        "submit_s": submit_s,
        "submit_ms": _percentiles(submit_ms),
        "drained_in_window": drained,
        "cancelled_after_window": cancelled,
        "succeeded": succeeded,
        "jobs_per_min": 60 * succeeded / audit["succeeded_span_s"] if audit["succeeded_span_s"] else None,
        "audit": audit,
        "lost": audit["missing"] + audit["not_terminal"],
        "ran_twice": audit["ran_twice"],
        "read_busy": busy,
    }


# --------------------------------------------------------------------------- one back end


@contextmanager
def backend_server(backend: str, jobs: int, api_workers: int | None = None) -> Iterator[tuple[Server, httpx.Client]]:
    """The server of one back end, ready, with an authenticated client; everything is undone on exit.

    PostgreSQL + Redis: with `api_workers`, the production shape (that many API processes, two Celery workers,
    one with the reaper's beat); without, `amct serve`'s embedded worker and one more."""
    api_workers = api_workers if backend == "postgres" else None
    with (
        workdir(backend) as tmp,
        backend_env(backend) as env,
        running_server(Path(tmp), env, jobs, api_workers) as server,
        httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as client,
    ):
        if backend != "postgres":
            yield server, client
            return
        with contextlib.ExitStack() as workers:
            for beat in [True, False] if api_workers else [False]:
                workers.enter_context(extra_worker(Path(tmp), env, beat=beat))
            yield server, client


def run_backend(
    backend: str,
    jobs: int,
    window_s: float,
    rate: float,
    seconds: float,
    samples: int,
    idle_s: float,
    api_workers: int | None = None,
) -> dict[str, Any]:
    with backend_server(backend, jobs, api_workers) as (server, client):
        ids = upload_inputs(client)
        log(f"{backend}: submit → running ({samples} samples)")
        latencies = submit_to_running(client, ids, samples, idle_s)
        sampled = [j["id"] for j in client.get("/v1/jobs", params={"limit": 50}).json()["items"]]
        log(f"{backend}: GET load on an idle server ({rate:g}/s per endpoint, {seconds:g} s)")
        idle = ReadLoad(server, sampled, rate, seconds).start().result()
        batch = run_batch(client, server, ids, jobs, window_s, rate, seconds)
    return {
        "backend": backend_label(backend),
        "auth": server.auth,
        "workers": 2 if backend == "postgres" else 1,
        "api_processes": api_workers if backend == "postgres" and api_workers else 1,
        "submit_to_running_s": {"samples": latencies, "median": statistics.median(latencies)},
        "read_idle": idle,
        "read_busy": batch.pop("read_busy"),
        "batch": batch,
    }


def run(
    quick: bool = False,
    backends: Sequence[str] = ("embedded", "postgres"),
    jobs: int | None = None,
    window_s: float | None = None,
    rate: float = 100.0,
    seconds: float | None = None,
    api_workers: int | None = 2,
) -> dict[str, Any]:
    """Every back end in turn; a failed back end is reported as such and the next still runs.

    `rate` is per endpoint: the default 100 + 100 is the 200 requests/s of docs/scaling.md's targets."""
    jobs = jobs or (20 if quick else 1000)
    window_s = window_s or (40.0 if quick else 300.0)  # two back ends: the window bounds the section
    seconds = seconds or (4.0 if quick else 15.0)
    samples, idle_s = (2, 2.0) if quick else (5, 5.0)
    inherited = {FORK_SERVER_ENV: os.environ[FORK_SERVER_ENV]} if FORK_SERVER_ENV in os.environ else {}
    results: dict[str, Any] = {
        "setup": {
            "jobs": jobs,
            "window_s": window_s,
            "rate_per_endpoint": rate,
            "seconds": seconds,
            "submit_samples": samples,
            "idle_s": idle_s,
            "server_env": {**WORKER_ENV, **inherited},
            "model": "TorchScript conv(1→4) + linear(256→10), 64 samples of 1x8x8, 1 epoch INT8 QAT",
        },
        "backends": {},
    }
    for backend in backends:
        start = time.perf_counter()
        try:
            res = run_backend(backend, jobs, window_s, rate, seconds, samples, idle_s, api_workers)
            res["status"] = "ok"
        except Exception as e:  # one back end down (e.g. no PostgreSQL) must not lose the other's numbers
            res = {
                "status": "failed",
                "reason": f"{type(e).__name__}: {e}".splitlines()[0][:300],
                "backend": backend_label(backend),
            }
        res["wall_s"] = time.perf_counter() - start
        res["load_average_after"] = os.getloadavg()  # the machine's 1/5/15-minute load: other work skews latency
        results["backends"][backend] = res
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 jobs, 4 s of load")
    parser.add_argument("--jobs", type=int, help="jobs in the batch (default 1000; 20 with --quick)")
    parser.add_argument("--window", type=float, help="seconds the batch may drain before the rest is cancelled")
    parser.add_argument("--rate", type=float, default=100.0, help="GET requests a second, per endpoint (two)")
    parser.add_argument(
        "--api-workers",
        type=int,
        default=2,
        help="PostgreSQL + Redis: API processes (the production command); 0: `amct serve` instead",
    )
    parser.add_argument("--seconds", type=float, help="duration of each GET load")
    parser.add_argument("--backends", nargs="+", default=["embedded", "postgres"], choices=["embedded", "postgres"])
    args = parser.parse_args(argv)
    results = run(args.quick, args.backends, args.jobs, args.window, args.rate, args.seconds, args.api_workers or None)
    print(json.dumps(results, indent=2))
    return 0 if all(r["status"] == "ok" for r in results["backends"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
