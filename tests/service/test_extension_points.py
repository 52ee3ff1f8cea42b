"""A job kind is one registration: the API, the CLI, /v1/meta, the cfg checks and the job process take it up.

The kind (tests/service/throwaway_kind.py) is registered for one test at a time and unregistered
after it; the job process and the CLI subprocess see it through AMCT_JOB_KIND_MODULES.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from job_host.kinds import JOB_KINDS, MODULES_ENV, register_job_kind
from job_host.launcher import ChildProcess
from job_host.protocol import SPEC_FILE
from service.app import create_app
from tests.service.support import QUANT_CFG, ROOT, make_settings, open_api
from tests.service.tenants import FEATURES, tiny_dataset, tiny_model_bytes

MODULE = "tests.service.throwaway_kind"


@pytest.fixture
def throwaway(monkeypatch):
    """The throwaway kind, registered here and in every process started from here."""
    monkeypatch.setenv(MODULES_ENV, MODULE)
    module = importlib.import_module(MODULE)  # registers it, the first time
    register_job_kind(module.KIND, replace=True)  # and again after an earlier test unregistered it
    yield module
    JOB_KINDS.unregister(module.KIND.name)


def test_the_openapi_document_lists_it_and_the_api_accepts_it(throwaway, tmp_path):
    settings = make_settings(tmp_path)
    schema = create_app(settings).openapi()
    body = schema["components"]["schemas"]["JobCreate"]["properties"]["kind"]
    assert "throwaway" in body["enum"] and "quant_retrain" in body["enum"]
    listing = next(p for p in schema["paths"]["/v1/jobs"]["get"]["parameters"] if p["name"] == "kind")
    assert "throwaway" in listing["schema"]["anyOf"][0]["items"]["enum"]
    with open_api(settings) as client:
        job = {"model_id": "no-such-model", "config_id": "c", "dataset_id": "d"}
        # Past the body's validation to the lookup of its model; an unknown kind stops at the kind.
        assert client.post("/v1/jobs", json={"kind": "throwaway", **job}).json()["field"] == "model_id"
        assert client.post("/v1/jobs", json={"kind": "throwaway2", **job}).json()["field"] == "kind"


def test_meta_and_the_cfg_summary_list_it(throwaway, tmp_path):
    with open_api(make_settings(tmp_path)) as client:
        meta = client.get("/v1/meta").json()
        config = client.post("/v1/configs", files={"file": ("q.cfg", QUANT_CFG)}, data={"kind": "retrain"}).json()
    kinds = {k["name"]: k for k in meta["job_kinds"]}
    assert kinds["throwaway"] == {
        "name": "throwaway",
        "cfg_kind": "retrain",
        "trains": False,
        "needs_labels": False,
        "description": throwaway.KIND.description,
    }
    assert set(kinds) == set(JOB_KINDS.names())
    assert config["summary"]["job_kinds"]["throwaway"] == {"ok": True}  # no engine API to check it against


def test_the_cli_offers_it():
    """`--kind` of a fresh `amct` process, as a user runs it, with the kind's module named in its environment."""
    env = dict(os.environ, **{MODULES_ENV: MODULE}, PYTHONPATH=str(ROOT), COLUMNS="600")
    for command in (["jobs", "submit"], ["compress"]):
        help_text = subprocess.run(
            [sys.executable, "-m", "service", *command, "--help"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        kind = next(line for line in help_text.splitlines() if "--kind" in line)
        assert "|throwaway>" in kind, help_text


def test_the_job_process_hands_it_to_its_runner(throwaway, tmp_path):
    (tmp_path / "model.pt").write_bytes(tiny_model_bytes())
    (tmp_path / "data.npz").write_bytes(tiny_dataset(labels=False, samples=20))
    (tmp_path / "job.cfg").write_bytes(QUANT_CFG)
    spec = {
        "kind": "throwaway",
        "device": "cpu",
        "input_shape": [1, FEATURES],
        "input_dtype": "float32",
        "params": {"epochs": 1, "batch_size": 4, "lr": 1e-3, "eval_fraction": 0.25, "seed": 0},
        "model": str(tmp_path / "model.pt"),
        "cfg": str(tmp_path / "job.cfg"),
        "dataset": str(tmp_path / "data.npz"),
        "dataset_format": "npz",
    }
    (tmp_path / SPEC_FILE).write_text(json.dumps(spec))
    with ChildProcess(tmp_path) as child:
        messages = list(child)
        code = child.wait()
    assert code == 0, child.log_tail()
    assert {"type": "log", "level": "info", "message": throwaway.RAN} in messages
    artifacts = {a["kind"]: a["path"] for a in child.result()["artifacts"]}
    assert {"deploy", "fp32_onnx", "report"} <= set(artifacts)
    report = json.loads(Path(artifacts["report"]).read_text())
    assert report["kind"] == "throwaway" and report["agreement_with_original"]["deploy"]["mean_cosine"] > 0.999
