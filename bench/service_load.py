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
import io
import json
import multiprocessing as mp
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np

from job_process.sandbox import stop_group

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `service` importable
    sys.path.insert(0, str(ROOT))

PG_ADMIN_URL = os.environ.get("AMCT_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("AMCT_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
CFG = b"retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }\n"
TERMINAL = {"succeeded", "failed", "cancelled"}
INPUT_SHAPE = (1, 1, 8, 8)
# One engine thread per job child (2 cores, up to 2 workers); the reaper re-sends every job queued for a
# minute, so most of a long batch gets duplicate messages that the claim must turn into no-ops.
WORKER_ENV = {"OMP_NUM_THREADS": "1", "AMCT_REQUEUE_AFTER_S": "60"}
FORK_SERVER_ENV = "AMCT_FORK_SERVER"  # the servers inherit it: `AMCT_FORK_SERVER=0` measures warm processes


# --------------------------------------------------------------------------- the server


@dataclass
class Server:
    url: str
    headers: dict[str, str]
    database_url: str
    data_dir: Path
    auth: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not become ready in {timeout:.0f} s: {log.read_text()[-2000:]}")


def _api_key(data_dir: Path, database_url: str | None) -> tuple[str, dict[str, str]]:
    """``("keys", headers)`` with an admin key for the default project, or ``("none", {})`` on a server
    without API keys. The embedded mode writes its first key to ``<data_dir>/api-key``; for PostgreSQL
    the key is made with the admin functions, as `amct admin create-key` would."""
    try:
        from service import auth
    except ImportError:
        return "none", {}
    key_file = data_dir / auth.KEY_FILE
    if database_url is None:
        deadline = time.monotonic() + 30
        while not key_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        secret = key_file.read_text().strip()
    else:
        from service.db.session import session_factory
        from service.settings import Settings

        _key_id, secret = auth.create_key(session_factory(database_url), Settings().project, ["admin"], name="bench")
    return "keys", {"Authorization": f"Bearer {secret}"}


@contextmanager
def running_server(
    data_dir: Path, env_extra: dict[str, str], max_jobs: int, api_workers: int | None = None
) -> Iterator[Server]:
    """`python -m service serve` (API + embedded worker) in its own process group; stopped on exit.

    `api_workers`: the production API instead, `python -m service api --workers N` (docker-compose.yml),
    with no worker: the caller starts them."""
    port = _free_port()
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        AMCT_MAX_ACTIVE_JOBS=str(max_jobs + 100),
        AMCT_DATA_DIR=str(data_dir),
        **WORKER_ENV,
        **env_extra,
    )
    log = data_dir / "serve.log"
    if api_workers:
        command = [
            sys.executable,
            "-m",
            "service",
            "api",
            "--workers",
            str(api_workers),
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
    else:
        command = [sys.executable, "-m", "service", "serve", "--port", str(port), "--data-dir", str(data_dir)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc, log)
        database_url = env_extra.get("DATABASE_URL")
        auth, headers = _api_key(data_dir, database_url)
        yield Server(url, headers, database_url or f"sqlite:///{(data_dir / 'amct.db').resolve()}", data_dir, auth)
    finally:
        stop_group(proc, 60)


@contextmanager
def postgres_database() -> Iterator[str]:
    """A throwaway PostgreSQL database, dropped on exit."""
    import psycopg

    name = f"amct_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        from service.db.session import engine_for

        engine_for.cache_clear()  # close our pooled connections before the drop
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --------------------------------------------------------------------------- inputs


def tiny_inputs() -> tuple[bytes, bytes]:
    """A no-op-sized TorchScript model (conv 1→4, linear 256→10; 2.6 k params) and 64 labelled samples."""
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3, padding=1)
            self.relu = nn.ReLU()
            self.fc = nn.Linear(4 * 8 * 8, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.flatten(self.relu(self.conv(x)), 1))

    torch.manual_seed(0)
    model = io.BytesIO()
    torch.jit.save(torch.jit.script(Tiny().eval()), model)
    rng = np.random.default_rng(0)
    data = io.BytesIO()
    np.savez(data, inputs=rng.standard_normal((64, *INPUT_SHAPE[1:]), dtype=np.float32), labels=rng.integers(0, 10, 64))
    return model.getvalue(), data.getvalue()


def upload_inputs(client: httpx.Client) -> dict[str, str]:
    model_bytes, data_bytes = tiny_inputs()
    shape = ",".join(map(str, INPUT_SHAPE))
    model = client.post(
        "/v1/models", files={"file": ("tiny.pt", model_bytes)}, data={"name": "tiny", "input_shape": shape}
    )
    config = client.post("/v1/configs", files={"file": ("q.cfg", CFG)}, data={"kind": "retrain"})
    dataset = client.post("/v1/datasets", files={"file": ("d.npz", data_bytes)})
    for r in (model, config, dataset):
        r.raise_for_status()
    ids = {"model_id": model.json()["id"], "config_id": config.json()["id"], "dataset_id": dataset.json()["id"]}
    # Model validation runs in a child process: wait until the model is usable.
    deadline = time.monotonic() + 120
    while client.get(f"/v1/models/{ids['model_id']}").json()["status"] != "ready":
        if time.monotonic() > deadline:
            raise RuntimeError("the uploaded model did not become ready")
        time.sleep(0.1)
    return ids


