"""The fork server (worker/fork_server.py, job_process/zygote.py): one warm-up, one forked child per job.

The isolation tests run a stand-in server (tests/service/fork_probe.py: the real server loop, a probe for a
job) in the real bubblewrap sandbox: a job sees nothing an earlier job left, and cannot reach the server.
The result test runs the same job cold and forked through the runner (SQLite, no Celery); the Celery
worker's default path is the fork server, so every worker test runs through it too. How much less CPU a
forked job costs is measured in bench/service_load.py, not here.
"""

from __future__ import annotations

import json
import threading

import pytest

from job_host import bubblewrap
from tests.service.crash_scenario import get_job, job_events, kill_engine_at_checkpoint
from tests.service.support import api_with_ready_model, make_settings
from tests.service.test_warm_start import _record
from worker.fork_server import SERVER_LOG, ForkServerPool
from worker.runner import JobRunner

PROBE = "tests.service.fork_probe"


@pytest.fixture
def sandboxed():
    if bubblewrap.state().mode != "bubblewrap":
        pytest.skip(f"needs the real sandbox: {bubblewrap.state().detail}")


def _run(pool: ForkServerPool, action: str):
    job = pool.take("job")
    (job.workdir / "spec.json").write_text(json.dumps({"action": action}))
    with job:
        job.begin()
        messages = list(job)
        code = job.wait()
    return job, code, messages


def test_a_forked_job_sees_nothing_an_earlier_one_left_and_cannot_reach_the_server(sandboxed, tmp_path):
    scratch = tmp_path / "tmp"  # under /tmp: the server's clean-up of /tmp must not reach the slot's mount
    pool = ForkServerPool(scratch, module=PROBE)
    pool.fill()
    server = pool._server
    assert server.ready.wait(60), (server.slot / SERVER_LOG).read_text()  # said before any job was sent
    try:
        planter, code, messages = _run(pool, "plant")
        assert code == 0, planter.log_tail()
        # What it printed is the job's own stream: a line shaped like a server message is not one.
        assert [m["message"] for m in messages] == [messages[0]["message"], "probe plant"] and messages[0][
            "message"
        ].startswith("warm engine process: forked from a fork server that warmed up in ")
        assert messages[0]["message"].endswith("; 0 jobs before this one")
        first_folder = planter.workdir
        assert first_folder.parent == server.slot and (server.slot / "planted").exists()

        looker, code, _ = _run(pool, "look")
        assert code == 0, looker.log_tail()
        assert pool._server is server and server.jobs == 2  # the same server: nothing warmed up again
        seen = looker.result()["metrics"]
        # Only bwrap (1), the server and the job itself are alive: the planter's detached process is gone.
        assert seen["pids"] == sorted([1, seen["server"], seen["self"]])
        # The planted files are gone; what stays in /tmp are the folders bwrap made for its mounts (the slot's,
        # and the repo's and the venv's when they live under /tmp, as in CI's fresh clone).
        assert not {"planted", "planted-dir"} & set(seen["tmp"]) and seen["shm"] == []
        # The planted file and the first job's folder were removed before this job's folder was made.
        assert seen["slot"] == sorted([looker.workdir.name, SERVER_LOG]) and not first_folder.exists()
        # The server is not dumpable: its memory, environment and descriptors are out of reach.
        for field in ("server_mem", "server_environ", "server_fd"):
            assert seen[field] == "PermissionError: errno 13", field
        # Its stdin is /dev/null, stdout its own pipe, stderr its log: no descriptor of the server's.
        assert seen["stdin"] == "/dev/null" and seen["cwd"] == str(looker.workdir)
        assert seen["own_fds"]["1"].startswith("ok: 'pipe:")
        assert not any("socket" in v for v in seen["own_fds"].values())
    finally:
        pool.close()
    assert list(scratch.glob("warm-*")) == []


def test_a_failing_job_leaves_the_server_serving_and_a_killed_one_takes_it_along(sandboxed, tmp_path):
    scratch = tmp_path / "tmp"
    pool = ForkServerPool(scratch, module=PROBE)
    pool.fill()
    first = pool._server
    try:
        _, code, _ = _run(pool, "crash")
        assert code == 3 and first.alive()
        job = pool.take("job")
        (job.workdir / "spec.json").write_text(json.dumps({"action": "look"}))
        with job:
            job.kill()  # before it began: the supervisor's kill at the time limit, say
            job.begin()
            assert job.wait() < 0
        assert not first.alive()
        assert pool.take("job") is None  # this job starts cold; another server warms up for the next
        assert pool._server is not first and pool._server.alive() and not first.slot.exists()
        _, code, _ = _run(pool, "look")
        assert code == 0 and pool._server.jobs == 1
    finally:
        pool.close()


