"""Crashes, broker restarts, lost messages and cancel, with real processes (docs/spec/service.md §2, §5).

- a worker SIGKILLed mid-training: a new worker finishes the job from its last checkpoint;
- Redis killed and restarted while a job runs, and a job submitted while it is down: both finish;
- cancel: the engine stops by itself within a step; one that ignores the request is killed after
  the grace period;
- the engine child dies with the process that started it (no orphan holding the GPU).

Redis here is a private `redis-server` (crash_scenario.RedisServer), never the shared one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError
from sqlalchemy import update

from core.db.models import Job
from job_host import sandbox
from job_host.launcher import JOB_MODULE
from job_host.protocol import CHECKPOINT_DIR, RESULT_FILE, RESUME_FILE, SPEC_FILE, parse_line
from tests.service.crash_scenario import (
    FAST_RECOVERY,
    RedisServer,
    get_job,
    job_events,
    kill_and_resume,
    kill_engine_at_checkpoint,
    verify_artifacts,
    wait_terminal,
)
from tests.service.support import (
    QUANT_CFG,
    ROOT,
    Api,
    Worker,
    api_with_ready_model,
    make_settings,
    open_api,
    wait_until,
)
from worker.runner import JobRunner

OUTPUTS = {"checkpoint", "config", "deploy", "fake_quant", "fp32_onnx", "log", "record", "report"}


def _upload(api: Api, assets) -> dict:
    model = api.upload_model(assets / "cnn.pt")
    assert model.status_code == 201, model.text
    return {
        "model_id": model.json()["id"],
        "config_id": api.upload_config(QUANT_CFG).json()["id"],
        "dataset_id": api.upload_dataset((assets / "small.npz").read_bytes()).json()["id"],
    }


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    if subprocess.run(["which", "redis-server"], capture_output=True).returncode != 0:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.kill()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, pg_url, redis_server, assets):
    """The API on PostgreSQL and the private Redis, with recovery timings in seconds."""
    settings = make_settings(
        tmp_path_factory.mktemp("recovery"), database_url=pg_url, broker_url=redis_server.url, **FAST_RECOVERY
    )
    with open_api(settings) as client:
        api = Api(client, settings)
        yield api, _upload(api, assets), redis_server


# -- crashes ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_job_whose_worker_is_killed_finishes_from_its_checkpoint_on_a_new_worker(stack, tmp_path):
    api, ids, _ = stack
    trial = kill_and_resume(api, ids, tmp_path, epochs=3, batch_size=8, kill_after_epoch=1)
    job, events, killed = trial.job, trial.events, trial.killed_after
    assert job["status"] == "succeeded", job["error"]
    assert job["attempt"] == 2 and trial.orphans == []
    states = [(e["status"], e["edge"]) for e in events if e["type"] == "state"]
    assert states == [
        ("queued", "submitted"),
        ("running", "claimed"),
        ("queued", "requeued"),
        ("running", "claimed"),
        ("succeeded", "succeeded"),
    ]

    # The second attempt started where the checkpoint stood, not at epoch 0 ...
    resumed = trial.resumed
    assert resumed is not None and killed["epoch"] >= 1
    assert (resumed["epoch"], resumed["step"]) == (killed["epoch"], killed["step"])
    assert job["metrics"]["resumed_from"] == {"epoch": killed["epoch"], "step": killed["step"]}
    after = [e for e in events[events.index(resumed) :] if e["type"] == "progress" and "step" in e]
    assert after and after[0]["epoch"] >= killed["epoch"]
    assert all(e["step"] > killed["step"] for e in after)  # no finished step trained again
    assert after[-1]["step"] == after[-1]["total_steps"] == 3 * killed["steps_per_epoch"]

    # ... and every output is there, byte for byte what its sha256 says; the resume point is gone.
    assert set(trial.artifacts) == OUTPUTS and all(trial.artifacts.values()), trial.artifacts
    report = api.client.get(
        next(
            a["content_url"]
            for a in api.client.get(f"/v1/jobs/{job['id']}/artifacts").json()["items"]
            if a["kind"] == "report"
        )
    ).json()
    assert report["accuracy"]["deploy"] > 0.6


@pytest.mark.slow
def test_a_killed_pool_process_hands_its_job_on_without_waiting_out_the_lease(tmp_path, pg_url, redis_server, assets):
    """Two workers on PostgreSQL + Redis, the default two-minute lease: kill -9 of the pool process that runs a
    job. Celery re-delivers the message at once; the worker that takes it sees the lease's owner is gone on
    this machine (core/lease_owner.py) and resumes the job from its checkpoint within seconds."""
    settings = make_settings(
        tmp_path / "data", database_url=pg_url, broker_url=redis_server.url, heartbeat_s=0.5, checkpoint_every_steps=0
    )
    assert settings.lease_s == 120
    with open_api(settings) as client:
        api = Api(client, settings)
        ids = _upload(api, assets)
        workers = [Worker(settings, tmp_path / f"worker-{i}.log") for i in (1, 2)]
        try:
            job_id = api.submit(kind="quant_retrain", epochs=3, batch_size=8, lr=5e-4, **ids).json()["id"]
            wait_until(
                lambda: any(e["type"] == "checkpoint" for e in job_events(api, job_id)), 240, what="a checkpoint"
            )
            owner = _lease_owner(settings, job_id)
            os.kill(int(owner.split(":")[1]), 9)  # the pool process (not the worker): Celery starts another
            killed_at = time.monotonic()
            wait_until(
                lambda: (j := get_job(api, job_id))["attempt"] == 2 and j["status"] == "running",
                60,
                interval=0.1,
                what="the second attempt",
            )
            resumed_after = time.monotonic() - killed_at
            job = wait_terminal(api, job_id, 300)
        finally:
            for worker in workers:
                worker.stop()
    print(f"\npool process killed: the job's second attempt began {resumed_after:.1f} s later (lease 120 s)")
    assert resumed_after < 30
    assert job["status"] == "succeeded", job["error"]
    assert job["metrics"]["resumed_from"] is not None  # from the checkpoint, not from the start
    messages = [e.get("message") for e in job_events(api, job_id) if e["type"] == "log"]
    assert "its worker process is gone: its lease ends now" in messages


def _lease_owner(settings, job_id: str) -> str:
    from core.db.session import session_factory

    with session_factory(settings.resolved_database_url)() as session:
        return session.get(Job, job_id).lease_owner


@pytest.mark.slow
def test_a_redis_restart_loses_no_job(stack, tmp_path):
    """Redis dies (nothing persisted) while a job trains and another is submitted; both go on."""
    api, ids, redis_server = stack
    worker = Worker(api.settings, tmp_path / "worker.log", beat=True)
    try:
        running = api.submit(kind="quant_retrain", epochs=2, batch_size=16, lr=5e-4, **ids).json()["id"]
        wait_until(
            lambda: get_job(api, running)["phase"] in ("creating", "training"),
            120,
            interval=0.1,
            what="the job under way",
        )
        redis_server.kill()
        # The row commits, the message cannot be sent: the reaper sends it once Redis is back.
        lost = api.submit(kind="quant_retrain", epochs=1, batch_size=32, lr=5e-4, **ids)
        assert lost.status_code == 202, lost.text
        lost_id = lost.json()["id"]
        assert get_job(api, lost_id)["status"] == "queued"
        time.sleep(1)
        redis_server.start()
        first = wait_terminal(api, running, 180)
        # Claimed proves the re-sent message arrived; no need to train it too.
        wait_until(lambda: get_job(api, lost_id)["status"] == "running", 60, interval=0.1, what="re-sent job runs")
        api.client.post(f"/v1/jobs/{lost_id}/cancel")
        second = wait_terminal(api, lost_id, 60)
    finally:
        worker.stop()
    log = worker.text()[-3000:]
    assert first["status"] == "succeeded", (first["error"], log)
    assert first["attempt"] == 1, log  # the worker kept the job through the outage: nothing to redo
    assert all(verify_artifacts(api, running).values())
    resent = [e for e in job_events(api, lost_id) if e["type"] == "log" and "re-sent" in e["message"]]
    assert resent and (second["status"], second["attempt"]) == ("cancelled", 1), (second, log)


def test_the_visibility_timeout_reaches_the_broker_connection(redis_server, tmp_path):
    """celery#7651, #9339: a visibility_timeout that never reached kombu's Redis channel (docs/spec/service.md §2a)."""
    from core.queue import make_celery

    settings = make_settings(tmp_path, broker_url=redis_server.url, job_time_limit_s=7200, visibility_timeout_s=12345)
    with make_celery(settings).connection_for_read() as connection:
        channel = connection.default_channel
        assert channel.visibility_timeout == 12345 and channel.qos.visibility_timeout == 12345


