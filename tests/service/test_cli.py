"""`amct`: the engine on this machine (`compress`, `distill-config`) and the client commands against a live server."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from service.cli import app, main
from service.client import AmctClient, ApiError

runner = CliRunner()


def amct(*args: str):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _accuracy(onnx_path, npz_path) -> float:
    data = np.load(npz_path)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return float((session.run(None, {"input": data["inputs"]})[0].argmax(1) == data["labels"]).mean())


@pytest.mark.slow
def test_compress_runs_the_engine_here_and_prints_the_report(assets, tmp_path):
    out = tmp_path / "out"
    result = amct("compress", "--model", assets / "cnn.pt", "--cfg", assets / "quant.cfg", "--data",
                  assets / "small.npz", "--kind", "compressed_retrain", "--out", out, "--batch-size", 32,
                  "--eval-fraction", 0.25)
    assert result.exit_code == 0, result.output

    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == "compressed_retrain" and report["eval"]["samples"] == 100
    assert report["accuracy"]["fp32"] > 0.6 and report["accuracy"]["deploy"] >= report["accuracy"]["fp32"] - 0.1
    deploy = out / "model_deploy_model.onnx"
    onnx.checker.check_model(onnx.load(deploy))
    assert report["onnx_size_bytes"]["deploy"] == deploy.stat().st_size < (out / "fp32.onnx").stat().st_size
    # The deploy model the folder holds is the one the report measured.
    assert _accuracy(deploy, assets / "small.npz") > 0.6
    assert {"record.txt", "model_fake_quant_model.onnx", "engine.log"} <= {p.name for p in out.iterdir()}
    assert not list(out.glob(".amct-work-*"))  # the engine's scratch folder is gone

    # The summary table shows the report's numbers.
    assert "before (FP32)" in result.stdout and "after (deploy)" in result.stdout
    assert f"{report['accuracy']['deploy']:.4f}" in result.stdout
    assert f"{report['latency_ms']['deploy']['median']:.3f} ms" in result.stdout


def test_compress_refuses_a_dataset_that_does_not_fit_the_input_shape(assets, tmp_path):
    result = amct("compress", "--model", assets / "cnn.pt", "--cfg", assets / "quant.cfg", "--data",
                  assets / "small.npz", "--out", tmp_path / "out", "--input-shape", "1,3,32,32")
    assert result.exit_code == 1
    assert "samples have shape [1, 28, 28]" in result.stderr


def test_distill_config_writes_the_groups_of_the_model(assets, tmp_path):
    cfg = tmp_path / "distill.cfg"
    cfg.write_text("batch_num: 2\ngroup_size: 1\n")
    out = tmp_path / "distill.json"
    result = amct("distill-config", "--model", assets / "cnn.pt", "--cfg", cfg, "--data", assets / "small.npz",
                  "--out", out)
    assert result.exit_code == 0, result.output
    config = json.loads(out.read_text())
    assert config["batch_num"] == 2
    assert config["distill_group"] == [["conv1", "bn1", "relu1"], ["conv2", "bn2", "relu2"], ["fc"]]
    assert "conv1 → bn1 → relu1" in result.stdout and "arq_distill INT8" in result.stdout

    cfg.write_text("batch_num: 1\nno_such_field: 3\n")
    bad = amct("distill-config", "--model", assets / "cnn.pt", "--cfg", cfg, "--input-shape", "1,1,28,28",
               "--out", out)
    assert bad.exit_code == 1 and f"{cfg}:2:1" in bad.stderr and "no_such_field" in bad.stderr


@pytest.mark.slow
def test_client_commands_against_a_live_server(live_server, assets, tmp_path):
    # No --api-key: the CLI reads the key the embedded server left in <data-dir>/api-key.
    server = ["--server", live_server.base_url, "--data-dir", live_server.data_dir]
    first = amct("jobs", "submit", "--model", assets / "cnn.pt", "--cfg", assets / "quant.cfg", "--data",
                 assets / "small.npz", "--kind", "quant_retrain", "--batch-size", 32, "--eval-fraction", 0.25, *server)
    assert first.exit_code == 0, first.output
    job_id = first.stdout.strip()

    with AmctClient(live_server.base_url, live_server.api_key) as client:
        job = client.get(job_id)
        unlabelled = client.upload_dataset(assets / "unlabelled.npz")
        with pytest.raises(ApiError) as refused:  # quant_retrain trains on labels
            client.submit("quant_retrain", job["model_id"], job["config_id"], unlabelled["id"])
        assert refused.value.status == 422 and refused.value.field == "dataset_id"
        # The worker runs one job at a time, so this one waits in the queue: cancel takes it at once.
        queued_id = client.submit("quant_retrain", job["model_id"], job["config_id"], job["dataset_id"],
                                  epochs=50)["id"]
    cancelled = amct("jobs", "cancel", queued_id, *server)
    assert cancelled.exit_code == 0 and "cancelled" in cancelled.stdout

    watched = amct("jobs", "watch", job_id, *server)
    assert watched.exit_code == 0, watched.output
    assert "succeeded" in watched.stderr and "after (deploy)" in watched.stdout
    # `watch` exits 1 for a job that did not succeed, and says how it ended.
    watched_cancelled = amct("jobs", "watch", queued_id, *server)
    assert watched_cancelled.exit_code == 1 and "cancelled" in watched_cancelled.stderr

    listed = runner.invoke(app, ["jobs", "list", *map(str, server)], env={"COLUMNS": "160"})
    assert listed.exit_code == 0
    rows = {line.split("│")[1].strip(): line for line in listed.stdout.splitlines() if line.count("│") > 3}
    assert "succeeded" in rows[job_id] and "cancelled" in rows[queued_id]
    only_cancelled = {j["id"] for j in json.loads(amct("jobs", "list", "--status", "cancelled", "--json",
                                                       *server).stdout)}
    assert queued_id in only_cancelled and job_id not in only_cancelled

    fetched = amct("jobs", "download", job_id, "--kind", "deploy", "--kind", "report", "--out", tmp_path / "dl",
                   *server)
    assert fetched.exit_code == 0, fetched.output
    report = json.loads((tmp_path / "dl" / "report.json").read_text())
    deploy = next((tmp_path / "dl").glob("*deploy*.onnx"))
    assert deploy.stat().st_size == report["onnx_size_bytes"]["deploy"]
    assert abs(_accuracy(deploy, assets / "small.npz") - report["accuracy"]["deploy"]) < 0.15

    # A finished job cannot be cancelled: the problem's detail, and exit status 1.
    again = amct("jobs", "cancel", job_id, *server)
    assert again.exit_code == 1 and "already succeeded" in again.stderr


@pytest.mark.slow  # starts the live server when run alone
def test_client_errors_name_the_problem(live_server):
    result = amct("jobs", "watch", "no-such-job", "--server", live_server.base_url, "--api-key", "amct_wrong")
    assert result.exit_code == 1 and "401" in result.stderr


def test_main_keeps_the_old_entry_point(capsys):
    # `python -m service` and the `amct` script call main(), which returns the exit status.
    assert main(["--help"]) == 0
    assert "serve" in capsys.readouterr().out
    assert main(["no-such-command"]) == 2
