"""Per-job limits (issue 39, item 4; docs/service.md, "Limits"): a job that takes more memory or disk than its
limit fails naming the limit, and the next job on the same worker runs as usual.

One real Celery worker (concurrency 1, its warm fork server) serves three jobs in turn: a model that holds
4 GiB in its forward under a 3 GiB address-space limit, a model whose weights make the job's folder outgrow a
60 MiB disk limit as it writes its checkpoint and exports, and the small Fashion CNN, which stays inside both.
"""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from tests.service.crash_scenario import wait_terminal
from tests.service.support import QUANT_CFG, Api, Worker, make_settings, open_api

GiB, MiB = 2**30, 2**20
MEMORY_LIMIT, DISK_LIMIT = 3 * GiB, 60 * MiB


class MemoryHog(nn.Module):
    """Holds four 1 GiB tensors at once in its forward: 4 GiB, within the upload check's 8 GiB. Each depends on
    the input and feeds the output, so no graph capture folds or drops them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = x.mean()
        held: list[torch.Tensor] = []
        for _ in range(4):
            held.append(torch.full([268435456], 1.0) * scale)  # 2**28 floats: 1 GiB
        extra = held[0][0] + held[1][0] + held[2][0] + held[3][0]
        return self.fc(x) + extra * 0


class Heavy(nn.Module):
    """20 M weights (80 MiB): its checkpoint and ONNX files alone pass 60 MiB."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 5000), nn.Linear(5000, 4000)
        self.out = nn.Linear(4000, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def _script(model: nn.Module) -> bytes:
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(model.eval()), buf)
    return buf.getvalue()


def _job(api: Api, model: bytes, input_shape: str, dataset: bytes) -> str:
    model_id = api.client.post(
        "/v1/models", files={"file": ("m.pt", model)}, data={"name": "m", "input_shape": input_shape}
    )
    assert model_id.status_code == 201, model_id.text
    ids = {
        "model_id": model_id.json()["id"],
        "config_id": api.upload_config(QUANT_CFG).json()["id"],
        "dataset_id": api.upload_dataset(dataset).json()["id"],
    }
    submit = api.submit(kind="quant_retrain", epochs=1, batch_size=16, lr=5e-4, **ids)
    assert submit.status_code == 202, submit.text
    return submit.json()["id"]


@pytest.mark.slow
def test_jobs_over_their_memory_or_disk_limit_fail_naming_it_and_the_next_job_runs(tmp_path, assets):
    from tests.service.tenants import tiny_dataset

    settings = make_settings(tmp_path / "data", job_memory_bytes=MEMORY_LIMIT, job_disk_bytes=DISK_LIMIT)
    with open_api(settings) as client:
        api = Api(client, settings)
        worker = Worker(settings, tmp_path / "worker.log")
        try:
            hog = _job(api, _script(MemoryHog()), "1,16", tiny_dataset(samples=32))
            heavy = _job(api, _script(Heavy()), "1,16", tiny_dataset(samples=32))
            fine = _job(api, (assets / "cnn.pt").read_bytes(), "1,1,28,28", (assets / "small.npz").read_bytes())
            ended = {
                name: wait_terminal(api, job_id, 600)
                for name, job_id in [("hog", hog), ("heavy", heavy), ("fine", fine)]
            }
        finally:
            worker.stop()
    assert ended["hog"]["status"] == "failed" and ended["hog"]["error"]["type"] == "memory_limit", ended["hog"]
    assert "3.0 GiB" in ended["hog"]["error"]["detail"] and "AMCT_JOB_MEMORY_BYTES" in ended["hog"]["error"]["detail"]
    assert ended["heavy"]["status"] == "failed" and ended["heavy"]["error"]["type"] == "disk_limit", ended["heavy"]
    assert "60.0 MiB" in ended["heavy"]["error"]["detail"]
    assert ended["fine"]["status"] == "succeeded", ended["fine"]["error"]
    print({name: (job["status"], (job["error"] or {}).get("detail")) for name, job in ended.items()})