def test_settings_refuse_a_visibility_timeout_shorter_than_a_job(tmp_path):
    with pytest.raises(ValidationError, match="visibility_timeout_s"):
        make_settings(tmp_path, job_time_limit_s=7200, visibility_timeout_s=3600)
    with pytest.raises(ValidationError, match="lease_s"):
        make_settings(tmp_path, lease_s=1.0, heartbeat_s=1.0)


@pytest.mark.slow
def test_a_distillation_resumes_after_its_last_finished_group(assets, tmp_path):
    """The engine child killed after distilling group 1 of 3; started again, it distills groups 2-3 only."""
    spec = {
        "kind": "distill",
        "device": "cpu",
        "input_shape": [1, 1, 28, 28],
        "input_dtype": "float32",
        "params": {"epochs": 1, "batch_size": 32, "lr": 5e-4, "eval_fraction": 0.1, "seed": 0, "deploy_format": "onnx"},
        "model": str(assets / "cnn.pt"),
        "cfg": str(ROOT / "tests/fixtures/cfg/distill_minimal.cfg"),
        "dataset": str(assets / "small.npz"),
        "dataset_format": "npz",
        "checkpoint_every_steps": 0,
    }
    (tmp_path / SPEC_FILE).write_text(json.dumps(spec))

    def engine(until: str | None = None) -> tuple[list[dict], int]:
        messages = []
        with open(tmp_path / "child.log", "ab") as log:
            proc = sandbox.popen(
                JOB_MODULE,
                [str(tmp_path)],
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                read_only=[spec["model"], spec["cfg"], spec["dataset"]],
            )
            for line in proc.stdout:
                if (message := parse_line(line)) is not None:
                    messages.append(message)
                    if message["type"] == until:
                        proc.kill()  # the crash
                        break
            return messages, proc.wait()

    first, _ = engine(until="checkpoint")
    checkpoint = first[-1]
    assert checkpoint["group"] == 1 and checkpoint["groups"] > 1, checkpoint
    # What the worker does on the next attempt: the last stored checkpoint becomes resume.pt.
    os.replace(tmp_path / CHECKPOINT_DIR / checkpoint["file"], tmp_path / RESUME_FILE)
    second, code = engine()
    assert code == 0, (tmp_path / "child.log").read_text()[-2000:]
    resumed = next(m for m in second if m["type"] == "resumed")
    assert (resumed["group"], resumed["step"]) == (1, checkpoint["step"])
    steps = [m for m in second if m["type"] == "progress" and "step" in m]
    assert steps and all(m["step"] > checkpoint["step"] for m in steps)  # group 1 not distilled again
    assert steps[-1]["step"] == steps[-1]["total_steps"] == checkpoint["groups"] * checkpoint["steps_per_group"]
    result = json.loads((tmp_path / RESULT_FILE).read_text())
    assert result["metrics"]["resumed_from"] == {"group": 1, "step": checkpoint["step"]}
    assert {a["kind"] for a in result["artifacts"]} >= {"deploy", "checkpoint", "config"}


