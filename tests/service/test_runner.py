"""The runner without Celery: claim, child process, failure reporting, no-op redelivery."""

from __future__ import annotations

import importlib.util

import pytest

from job_host.kinds import JOB_KINDS
from tests.service.support import api_with_ready_model, make_settings
from worker.runner import JobRunner


@pytest.fixture(scope="module")
def env(tmp_path_factory, assets):
    """An API on SQLite; the model row is inserted directly (validation is tested elsewhere)."""
    settings = make_settings(tmp_path_factory.mktemp("runner"))
    with api_with_ready_model(settings, assets) as env:
        yield env


def test_a_device_the_worker_lacks_fails_the_job_with_a_clear_error(env):
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("this machine has torch_npu")
    api, ids = env
    job_id = api.submit(kind="quant_retrain", device="npu", **ids).json()["id"]
    assert JobRunner(api.settings, owner="test-runner").run(job_id) == "failed"
    job = api.client.get(f"/v1/jobs/{job_id}").json()
    reason = "DeviceUnavailable: device 'npu' needs torch_npu, which this worker does not have"
    assert job["error"] == {"type": "unsupported", "detail": reason}
    artifacts = api.client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]
    assert [a["kind"] for a in artifacts] == ["log"]
    assert b"torch_npu" in api.client.get(artifacts[0]["content_url"]).content


def test_running_a_finished_job_again_is_a_no_op(env):
    api, ids = env
    job_id = api.submit(kind="quant_retrain", **ids).json()["id"]
    api.client.post(f"/v1/jobs/{job_id}/cancel")
    assert JobRunner(api.settings, owner="test-runner").run(job_id) == "skipped"
    job = api.client.get(f"/v1/jobs/{job_id}").json()
    assert (job["status"], job["attempt"]) == ("cancelled", 0)


@pytest.mark.parametrize("kind", sorted(JOB_KINDS.names()))
def test_the_runner_of_each_job_kind_loads(kind):
    """The table names a runner the job process can import and call (this imports torch and the engine)."""
    assert callable(JOB_KINDS[kind].load_runner())