def _job_body(ids: dict[str, str], seed: int, epochs: int = 1) -> dict[str, Any]:
    return {"kind": "quant_retrain", **ids, "epochs": epochs, "batch_size": 32, "seed": seed}


def _wait(client: httpx.Client, job_id: str, statuses: set[str], timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in statuses:
            return job
        time.sleep(0.005)
    raise TimeoutError(f"job {job_id} not in {statuses} after {timeout:.0f} s")


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
        job = client.post("/v1/jobs", json=_job_body(ids, seed=10_000 + i, epochs=50)).json()
        _wait(client, job["id"], {"running", *TERMINAL})
        latencies.append(time.perf_counter() - start)
        client.post(f"/v1/jobs/{job['id']}/cancel")
        _wait(client, job["id"], TERMINAL)
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
        response = client.post("/v1/jobs", json=_job_body(ids, seed=i), headers={"Idempotency-Key": f"batch-{i}"})
        response.raise_for_status()
        latencies.append((time.perf_counter() - t) * 1000)
        job_ids.append(response.json()["id"])
    return job_ids, latencies, time.perf_counter() - start


def status_counts(database_url: str, job_ids: list[str]) -> Counter[str]:
    """Jobs of the batch per status, read from the database (progress polling stays off the API under test)."""
    from sqlalchemy import func, select

    from service.db.models import Job
    from service.db.session import session_factory

    with session_factory(database_url)() as session:
        rows = session.execute(select(Job.status, func.count()).where(Job.id.in_(job_ids)).group_by(Job.status))
        return Counter(dict(rows.all()))


def wait_settled(database_url: str, job_ids: list[str], timeout: float) -> bool:
    """Wait until every job of the batch is terminal; False when `timeout` ran out first."""
    deadline = time.monotonic() + timeout
    last_report = time.monotonic()
    while True:
        counts = status_counts(database_url, job_ids)
        if sum(counts[s] for s in TERMINAL) == len(job_ids):
            return True
        if time.monotonic() > deadline:
            return False
        if time.monotonic() - last_report > 60:
            _log(f"  {dict(counts)}")
            last_report = time.monotonic()
        time.sleep(1.0)


def cancel_queued(client: httpx.Client, job_ids: list[str], database_url: str) -> int:
    """Cancel every job of the batch that is still queued (the window closed); returns how many."""
    from sqlalchemy import select

    from service.db.models import Job
    from service.db.session import session_factory

    with session_factory(database_url)() as session:
        queued = list(session.scalars(select(Job.id).where(Job.id.in_(job_ids), Job.status == "queued")))
    cancelled = 0
    for job_id in queued:
        response = client.post(f"/v1/jobs/{job_id}/cancel")
        cancelled += response.status_code == 202  # 409: it started or finished meanwhile
    return cancelled


def audit_database(database_url: str, job_ids: list[str]) -> dict[str, Any]:
    """Job rows and their events: which jobs exist, ended, ran (claimed), ran more than once, were re-sent."""
    from sqlalchemy import select

    from service.db.models import Job, JobEvent
    from service.db.session import session_factory

    wanted = set(job_ids)
    with session_factory(database_url)() as session:
        rows = {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(job_ids)))}
        events = session.execute(
            select(JobEvent.job_id, JobEvent.type, JobEvent.payload).where(JobEvent.job_id.in_(job_ids))
        ).all()
    claims: Counter[str] = Counter()
    reclaims: Counter[str] = Counter()
    resent: Counter[str] = Counter()
    for job_id, type_, payload in events:
        if type_ == "state" and payload.get("edge") == "claimed":
            claims[job_id] += 1
        elif type_ == "state" and payload.get("edge") in ("reclaimed", "requeued"):
            reclaims[job_id] += 1
        elif type_ == "log" and str(payload.get("message", "")).startswith("re-sent to the queue"):
            resent[job_id] += 1
    ran = [j for j in rows.values() if j.started_at is not None]
    spans = [(j.started_at, j.finished_at) for j in ran if j.status == "succeeded" and j.finished_at]
    busy_s = (max(f for _, f in spans) - min(s for s, _ in spans)).total_seconds() if spans else 0.0
    return {
        "jobs_in_db": len(rows),
        "missing": len(wanted - rows.keys()),
        "not_terminal": sum(1 for j in rows.values() if j.status not in TERMINAL),
        "statuses": dict(Counter(j.status for j in rows.values())),
        "ran": len(ran),
        "ran_twice": sum(1 for j in wanted if claims[j] > 1 or reclaims[j] > 0) + sum(1 for j in ran if j.attempt != 1),
        "never_claimed_but_ran": sum(1 for j in ran if claims[j.id] == 0),
        "re_sent_messages": sum(resent.values()),
        "jobs_with_re_sent_message": len(resent),
        "succeeded_span_s": busy_s,
    }


