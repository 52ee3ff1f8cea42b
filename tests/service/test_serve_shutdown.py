"""Ctrl-C of `amct serve` with job event streams open (issue 39, item 5).

Before, uvicorn waited for the streams to close ("Waiting for connections to close"), which they do only
when their job ends; a second Ctrl-C then ended it with CancelledError tracebacks; and the embedded
worker's stop logged `ForkPoolWorker-N exited with 'signal 15 (SIGTERM)'` as an ERROR. Now the server hangs
up the streams (clients see a dropped stream, to resume with Last-Event-ID) and stops Celery with its cold
shutdown.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

import httpx
import pytest

from tests.service.crash_scenario import processes
from tests.service.live_server import LiveServer
from tests.service.support import QUANT_CFG, wait_until
from tests.service.tenants import tiny_dataset, tiny_model_bytes

STOP_S = 10.0
RESUME_S = 10.0


class Stream(threading.Thread):
    """GET /v1/jobs/{id}/events in a thread: the event types it read, and how it ended."""

    def __init__(self, server: LiveServer, job_id: str) -> None:
        super().__init__(daemon=True)
        self.server, self.job_id = server, job_id
        self.types: list[str] = []
        self.ended: str | Exception | None = None

    def run(self) -> None:
        try:
            with (
                httpx.Client(base_url=self.server.base_url, timeout=httpx.Timeout(10, read=None)) as client,
                client.stream(
                    "GET",
                    f"/v1/jobs/{self.job_id}/events",
                    headers={"Authorization": f"Bearer {self.server.api_key}"},
                ) as response,
            ):
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        self.types.append(line.split(":", 1)[1].strip())
            self.ended = "clean"
        except Exception as e:  # reported by the test
            self.ended = e


def descendants(root: int) -> dict[int, bytes]:
    """pid -> command line of every process below `root` now."""
    table, found, todo = processes(), {}, [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, _group, cmd) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = cmd
                todo.append(pid)
    return found


def descendants_alive(pids: dict[int, bytes]) -> list[int]:
    """Those of `pids` that still run with the same command line (not a reused pid)."""
    table = processes()
    return [pid for pid, cmd in pids.items() if pid in table and table[pid][2] == cmd]


def submit_long_job(server: LiveServer) -> str:
    """A tiny model on 2,048 rows for 1,000 epochs: running for as long as the test lasts."""
    with server.client() as client:
        model = client.post(
            "/v1/models", files={"file": ("m.pt", tiny_model_bytes())}, data={"name": "m", "input_shape": "1,16"}
        )
        assert model.status_code == 201, model.text
        config = client.post("/v1/configs", files={"file": ("q.cfg", QUANT_CFG)}, data={"kind": "retrain"})
        assert config.status_code == 201, config.text
        dataset = client.post("/v1/datasets", files={"file": ("d.npz", tiny_dataset(samples=2048))})
        assert dataset.status_code == 201, dataset.text
        job = client.post(
            "/v1/jobs",
            json={
                "kind": "quant_retrain",
                "model_id": model.json()["id"],
                "config_id": config.json()["id"],
                "dataset_id": dataset.json()["id"],
                "epochs": 1000,
                "batch_size": 4,
            },
        )
        assert job.status_code == 202, job.text
        job_id = job.json()["id"]
        wait_until(lambda: client.get(f"/v1/jobs/{job_id}").json()["status"] == "running", 120, what="the job runs")
    return job_id


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_serve_stops_in_seconds_with_event_streams_open(tmp_path, sig):
    server = LiveServer(tmp_path)
    try:
        job_id = submit_long_job(server)
        streams = [Stream(server, job_id) for _ in range(2)]
        for stream in streams:
            stream.start()
        wait_until(lambda: all("progress" in s.types for s in streams), 60, what="both streams follow the job")
        assert all(s.ended is None for s in streams)
        children = descendants(server.proc.pid)
        assert any(b"celery" in cmd for cmd in children.values()), children

        started = time.monotonic()
        os.kill(server.proc.pid, sig)  # SIGINT: what Ctrl-C in its terminal sends; SIGTERM: docker stop, systemd
        try:
            code = server.proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still up {STOP_S} s after {sig.name}:\n{server.log_text()}") from None
        stopped_in = time.monotonic() - started
        log = (tmp_path / "serve.log").read_text(errors="replace")
        assert code == 0, log[-4000:]

        # Dropped, not ended cleanly: clients (service/client.py, the dashboard) then resume with Last-Event-ID,
        # where a clean end tells them the job is over.
        for stream in streams:
            stream.join(5)
            assert isinstance(stream.ended, httpx.RemoteProtocolError), stream.ended
        assert "Traceback" not in log, log[-4000:]
        assert "CancelledError" not in log, log[-4000:]
        assert "Waiting for connections to close" not in log
        assert not re.search(r"ERROR.*exited with", log), log[-4000:]  # billiard's, for a pool process killed
        # Nothing the server started outlives it: the worker, its pool and beat, the fork server, the job.
        wait_until(lambda: not descendants_alive(children), 5, what="no leftover processes")
        print(f"stopped {stopped_in:.2f} s after {sig.name}")

        # Started again on the same data: the interrupted job is taken up again at once (the reaper runs at
        # start and sees its worker process is gone: core/lease_owner.py), not after its two-minute lease.
        server = LiveServer(tmp_path)
        up = time.monotonic()
        with server.client() as client:
            wait_until(
                lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["attempt"] == 2 and j["status"] == "running",
                RESUME_S,
                interval=0.2,
                what="the interrupted job's second attempt",
            )
        print(f"its job running again {time.monotonic() - up:.2f} s after the restarted server answered")
    finally:
        server.stop()
