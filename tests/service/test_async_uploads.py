"""Model uploads answered before their check (`Prefer: respond-async`, issue 39 item 2; service/model_checks.py).

The check (load, forward, capture in the sandbox) takes seconds to minutes; asked for, the answer comes once the
file is stored, the model `validating`, and the model becomes `ready` or `invalid` when the check ends: as strict
as the synchronous upload (the same check, the same refusal as `status_detail`).
"""

from __future__ import annotations

import io
from datetime import timedelta

import torch
from sqlalchemy import update

from core.db.models import Model, utcnow
from core.db.session import session_factory
from core.queue import Dispatcher, make_celery
from core.reaper import reap_once
from tests.service.support import QUANT_CFG, wait_until

ASYNC = {"Prefer": "respond-async"}


def _post(api, data: bytes, input_shape: str, headers=None):
    return api.client.post(
        "/v1/models",
        files={"file": ("m.pt", data)},
        data={"name": "m", "input_shape": input_shape},
        headers=headers or {},
    )


def _settled(api, model_id: str) -> dict:
    return wait_until(
        lambda: (m := api.client.get(f"/v1/models/{model_id}").json())["status"] != "validating" and m,
        120,
        interval=0.2,
        what="the model's check",
    )


def test_an_async_upload_is_validating_at_once_then_ready_as_a_synchronous_one(api, assets):
    data = (assets / "cnn.pt").read_bytes()
    answer = _post(api, data, "1,1,28,28", ASYNC)
    assert answer.status_code == 202, answer.text
    model = answer.json()
    assert model["status"] == "validating" and model["outputs"] is None  # answered before the check ran
    assert answer.headers["location"] == f"/v1/models/{model['id']}"
    # A job on it now is refused, naming the model, not queued behind a check that may fail.
    config = api.upload_config(QUANT_CFG).json()["id"]
    dataset = api.upload_dataset((assets / "small.npz").read_bytes()).json()["id"]
    job = {"kind": "quant_retrain", "model_id": model["id"], "config_id": config, "dataset_id": dataset}
    early = api.submit(**job)  # (the check's sandboxed process takes seconds to start)
    assert early.status_code == 422 and early.json()["field"] == "model_id", early.text
    assert "still being checked" in early.json()["detail"]
    ready = _settled(api, model["id"])
    synchronous = _post(api, data, "1,1,28,28").json()
    assert ready["status"] == synchronous["status"] == "ready"
    assert ready["outputs"] == synchronous["outputs"] and ready["layers"] == synchronous["layers"]
    assert api.submit(**job).status_code == 202


def test_an_async_upload_the_check_refuses_becomes_invalid_with_the_synchronous_refusal(api):
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(16, 3)), buf)  # uploaded as taking 8 features: fails
    answer = _post(api, buf.getvalue(), "1,8", ASYNC)
    assert answer.status_code == 202 and answer.json()["status"] == "validating"
    invalid = _settled(api, answer.json()["id"])
    refused = _post(api, buf.getvalue(), "1,8")
    assert refused.status_code == 422 and invalid["status"] == "invalid"
    assert invalid["status_detail"] == refused.json()["detail"]
    assert invalid["status_detail"].startswith("the model does not run on example inputs of its signature")


def test_a_check_cut_short_by_a_stopped_server_ends_invalid_at_the_next_reap(api, assets):
    model = _post(api, (assets / "cnn.pt").read_bytes(), "1,1,28,28").json()
    sessions = session_factory(api.settings.resolved_database_url)
    with sessions.begin() as session:  # as the API left it when it stopped mid-check, long ago
        long_ago = utcnow() - timedelta(seconds=2 * api.settings.validate_timeout_s + 120)
        session.execute(update(Model).where(Model.id == model["id"]).values(status="validating", created_at=long_ago))
    result = reap_once(api.settings, Dispatcher(make_celery(api.settings)))
    assert model["id"] in result["checks_interrupted"]
    after = api.client.get(f"/v1/models/{model['id']}").json()
    assert after["status"] == "invalid" and "interrupted" in after["status_detail"]
