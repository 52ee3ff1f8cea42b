"""Helpers shared by the service tests (fixtures live in conftest.py)."""

from __future__ import annotations

import io
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from core.settings import Settings
from job_host.sandbox import stop_group

ROOT = Path(__file__).resolve().parents[2]
PG_ADMIN_URL = os.environ.get("AMCT_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("AMCT_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")
QUANT_CFG = b"""# INT8 QAT: ARQ channel-wise weights, ULQ activations (the defaults, spelt out)
retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }
retrain_data_quant_config { ulq_quantize { dst_type: INT8 } }
"""
RUN_ID = uuid.uuid4().hex[:8]


def npz_bytes(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def make_settings(
    data_dir: Path, database_url: str | None = None, broker_url: str | None = None, **overrides
) -> Settings:
    values = {
        "data_dir": data_dir,
        "database_url": database_url,
        "broker_url": broker_url,
        "queue_prefix": f"amct.test.{RUN_ID}.{uuid.uuid4().hex[:6]}",
        "heartbeat_s": 1.0,
        "broker_poll_s": 0.05,
        "sse_poll_s": 0.05,
        # The session's PostgreSQL database keeps every module's queued jobs in one project:
        # the quota would refuse later modules' jobs. test_auth.py sets its own limit.
        "max_active_jobs": 100_000,
        **overrides,
    }
    return Settings(**values)


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a worker process build the same Settings."""
    env = {
        "AMCT_DATA_DIR": str(settings.data_dir),
        "AMCT_QUEUE_PREFIX": settings.queue_prefix,
        "AMCT_HEARTBEAT_S": str(settings.heartbeat_s),
        "AMCT_BROKER_POLL_S": str(settings.broker_poll_s),
        "DATABASE_URL": settings.resolved_database_url,
        "BROKER_URL": settings.resolved_broker_url,
        "ARTIFACT_STORE": settings.resolved_artifact_store,
    }
    # The recovery timings (test_recovery.py shortens them so a crash heals in seconds).
    for name in (
        "lease_s",
        "cancel_grace_s",
        "reap_interval_s",
        "requeue_after_s",
        "checkpoint_every_steps",
        "worker_heartbeat_s",
        "worker_stale_s",
        "unserved_wait_s",
        "warm_start",
        "fork_server",
        "multinode",
        "node_join_timeout_s",
    ):
        env[f"AMCT_{name.upper()}"] = str(getattr(settings, name))
    if settings.node_address:
        env["AMCT_NODE_ADDRESS"] = settings.node_address
    for name in ("job_memory_bytes", "job_disk_bytes"):  # None: sized from the machine
        if (value := getattr(settings, name)) is not None:
            env[f"AMCT_{name.upper()}"] = str(value)
    return env


class Worker:
    """A real `celery worker` subprocess; its log is a file the tests can read."""

    def __init__(self, settings: Settings, log_path: Path, devices=("cpu",), beat: bool = False) -> None:
        from service.cli import worker_command

        self.log_path = log_path
        env = dict(os.environ, **settings_env(settings), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="2")
        cmd = worker_command(settings, list(devices), beat=beat)  # beat: the reaper's schedule too
        cmd += ["-n", f"test-{uuid.uuid4().hex[:6]}@%h", "--without-heartbeat"]
        self.log = open(log_path, "wb")  # noqa: SIM115 - open for the worker's whole life
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.wait_for("ready", timeout=60)

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            if self.proc.poll() is not None:
                raise RuntimeError(f"celery worker exited ({self.proc.returncode}):\n{self.text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{needle!r} not in the worker log after {timeout} s:\n{self.text()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        stop_group(self.proc, 20)
        self.log.close()


def wait_until(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met after {timeout} s")
        time.sleep(interval)


class Api:
    """A TestClient over the app plus upload helpers; `settings` is what the app runs with."""

    def __init__(self, client, settings: Settings) -> None:
        self.client, self.settings = client, settings

    def upload_model(self, path: Path, input_shape: str = "1,1,28,28", name: str = "cnn", **fields):
        with open(path, "rb") as f:
            return self.client.post(
                "/v1/models", files={"file": (path.name, f)}, data={"name": name, "input_shape": input_shape, **fields}
            )

    def upload_config(self, data: bytes, kind: str = "retrain", filename: str = "job.cfg"):
        return self.client.post("/v1/configs", files={"file": (filename, data)}, data={"kind": kind})

    def upload_dataset(self, data: bytes, filename: str = "data.npz"):
        return self.client.post("/v1/datasets", files={"file": (filename, data)}, data={"name": filename})

    def submit(self, headers=None, **body):
        return self.client.post("/v1/jobs", json=body, headers=headers or {})


def open_api(settings: Settings, scopes: tuple[str, ...] = ("admin",)):
    """A TestClient over a fresh app; once entered (`with`), it sends an API key of `settings.project`
    with `scopes` (none in open mode)."""
    from fastapi.testclient import TestClient

    from service import auth
    from service.app import create_app

    class KeyedClient(TestClient):
        def __enter__(self):
            client = super().__enter__()  # runs the lifespan: migrations, the project row
            if settings.auth == "keys":
                _key_id, secret = auth.create_key(self.app.state.sessions, settings.project, scopes, "tests")
                client.headers["Authorization"] = f"Bearer {secret}"
            return client

    return KeyedClient(create_app(settings), raise_server_exceptions=False)


TERMINAL = ("succeeded", "failed", "cancelled")


def wait_terminal(api: Api, job_id: str, timeout: float = 240) -> dict:
    """The job once it has ended (succeeded, failed or cancelled)."""
    return wait_until(
        lambda: (j := api.client.get(f"/v1/jobs/{job_id}").json())["status"] in TERMINAL and j,
        timeout,
        interval=0.25,
        what=f"job {job_id} finished",
    )


@contextmanager
def api_with_ready_model(settings: Settings, assets: Path) -> Iterator[tuple[Api, dict]]:
    """The API with the test CNN as a ready model (its row inserted: the upload check is tested elsewhere),
    the INT8 QAT cfg and the small dataset uploaded; yields the Api and the ids a job request names."""
    from core.db.models import Model

    with open_api(settings) as client:
        api = Api(client, settings)
        blob = client.app.state.store.put_file(assets / "cnn.pt")
        with client.app.state.sessions() as session:
            model = Model(
                project_id=settings.project,
                name="cnn",
                input_shape=[1, 1, 28, 28],
                status="ready",
                layers={},
                sha256=blob.sha256,
                size_bytes=blob.size_bytes,
                uri=blob.uri,
            )
            session.add(model)
            session.commit()
        ids = {
            "model_id": model.id,
            "config_id": api.upload_config(QUANT_CFG).json()["id"],
            "dataset_id": api.upload_dataset((assets / "small.npz").read_bytes()).json()["id"],
        }
        yield api, ids


@contextmanager
def worker_stack(data_dir: Path, pg_url: str, redis_url: str) -> Iterator[tuple[Api, Worker]]:
    """The API on PostgreSQL and Redis (a fresh queue prefix) and a real Celery worker process."""
    settings = make_settings(data_dir, database_url=pg_url, broker_url=redis_url)
    with open_api(settings) as client:
        api = Api(client, settings)
        worker = Worker(settings, data_dir / "worker.log")
        try:
            yield api, worker
        finally:
            worker.stop()
