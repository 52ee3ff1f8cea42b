"""The runner without Celery: claim, child process, failure reporting, no-op redelivery."""

from __future__ import annotations

import importlib.util

import pytest

from job_process.kinds import JOB_KINDS
from service.db.models import Model
from tests.service.support import QUANT_CFG, Api, make_settings, open_api
from worker.runner import JobRunner


@pytest.fixture(scope="module")
def env(tmp_path_factory, assets):
    """An API on SQLite; the model row is inserted directly (validation is tested elsewhere)."""
    settings = make_settings(tmp_path_factory.mktemp("runner"))
    with open_api(settings) as client:
        api = Api(client, settings)
        blob = client.app.state.store.put_file(assets / "cnn.pt")
        with client.app.state.sessions() as session:
            model = Model(project_id="default", name="cnn", input_shape=[1, 1, 28, 28], status="ready",
                          layers={}, sha256=blob.sha256, size_bytes=blob.size_bytes, uri=blob.uri)
            session.add(model)
            session.commit()
        ids = {"model_id": model.id, "config_id": api.upload_config(QUANT_CFG).json()["id"],
               "dataset_id": api.upload_dataset((assets / "small.npz").read_bytes()).json()["id"]}
        yield api, ids


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