# -- the engine child killed under a live worker ------------------------------------------------------


@pytest.mark.slow
def test_a_killed_engine_child_is_retried_from_its_checkpoint(runner_env):
    """kill -9 of the engine process mid-training (not of its worker): the job is requeued as another
    attempt, which the same worker runs at once from the checkpoint, and succeeds (issue 16)."""
    api, ids = runner_env
    job_id = api.submit(kind="quant_retrain", epochs=2, batch_size=16, lr=5e-4, **ids).json()["id"]
    thread, outcome = _run_in_thread(api.settings.model_copy(update={"checkpoint_every_steps": 0}), job_id)
    checkpoint = kill_engine_at_checkpoint(api, job_id, 120)
    thread.join(180)
    job = get_job(api, job_id)
    assert outcome["result"] == "succeeded" and job["status"] == "succeeded", job["error"]
    assert job["attempt"] == 2
    events = job_events(api, job_id)
    states = [(e["status"], e["edge"]) for e in events if e["type"] == "state"]
    assert states == [
        ("queued", "submitted"),
        ("running", "claimed"),
        ("queued", "requeued"),
        ("running", "claimed"),
        ("succeeded", "succeeded"),
    ]
    requeued = next(e for e in events if e["type"] == "state" and e["edge"] == "requeued")
    assert "killed by SIGKILL" in requeued["reason"]
    stored = [e for e in events[: events.index(requeued)] if e["type"] == "checkpoint"][-1]
    assert stored["epoch"] >= checkpoint["epoch"] >= 1
    assert job["metrics"]["resumed_from"] == {"epoch": stored["epoch"], "step": stored["step"]}
    assert list(api.settings.tmp_dir.glob(f"job-{job_id}-*")) == []  # no attempt's folder left behind