def test_a_server_is_replaced_after_its_last_job(sandboxed, tmp_path):
    pool = ForkServerPool(tmp_path / "tmp", module=PROBE, jobs_per_server=2)
    pool.fill()
    first = pool._server
    try:
        _run(pool, "look")
        job, code, _ = _run(pool, "look")
        assert code == 0 and job.server is first and pool._server is None
        assert not first.alive() and not first.slot.exists()
        pool.fill()
        assert pool._server.alive() and pool._server is not first
    finally:
        pool.close()


@pytest.fixture(scope="module")
def runner_env(tmp_path_factory, assets):
    settings = make_settings(tmp_path_factory.mktemp("fork"))
    with api_with_ready_model(settings, assets) as env:
        yield env


@pytest.mark.slow
def test_a_job_forked_gives_what_the_same_job_run_cold_gives(sandboxed, runner_env):
    api, ids = runner_env
    body = dict(kind="quant_retrain", epochs=1, batch_size=32, lr=5e-4, seed=3, **ids)
    cold = api.submit(**body).json()["id"]
    forked = [api.submit(**body, headers={"Idempotency-Key": f"fork{i}"}).json()["id"] for i in range(2)]
    assert JobRunner(api.settings, owner="cold").run(cold) == "succeeded"
    pool = ForkServerPool(api.settings.tmp_dir)
    pool.fill()
    try:
        runner = JobRunner(api.settings, owner="forked", warm=pool)
        for job_id in forked:  # the second from the same server, after the first one's clean-up
            outcome = runner.run(job_id)
            assert outcome == "succeeded", api.client.get(f"/v1/jobs/{job_id}").json()["error"]
        assert pool._server.jobs == 2 and pool._server.alive()
        assert [p.name for p in pool._server.slot.iterdir()] == [SERVER_LOG]  # the runner removed each job folder
    finally:
        pool.close()
    jobs = {j: api.client.get(f"/v1/jobs/{j}").json() for j in (cold, *forked)}
    assert [jobs[j]["status"] for j in jobs] == ["succeeded"] * 3
    # onnxruntime's wall clock, not the job's result (a warning may say the deploy model was slower)
    timings = ("latency_ms", "speedup", "speedup_by_batch", "warnings")
    same = [{k: v for k, v in jobs[j]["metrics"].items() if k not in timings} for j in jobs]
    assert same[0] == same[1] == same[2]
    assert _record(api, cold) == _record(api, forked[0]) == _record(api, forked[1])


@pytest.mark.slow
def test_a_killed_forked_child_is_retried_from_its_checkpoint_by_the_same_server(sandboxed, runner_env):
    """kill -9 of the job's forked child mid-training (not of its server): the worker requeues the attempt and
    runs the next one at once, forked from the same server, from the checkpoint (tests/service/test_recovery.py
    does the same with a cold child)."""
    api, ids = runner_env
    job_id = api.submit(kind="quant_retrain", epochs=2, batch_size=16, lr=5e-4, seed=5, **ids).json()["id"]
    pool = ForkServerPool(api.settings.tmp_dir)
    pool.fill()
    server = pool._server
    outcome: dict = {}
    settings = api.settings.model_copy(update={"checkpoint_every_steps": 0, "heartbeat_s": 0.5})
    thread = threading.Thread(
        target=lambda: outcome.update(result=JobRunner(settings, owner="forked", warm=pool).run(job_id))
    )
    thread.start()
    try:
        kill_engine_at_checkpoint(api, job_id, 180)  # the forked child, found through the server's job marker
        thread.join(180)
        job = get_job(api, job_id)
        assert outcome["result"] == "succeeded" and job["status"] == "succeeded", job["error"]
        assert job["attempt"] == 2 and pool._server is server and server.jobs == 2 and server.alive()
        events = job_events(api, job_id)
        assert "killed by SIGKILL" in next(e for e in events if e.get("edge") == "requeued")["reason"]
        assert any(e["type"] == "resumed" for e in events)
    finally:
        thread.join(180)
        pool.close()
