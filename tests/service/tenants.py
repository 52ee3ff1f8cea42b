"""Two projects on one app, each with its own keys and a full set of resources (for the auth tests)."""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np

from core.db.models import Artifact, Model
from service import auth
from tests.service.support import QUANT_CFG, Api, npz_bytes

FEATURES = 16  # the tiny model takes [1, 16]


def tiny_model_bytes() -> bytes:
    """A TorchScript Linear model: validates in the child in about a second."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(FEATURES, 3)).eval()
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(model), buf)
    return buf.getvalue()


def tiny_dataset(labels: bool = True, samples: int = 8) -> bytes:
    rng = np.random.default_rng(0)
    arrays = {"inputs": rng.standard_normal((samples, FEATURES)).astype("float32")}
    if labels:
        arrays["labels"] = np.arange(samples) % 3
    return npz_bytes(**arrays)


@dataclass
class Tenant:
    """A project, an API client sending its admin key, and the ids of what it uploaded and ran."""

    project: str
    api: Api
    key_id: str
    ids: dict[str, str] = field(default_factory=dict)

    def job_body(self, **overrides) -> dict:
        body = {
            "kind": "quant_retrain",
            "model_id": self.ids["model_id"],
            "config_id": self.ids["config_id"],
            "dataset_id": self.ids["dataset_id"],
            "epochs": 1,
            "batch_size": 4,
        }
        return {**body, **overrides}


def keyed_client(app, secret: str | None):
    """Another TestClient on an app that is already started (by the `with` of the first one)."""
    from fastapi.testclient import TestClient

    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    return TestClient(app, headers=headers, raise_server_exceptions=False)


def make_tenant(app, settings, project: str, scopes=("admin",)) -> Tenant:
    sessions = app.state.sessions
    auth.create_project(sessions, project, f"project {project}")
    key_id, secret = auth.create_key(sessions, project, scopes, "tests")
    return Tenant(project, Api(keyed_client(app, secret), settings), key_id)


def populate(tenant: Tenant, model_bytes: bytes | None = None) -> Tenant:
    """Upload a model, a cfg and a dataset, submit a job, cancel it and give it an artifact.

    Without `model_bytes` the model row is written as a validated upload would leave it, which
    saves the validation child (seconds) where the test is not about models.
    """
    api = tenant.api
    if model_bytes is None:
        tenant.ids["model_id"] = add_model(api, tenant.project)
    else:
        model = api.client.post(
            "/v1/models",
            files={"file": ("tiny.pt", model_bytes)},
            data={"name": "tiny", "input_shape": f"1,{FEATURES}"},
        )
        assert model.status_code == 201, model.text
        tenant.ids["model_id"] = model.json()["id"]
    config = api.upload_config(QUANT_CFG)
    assert config.status_code == 201, config.text
    dataset = api.upload_dataset(tiny_dataset())
    assert dataset.status_code == 201, dataset.text
    tenant.ids.update(config_id=config.json()["id"], dataset_id=dataset.json()["id"])
    job = api.submit(**tenant.job_body())
    assert job.status_code == 202, job.text
    tenant.ids["job_id"] = job.json()["id"]
    # Terminal, so its event stream ends (nothing consumes the queue here).
    assert api.client.post(f"/v1/jobs/{tenant.ids['job_id']}/cancel").status_code == 202
    tenant.ids["artifact_id"] = add_artifact(api, tenant.ids["job_id"], b'{"accuracy": 0.5}')
    tenant.ids["key_id"] = tenant.key_id
    return tenant


def add_artifact(api: Api, job_id: str, payload: bytes) -> str:
    """What a worker would do at the end of a job: a blob in the store and its row."""
    app = api.client.app
    path = api.settings.tmp_dir / "artifact.json"
    path.write_bytes(payload)
    blob = app.state.store.put_file(path)
    with app.state.sessions() as session:
        artifact = Artifact(
            job_id=job_id,
            kind="report",
            filename="report.json",
            media_type="application/json",
            sha256=blob.sha256,
            size_bytes=blob.size_bytes,
            uri=blob.uri,
        )
        session.add(artifact)
        session.commit()
        return artifact.id


def add_model(api: Api, project: str) -> str:
    """A ready model row for the tiny Linear model, as POST /v1/models would write it after validation."""
    app = api.client.app
    path = api.settings.tmp_dir / "tiny.pt"
    path.write_bytes(tiny_model_bytes())
    blob = app.state.store.put_file(path)
    with app.state.sessions() as session:
        model = Model(
            project_id=project,
            name="tiny",
            input_shape=[1, FEATURES],
            input_dtype="float32",
            status="ready",
            sha256=blob.sha256,
            size_bytes=blob.size_bytes,
            uri=blob.uri,
            layers={
                "quantizable": [{"name": "1", "type": "Linear"}],
                "parameters": FEATURES * 3 + 3,
                "output_shapes": [[1, 3]],
            },
        )
        session.add(model)
        session.commit()
        return model.id
