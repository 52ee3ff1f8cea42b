"""`python -m service serve` (the future `amct serve`): API + embedded worker over real HTTP, no servers.

No DATABASE_URL, BROKER_URL or ARTIFACT_STORE: SQLite, kombu's filesystem transport and the
local store, all under --data-dir.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from job_host.sandbox import stop_group
from tests.service.crash_scenario import (
    FAST_RECOVERY_ENV,
    WIRING,
    EmbeddedServer,
    kill_embedded_worker_and_resume,
    trial_summary,
)
from tests.service.support import QUANT_CFG, ROOT, wait_until

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in WIRING}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="2", AMCT_HEARTBEAT_S="1", AMCT_BROKER_POLL_S="0.05")
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - the server's whole life
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--port", str(port), "--data-dir", str(tmp_path / "data")],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)

    def up():
        try:
            return client.get("/readyz").status_code == 200
        except httpx.TransportError:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            return False

    try:
        wait_until(up, 90, interval=0.2, what="the server answers /readyz")
        # The first start wrote the local admin key for local clients (mode 0600).
        client.headers["Authorization"] = f"Bearer {(tmp_path / 'data' / 'api-key').read_text().strip()}"
        yield client, tmp_path / "data"
    finally:
        client.close()
        stop_group(proc, 30)
        log.close()


def test_embedded_serve_runs_a_quant_job_end_to_end(server, assets):
    client, data_dir = server
    with open(assets / "cnn.pt", "rb") as f:
        model = client.post(
            "/v1/models", files={"file": ("cnn.pt", f)}, data={"name": "cnn", "input_shape": "1,1,28,28"}
        )
    assert model.status_code == 201, model.text
    config = client.post("/v1/configs", files={"file": ("q.cfg", QUANT_CFG)}, data={"kind": "retrain"})
    dataset = client.post("/v1/datasets", files={"file": ("d.npz", (assets / "small.npz").read_bytes())})
    submitted_at = time.monotonic()
    submit = client.post(
        "/v1/jobs",
        json={
            "kind": "quant_retrain",
            "model_id": model.json()["id"],
            "config_id": config.json()["id"],
            "dataset_id": dataset.json()["id"],
            "epochs": 1,
            "batch_size": 32,
            "lr": 5e-4,
            "eval_fraction": 0.25,
        },
    )
    assert submit.status_code == 202, submit.text
    location = submit.headers["location"]

    # Follow the server-sent events until the stream ends with the job.
    events = []
    with client.stream("GET", f"{location}/events", timeout=300) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if events[-1]["type"] == "state" and events[-1]["status"] == "running":
                    running_after = time.monotonic() - submitted_at
    states = [e["status"] for e in events if e["type"] == "state"]
    assert states == ["queued", "running", "succeeded"], client.get(location).json()
    assert running_after < 10  # an idle embedded worker picks the job up at once

    assert (data_dir / "amct.db").is_file() and any((data_dir / "artifacts" / "sha256").iterdir())
    artifacts = {a["kind"]: a for a in client.get(f"{location}/artifacts").json()["items"]}
    report = client.get(artifacts["report"]["content_url"]).json()
    assert report["accuracy"]["deploy"] >= report["accuracy"]["fp32"] - 0.05 and report["accuracy"]["fp32"] > 0.7
    session = ort.InferenceSession(
        client.get(artifacts["deploy"]["content_url"]).content, providers=["CPUExecutionProvider"]
    )
    data = np.load(assets / "small.npz")
    assert (session.run(None, {"input": data["inputs"]})[0].argmax(1) == data["labels"]).mean() > 0.7


# -- the embedded worker killed --------------------------------------------------------------------


def test_a_killed_embedded_worker_is_restarted_and_its_job_resumes(tmp_path, assets):
    """kill -9 of `amct serve`'s worker mid-training: its pool and beat go with it, a new worker starts,
    and the job resumes from its checkpoint there and succeeds (issue 16: it stayed queued for good)."""
    with EmbeddedServer(tmp_path, **FAST_RECOVERY_ENV) as server:
        ids = server.upload(assets)
        trial = kill_embedded_worker_and_resume(server, ids)
        job, events = trial.job, trial.events
        assert job["status"] == "succeeded", (job, server.log_tail())
        assert trial.old_worker_group and trial.orphans == []  # the worker, its pool and beat: all gone
        assert job["attempt"] == 2 and job["metrics"]["resumed_from"]["epoch"] >= 1
        states = [e["status"] for e in events if e["type"] == "state"]
        assert states == ["queued", "running", "queued", "running", "succeeded"], states
        summary = trial_summary(trial)
        assert summary == {"succeeded": True, "resumed": True, "ran_twice": False, "left_queued": False}, summary
        assert list((server.data_dir / "tmp").glob(f"job-{job['id']}-*")) == []