SUICIDE = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


def test_an_engine_child_killed_on_every_attempt_fails_after_max_attempts(runner_env, monkeypatch):
    api, ids = runner_env
    settings = api.settings.model_copy(update={"max_attempts": 2})

    def killed(module, args, cwd, read_only=(), **kwargs):  # the engine, SIGKILLed as soon as it starts
        return subprocess.Popen([sys.executable, "-c", SUICIDE], cwd=cwd, start_new_session=True, **kwargs)

    monkeypatch.setattr(sandbox, "popen", killed)
    submitted = api.submit(kind="quant_retrain", **ids).json()["id"]
    with api.client.app.state.sessions.begin() as session:  # max_attempts is fixed at submit: set this job's
        session.execute(update(Job).where(Job.id == submitted).values(max_attempts=2))
    assert JobRunner(settings, owner="t").run(submitted) == "failed"
    job = get_job(api, submitted)
    assert job["attempt"] == 2 and job["error"]["type"] == "crashed", job
    assert "killed by SIGKILL" in job["error"]["detail"]
    assert list(settings.tmp_dir.glob(f"job-{submitted}-*")) == []


@pytest.mark.parametrize(
    "code, name", [(-9, "SIGKILL"), (-11, "SIGSEGV"), (137, "SIGKILL"), (1, None), (0, None), (3, None)]
)
def test_killed_by_reads_popen_and_wrapper_exit_codes(code, name):
    from worker.supervisor import killed_by

    assert killed_by(code) == name


def test_the_reaper_removes_the_folders_of_dead_attempts_only(runner_env):
    from core.reaper import reap_once

    api, ids = runner_env
    queued = api.submit(kind="quant_retrain", **ids).json()["id"]
    running = api.submit(kind="quant_retrain", **ids).json()["id"]
    with api.client.app.state.sessions.begin() as session:
        session.execute(
            update(Job)
            .where(Job.id == running)
            .values(status="running", lease_owner="w", lease_expires_at=datetime.now(UTC) + timedelta(hours=1))
        )
    scratch = api.settings.tmp_dir
    dead, live, gone = (
        scratch / f"job-{queued}-abc12345",
        scratch / f"job-{running}-def67890",
        scratch / "job-00000000-0000-0000-0000-000000000000-x1y2z3w4",
    )
    for folder in (dead, live, gone):
        (folder / "ckpt").mkdir(parents=True)
        (folder / "ckpt" / "epoch1.pt").write_bytes(b"\0" * 1024)
    result = reap_once(api.settings, api.client.app.state.dispatcher)
    assert result["folders_removed"] == 2
    assert live.is_dir() and not dead.exists() and not gone.exists()
    for job_id in (queued, running):
        api.client.post(f"/v1/jobs/{job_id}/cancel")


