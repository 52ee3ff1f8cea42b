"""The service under test for the service benchmarks: a server started on a free port (the embedded `amct serve`, or
PostgreSQL + Redis in the production shape), its API key, the tiny model and dataset every job uses, and the
helpers to submit and wait (bench/service_load.py, bench/warm_start.py)."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from job_host.sandbox import stop_group

ROOT = Path(__file__).resolve().parents[1]


PG_ADMIN_URL = os.environ.get("AMCT_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


REDIS_URL = os.environ.get("AMCT_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")


CFG = b"retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }\n"


TERMINAL = {"succeeded", "failed", "cancelled"}


INPUT_SHAPE = (1, 1, 8, 8)


# One engine thread per job child (2 cores, up to 2 workers); the reaper re-sends every job queued for a
# minute, so most of a long batch gets duplicate messages that the claim must turn into no-ops.
WORKER_ENV = {"OMP_NUM_THREADS": "1", "AMCT_REQUEUE_AFTER_S": "60"}


FORK_SERVER_ENV = "AMCT_FORK_SERVER"  # the servers inherit it: `AMCT_FORK_SERVER=0` measures warm processes


@dataclass
class Server:
    url: str
    headers: dict[str, str]
    database_url: str
    data_dir: Path
    auth: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
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


def api_key(data_dir: Path, database_url: str | None) -> tuple[str, dict[str, str]]:
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
        from core.db.session import session_factory
        from core.settings import Settings

        _key_id, secret = auth.create_key(session_factory(database_url), Settings().project, ["admin"], name="bench")
    return "keys", {"Authorization": f"Bearer {secret}"}


@contextmanager
def running_server(
    data_dir: Path, env_extra: dict[str, str], max_jobs: int, api_workers: int | None = None
) -> Iterator[Server]:
    """`python -m service serve` (API + embedded worker) in its own process group; stopped on exit.

    `api_workers`: the production API instead, `python -m service api --workers N` (docker-compose.yml),
    with no worker: the caller starts them."""
    port = free_port()
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
        wait_ready(url, proc, log)
        database_url = env_extra.get("DATABASE_URL")
        auth, headers = api_key(data_dir, database_url)
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
        from core.db.session import engine_for

        engine_for.cache_clear()  # close our pooled connections before the drop
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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


def job_body(ids: dict[str, str], seed: int, epochs: int = 1) -> dict[str, Any]:
    return {"kind": "quant_retrain", **ids, "epochs": epochs, "batch_size": 32, "seed": seed}


def wait_status(client: httpx.Client, job_id: str, statuses: set[str], timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in statuses:
            return job
        time.sleep(0.005)
    raise TimeoutError(f"job {job_id} not in {statuses} after {timeout:.0f} s")


@contextmanager
def extra_worker(data_dir: Path, env_extra: dict[str, str], beat: bool = False) -> Iterator[subprocess.Popen]:
    """A worker on the same queues: consumers compete for every message (PostgreSQL + Redis only)."""
    from core.settings import DEVICES, Settings
    from service.cli import worker_command

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
def workdir(backend: str) -> Iterator[str]:
    """A temporary folder for the server's files; AMCT_BENCH_KEEP=DIR keeps it under DIR (for debugging)."""
    keep = os.environ.get("AMCT_BENCH_KEEP")
    if keep:
        yield tempfile.mkdtemp(prefix=f"amct-bench-{backend}-", dir=keep)
        return
    # Worker children may still be writing their scratch files while the folder goes.
    with tempfile.TemporaryDirectory(prefix=f"amct-bench-{backend}-", ignore_cleanup_errors=True) as tmp:
        yield tmp


@contextmanager
def backend_env(backend: str) -> Iterator[dict[str, str]]:
    prefix = {"AMCT_QUEUE_PREFIX": f"amct.bench.{uuid.uuid4().hex[:8]}"}
    if backend == "embedded":
        yield prefix
    elif backend == "postgres":
        try:
            with postgres_database() as url:
                yield {**prefix, "DATABASE_URL": url, "BROKER_URL": REDIS_URL}
        finally:
            drop_redis_keys(prefix["AMCT_QUEUE_PREFIX"])
    else:
        raise ValueError(f"backend must be 'embedded' or 'postgres', got {backend!r}")


def drop_redis_keys(queue_prefix: str) -> None:
    """Messages the run left behind (the cancelled jobs' duplicates): the queues and their bindings."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        keys = list(client.scan_iter(match=f"*{queue_prefix}*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def backend_label(backend: str) -> str:
    return {"embedded": "amct serve (SQLite + filesystem queue)", "postgres": "PostgreSQL + Redis"}[backend]


def log(message: str) -> None:
    print(f"[service] {message}", file=sys.stderr, flush=True)
