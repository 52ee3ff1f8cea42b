"""SIGKILL a Celery worker in the middle of a training job, start another, watch the job resume.

Shared by tests/service/test_recovery.py (one trial) and bench/recovery.py (N trials). Also a
private redis-server that a test may kill and restart without touching the Redis other tests use.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select

from service.db.models import JobEvent
from tests.service.support import Api, Worker, wait_until

# Recovery in seconds, not minutes: a lost lease is noticed after 3 s, the reaper looks every second.
FAST_RECOVERY = {"lease_s": 3.0, "heartbeat_s": 0.5, "reap_interval_s": 1.0, "requeue_after_s": 3.0,
                 "checkpoint_every_steps": 0}
TERMINAL = ("succeeded", "failed", "cancelled")


class RedisServer:
    """A `redis-server` of our own on a free port, without persistence: kill() loses every message."""

    def __init__(self, folder: Path) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.folder = folder
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.folder)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.exceptions.ConnectionError:
                assert self.proc.poll() is None, (self.folder / "redis.log").read_text()
                return False

        wait_until(up, 20, interval=0.05, what=f"redis-server on port {self.port}")
        client.close()

    def kill(self) -> None:
        """A crash: SIGKILL, nothing saved."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def job_events(api: Api, job_id: str) -> list[dict]:
    """The job's events so far, straight from the database (the SSE stream waits for the end)."""
    with api.client.app.state.sessions() as session:
        rows = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.seq)).all()
        return [{"seq": e.seq, "type": e.type, **e.payload} for e in rows]


def get_job(api: Api, job_id: str) -> dict:
    return api.client.get(f"/v1/jobs/{job_id}").json()


def wait_terminal(api: Api, job_id: str, timeout: float) -> dict:
    return wait_until(lambda: (j := get_job(api, job_id))["status"] in TERMINAL and j, timeout, interval=0.2,
                      what=f"job {job_id} finished")


def engine_processes(job_id: str) -> list[int]:
    """Pids of engine children still working on the job (their folder is named after it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if f"job-{job_id}-".encode() in cmdline and b"job_process.main" in cmdline:
                pids.append(int(entry.name))
    return pids


def verify_artifacts(api: Api, job_id: str) -> dict[str, bool]:
    """Every artifact's bytes, downloaded through the API, against its recorded sha256 and size."""
    checks = {}
    for a in api.client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]:
        body = api.client.get(a["content_url"]).content
        checks[a["kind"]] = hashlib.sha256(body).hexdigest() == a["sha256"] and len(body) == a["size_bytes"]
    return checks


@dataclass
class Trial:
    job: dict
    events: list[dict]
    killed_after: dict  # the last checkpoint event recorded before the kill
    recover_s: float  # from the kill to the new attempt's `resumed` event
    finish_s: float  # from the kill to `succeeded`
    orphans: list[int]
    artifacts: dict[str, bool] = field(default_factory=dict)

    @property
    def resumed(self) -> dict | None:
        return next((e for e in self.events if e["type"] == "resumed"), None)


def kill_and_resume(api: Api, ids: dict, log_dir: Path, *, epochs: int = 3, batch_size: int = 8,
                    kill_after_epoch: int = 1, timeout: float = 240) -> Trial:
    """Submit a quant_retrain job, SIGKILL its worker's whole process group once the checkpoint of
    epoch `kill_after_epoch` is stored, start a fresh worker, and wait for the job to end."""
    log_dir.mkdir(parents=True, exist_ok=True)
    first = Worker(api.settings, log_dir / "worker-1.log", beat=True)
    second = None
    try:
        submit = api.submit(kind="quant_retrain", epochs=epochs, batch_size=batch_size, lr=5e-4, **ids)
        assert submit.status_code == 202, submit.text
        job_id = submit.json()["id"]
        checkpoint = wait_until(
            lambda: next((e for e in reversed(job_events(api, job_id))
                          if e["type"] == "checkpoint" and e["epoch"] >= kill_after_epoch), None),
            timeout, interval=0.05, what=f"the checkpoint of epoch {kill_after_epoch}")
        os.killpg(first.proc.pid, signal.SIGKILL)  # the worker, its pool, its beat: no goodbye
        first.proc.wait()
        killed_at = time.monotonic()
        checkpoint = [e for e in job_events(api, job_id) if e["type"] == "checkpoint"][-1]
        # The engine child runs in a session of its own; the kernel ends it with its parent.
        deadline = killed_at + 10
        while (orphans := engine_processes(job_id)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in orphans:  # reported by the caller; not left behind
            os.kill(pid, signal.SIGKILL)
        second = Worker(api.settings, log_dir / "worker-2.log", beat=True)
        resumed_at = wait_until(lambda: any(e["type"] == "resumed" for e in job_events(api, job_id))
                                and time.monotonic(), timeout, interval=0.1, what="the resumed attempt")
        job = wait_terminal(api, job_id, timeout)
        finish_s = time.monotonic() - killed_at
        return Trial(job=job, events=job_events(api, job_id), killed_after=checkpoint,
                     recover_s=resumed_at - killed_at, finish_s=finish_s, orphans=orphans,
                     artifacts=verify_artifacts(api, job_id))
    finally:
        first.stop()
        if second is not None:
            second.stop()