# -- cancel ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner_env(tmp_path_factory, assets):
    """An API on SQLite; jobs run by a JobRunner in this process (no Celery); a 60 s cancel grace."""
    settings = make_settings(tmp_path_factory.mktemp("cancel"), heartbeat_s=0.5, cancel_grace_s=60.0)
    with api_with_ready_model(settings, assets) as env:
        yield env


def _run_in_thread(settings, job_id: str) -> tuple[threading.Thread, dict]:
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(result=JobRunner(settings, owner="t").run(job_id)))
    thread.start()
    return thread, outcome


@pytest.mark.slow
def test_cancel_stops_the_engine_at_its_next_step(runner_env):
    api, ids = runner_env
    job_id = api.submit(kind="quant_retrain", epochs=100, batch_size=8, lr=5e-4, **ids).json()["id"]
    thread, outcome = _run_in_thread(api.settings, job_id)
    wait_until(
        lambda: any(e["type"] == "progress" for e in job_events(api, job_id)), 120, interval=0.1, what="training steps"
    )
    asked = time.monotonic()
    assert api.client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
    thread.join(60)
    took = time.monotonic() - asked
    assert outcome["result"] == "cancelled"
    events = job_events(api, job_id)
    assert events[-1]["type"] == "state" and events[-1]["status"] == "cancelled"
    assert events[-1]["stopped_by"] == "engine"  # it exited by itself: CANCELLED_EXIT, not a kill
    assert any(e["type"] == "log" and "stopped on a cancel request" in e["message"] for e in events)
    # One heartbeat to see the request, one step to stop: far inside the 60 s grace.
    assert took < 15, took
    job = get_job(api, job_id)
    assert job["status"] == "cancelled" and 0.1 <= job["progress"] < 0.8


STUBBORN = (
    "import json, os, time; open('stubborn.pid', 'w').write(str(os.getpid()));"
    "print(json.dumps({'type': 'phase', 'phase': 'training'}), flush=True); time.sleep(600)"
)


def test_an_engine_that_ignores_cancel_is_killed_after_the_grace_period(runner_env, monkeypatch, tmp_path):
    api, ids = runner_env
    settings = api.settings.model_copy(update={"cancel_grace_s": 1.5})

    def stubborn(module, args, cwd, read_only=(), **kwargs):  # never looks at the cancel file
        return subprocess.Popen([sys.executable, "-c", STUBBORN], cwd=cwd, start_new_session=True, **kwargs)

    monkeypatch.setattr(sandbox, "popen", stubborn)
    job_id = api.submit(kind="quant_retrain", **ids).json()["id"]
    thread, outcome = _run_in_thread(settings, job_id)
    wait_until(lambda: get_job(api, job_id)["phase"] == "training", 30, interval=0.05, what="the stub running")
    pid_files = list(settings.tmp_dir.glob(f"job-{job_id}-*/stubborn.pid"))
    pid = int(pid_files[0].read_text())
    asked = time.monotonic()
    api.client.post(f"/v1/jobs/{job_id}/cancel")
    thread.join(30)
    took = time.monotonic() - asked
    assert outcome["result"] == "cancelled"
    state = job_events(api, job_id)[-1]
    assert (state["status"], state["stopped_by"], state["grace_s"]) == ("cancelled", "kill", 1.5)
    assert 1.5 <= took < 6, took
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped


def test_the_engine_child_dies_with_the_worker_that_started_it(tmp_path):
    """bwrap --die-with-parent (PR_SET_PDEATHSIG): a SIGKILLed worker leaves no engine behind (the engine has
    its own session)."""
    middle = subprocess.Popen(  # plays the worker: starts a child the sandbox way, reports when it is set up
        [
            sys.executable,
            "-c",
            "import subprocess, time; from job_host import sandbox;"
            f"p = sandbox.popen('tests.service.sleeper', [], cwd={str(tmp_path)!r}, stdout=subprocess.PIPE, text=True);"
            "assert p.stdout.readline().strip() == 'ready'; print(p.pid, flush=True); time.sleep(60)",
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(middle.stdout.readline())
    assert os.path.exists(f"/proc/{child}")
    middle.kill()
    middle.wait()
    wait_until(lambda: not os.path.exists(f"/proc/{child}"), 5, interval=0.05, what="the child gone with it")
