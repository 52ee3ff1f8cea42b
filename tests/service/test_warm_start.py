"""Warm job processes (worker/warm.py): started ahead of their job, isolated as a cold one, same results.

The isolation tests run a stand-in child (tests/service/warm_probe.py) in the real bubblewrap sandbox;
the result test runs the same job cold and warm through the runner (SQLite, no Celery). The Celery
worker's warm path runs in tests/service/test_worker.py. How much sooner a warm job trains is measured
in bench/warm_start.py, not here.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from job_host import bubblewrap
from tests.service.support import Api, api_with_ready_model, make_settings, wait_until
from worker.runner import JobRunner
from worker.warm import WarmPool, remove_stale

PROBE = "tests.service.warm_probe"


@pytest.fixture
def sandboxed():
    if bubblewrap.state().mode != "bubblewrap":
        pytest.skip(f"needs the real sandbox: {bubblewrap.state().detail}")


def _warm_folders(scratch):
    return sorted(p.name for p in scratch.glob("warm-*"))


def test_a_warm_process_sees_an_empty_folder_of_its_own_until_its_job_is_handed_over(sandboxed, tmp_path):
    scratch = tmp_path / "tmp"
    (scratch / "job-secret-0000").mkdir(parents=True)
    (scratch / "job-secret-0000" / "dataset.npz").write_bytes(b"another project's data")
    pool = WarmPool(scratch, module=PROBE)
    pool.fill()
    waiting = pool._child
    assert waiting.ready.wait(60), (waiting.workdir / "child.log").read_text()
    started_in = waiting.workdir
    assert _warm_folders(scratch) == [started_in.name]

    child = pool.take("job1")
    assert child is waiting and child.sandbox_dir == started_in
    assert child.workdir.parent == scratch and child.workdir.name.startswith("job-job1-")
    assert child.workdir.name.endswith(started_in.name.rsplit("-", 1)[1])  # the token carries over
    assert _warm_folders(scratch) == [] and not started_in.exists()
    (child.workdir / "model.pt").write_bytes(b"this job's model")
    (child.workdir / "spec.json").write_text(json.dumps({"model": str(child.sandbox_dir / "model.pt")}))
    with child:
        child.begin()
        assert child.wait() == 0, (child.workdir / "child.log").read_text()
    result = child.result()
    seen = result["metrics"]
    # Before its job: an empty folder (the log file its parent opened), nothing else of the scratch folder.
    assert seen["folder_before"] == ["child.log"]
    assert seen["scratch_before"] == [started_in.name]
    assert seen["other_job_before"].startswith("FileNotFoundError")
    # After the hand-over: the same folder, under the same name inside, with the job's files in it.
    assert seen["cwd"] == str(started_in)
    assert seen["folder_after"] == ["child.log", "model.pt", "spec.json"]
    assert seen["scratch_after"] == [started_in.name]
    # What it reports is translated to where the files are on this side.
    assert result["artifacts"][0]["path"] == str(child.workdir / "spec.json")
    pool.close()


def test_a_job_taken_as_the_warm_process_starts_waits_for_its_sandbox(sandboxed, tmp_path):
    """Taken at once, before bwrap has mounted the folder: renaming it then would leave bwrap nothing to mount
    (seen: "bwrap: Can't find source path"). The pool waits for the child's word that it runs inside."""
    scratch = tmp_path / "tmp"
    pool = WarmPool(scratch, module=PROBE)
    pool.fill()
    child = pool.take("job3")
    assert child is not None and child.sandboxed.is_set()
    (child.workdir / "spec.json").write_text("{}")
    with child:
        child.begin()
        assert child.wait() == 0, (child.workdir / "child.log").read_text()
    assert child.result()["metrics"]["folder_after"] == ["child.log", "spec.json"]


def test_a_warm_process_that_died_is_not_handed_a_job(sandboxed, tmp_path):
    scratch = tmp_path / "tmp"
    pool = WarmPool(scratch, module=PROBE)
    pool.fill()
    dead = pool._child
    assert dead.ready.wait(60)
    os.killpg(dead._proc.pid, signal.SIGKILL)
    wait_until(lambda: not dead.alive(), 10, what="the warm process gone")
    assert pool.take("job2") is None  # the runner starts this job cold
    assert _warm_folders(scratch) == [] and list(scratch.glob("job-*")) == []
    pool.fill()
    assert pool._child.alive() and _warm_folders(scratch) == [pool._child.workdir.name]
    pool.close()
    assert _warm_folders(scratch) == []


def test_a_killed_worker_s_warm_folders_are_removed_by_the_next_pool(tmp_path):
    scratch = tmp_path / "tmp"
    dead, live = scratch / "warm-999999999-0badf00d", scratch / f"warm-{os.getpid()}-0c0ffee0"
    for folder in (dead, live):
        folder.mkdir(parents=True)
    assert remove_stale(scratch) == 1
    assert not dead.exists() and live.exists()


@pytest.fixture(scope="module")
def runner_env(tmp_path_factory, assets):
    """An API on SQLite; the model row is inserted directly (validation is tested elsewhere)."""
    settings = make_settings(tmp_path_factory.mktemp("warm"))
    with api_with_ready_model(settings, assets) as env:
        yield env


def _record(api: Api, job_id: str) -> bytes:
    items = api.client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]
    return api.client.get(next(a for a in items if a["kind"] == "record")["content_url"]).content


def _logs(api: Api, job_id: str) -> list[str]:
    text = api.client.get(f"/v1/jobs/{job_id}/events").text
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    return [e["message"] for e in events if e["type"] == "log"]


@pytest.mark.slow
def test_a_job_run_warm_gives_what_the_same_job_run_cold_gives(sandboxed, runner_env):
    api, ids = runner_env
    body = dict(kind="quant_retrain", epochs=1, batch_size=32, lr=5e-4, seed=3, **ids)
    cold = api.submit(**body).json()["id"]
    warm = api.submit(**body, headers={"Idempotency-Key": "warm"}).json()["id"]
    outcome = JobRunner(api.settings, owner="cold").run(cold)
    assert outcome == "succeeded", api.client.get(f"/v1/jobs/{cold}").json()["error"]
    pool = WarmPool(api.settings.tmp_dir)
    pool.fill()
    first = pool._child
    try:
        outcome = JobRunner(api.settings, owner="warm", warm=pool).run(warm)
        assert outcome == "succeeded", api.client.get(f"/v1/jobs/{warm}").json()["error"]
        # A replacement was started as the job began; the used one is gone with its folder.
        assert pool._child is not None and pool._child is not first and pool._child.alive()
        assert not first.alive()
        assert _warm_folders(api.settings.tmp_dir) == [pool._child.workdir.name]
        assert list(api.settings.tmp_dir.glob("job-*")) == []
    finally:
        pool.close()
    jobs = {j: api.client.get(f"/v1/jobs/{j}").json() for j in (cold, warm)}
    assert [jobs[j]["status"] for j in (cold, warm)] == ["succeeded", "succeeded"]
    # onnxruntime's wall clock, not the job's result (a warning may say the deploy model was slower)
    timings = ("latency_ms", "speedup", "speedup_by_batch", "warnings")
    same = [{k: v for k, v in jobs[j]["metrics"].items() if k not in timings} for j in (cold, warm)]
    assert same[0] == same[1]
    assert _record(api, cold) == _record(api, warm)  # the same quantisation factors, to the last digit
    assert any(m.startswith("warm engine process: warmed up in") for m in _logs(api, warm))
    assert not any(m.startswith("warm engine process") for m in _logs(api, cold))