def run_batch(
    client: httpx.Client, server: Server, ids: dict, jobs: int, window_s: float, rate: float, seconds: float
) -> dict[str, Any]:
    """Submit the batch, read-load the API while it drains, close the window, audit the database."""
    _log(f"submitting {jobs} jobs")
    job_ids, submit_ms, submit_s = submit_batch(client, ids, jobs)
    _log(f"{jobs} jobs submitted in {submit_s:.1f} s; GET load while they drain; window {window_s:.0f} s")
    busy = ReadLoad(server, job_ids, rate, seconds).start().result()
    drained = wait_settled(server.database_url, job_ids, max(0.0, window_s - seconds))
    cancelled = 0
    if not drained:
        cancelled = cancel_queued(client, job_ids, server.database_url)
        _log(f"window closed: cancelled {cancelled} jobs still queued; waiting for the running ones")
        # The worker still receives the cancelled jobs' messages and must skip each one.
        wait_settled(server.database_url, job_ids, 600)
    audit = audit_database(server.database_url, job_ids)
    succeeded = audit["statuses"].get("succeeded", 0)
    _log(f"audit {audit}")
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
        _workdir(backend) as tmp,
        _backend_env(backend) as env,
        running_server(Path(tmp), env, jobs, api_workers) as server,
        httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as client,
    ):
        if backend != "postgres":
            yield server, client
            return
        with contextlib.ExitStack() as workers:
            for beat in [True, False] if api_workers else [False]:
                workers.enter_context(_extra_worker(Path(tmp), env, beat=beat))
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
        _log(f"{backend}: submit → running ({samples} samples)")
        latencies = submit_to_running(client, ids, samples, idle_s)
        sampled = [j["id"] for j in client.get("/v1/jobs", params={"limit": 50}).json()["items"]]
        _log(f"{backend}: GET load on an idle server ({rate:g}/s per endpoint, {seconds:g} s)")
        idle = ReadLoad(server, sampled, rate, seconds).start().result()
        batch = run_batch(client, server, ids, jobs, window_s, rate, seconds)
    return {
        "backend": _backend_label(backend),
        "auth": server.auth,
        "workers": 2 if backend == "postgres" else 1,
        "api_processes": api_workers if backend == "postgres" and api_workers else 1,
        "submit_to_running_s": {"samples": latencies, "median": statistics.median(latencies)},
        "read_idle": idle,
        "read_busy": batch.pop("read_busy"),
        "batch": batch,
    }


@contextmanager
def _extra_worker(data_dir: Path, env_extra: dict[str, str], beat: bool = False) -> Iterator[subprocess.Popen]:
    """A worker on the same queues: consumers compete for every message (PostgreSQL + Redis only)."""
    from service.cli import worker_command
    from service.settings import DEVICES, Settings

    env = dict(os.environ, PYTHONPATH=str(ROOT), AMCT_DATA_DIR=str(data_dir), **WORKER_ENV, **env_extra)
    settings = Settings(data_dir=data_dir, queue_prefix=env_extra["AMCT_QUEUE_PREFIX"])
    name = f"bench-{uuid.uuid4().hex[:6]}"
    cmd = worker_command(settings, list(DEVICES), beat=beat) + ["-n", f"{name}@%h"]
    if beat:  # its own schedule file: another worker of the run may have one in the same data folder
        cmd[cmd.index("-s") + 1] = str(data_dir / f"beat-{name}")
    with open(data_dir / f"worker-{name}.log", "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        stop_group(proc, 60)


@contextmanager
def _workdir(backend: str) -> Iterator[str]:
    """A temporary folder for the server's files; AMCT_BENCH_KEEP=DIR keeps it under DIR (for debugging)."""
    keep = os.environ.get("AMCT_BENCH_KEEP")
    if keep:
        yield tempfile.mkdtemp(prefix=f"amct-bench-{backend}-", dir=keep)
        return
    # Worker children may still be writing their scratch files while the folder goes.
    with tempfile.TemporaryDirectory(prefix=f"amct-bench-{backend}-", ignore_cleanup_errors=True) as tmp:
        yield tmp


@contextmanager
def _backend_env(backend: str) -> Iterator[dict[str, str]]:
    prefix = {"AMCT_QUEUE_PREFIX": f"amct.bench.{uuid.uuid4().hex[:8]}"}
    if backend == "embedded":
        yield prefix
    elif backend == "postgres":
        try:
            with postgres_database() as url:
                yield {**prefix, "DATABASE_URL": url, "BROKER_URL": REDIS_URL}
        finally:
            _drop_redis_keys(prefix["AMCT_QUEUE_PREFIX"])
    else:
        raise ValueError(f"backend must be 'embedded' or 'postgres', got {backend!r}")


def _drop_redis_keys(queue_prefix: str) -> None:
    """Messages the run left behind (the cancelled jobs' duplicates): the queues and their bindings."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        keys = list(client.scan_iter(match=f"*{queue_prefix}*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def _backend_label(backend: str) -> str:
    return {"embedded": "amct serve (SQLite + filesystem queue)", "postgres": "PostgreSQL + Redis"}[backend]


def _log(message: str) -> None:
    print(f"[service] {message}", file=sys.stderr, flush=True)


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
                "backend": _backend_label(backend),
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
