"""`amct`: the engine on this machine (`compress`, `distill-config`) and the client commands against a live server."""

from __future__ import annotations

import json
import re
import uuid

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
import typer
from typer.testing import CliRunner

from service import local_servers
from service.cli import app, main
from service.cli_common import resolve_api_key
from service.cli_jobs import resolve_job, short_ids
from service.client import AmctClient, ApiError
from tests.service.app_server import AppServer
from tests.service.live_server import free_port
from tests.service.support import QUANT_CFG
from tests.signature_models import TinyEncoder, token_data

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
    result = amct(
        "compress",
        "--model",
        assets / "cnn.pt",
        "--cfg",
        assets / "quant.cfg",
        "--data",
        assets / "small.npz",
        "--kind",
        "compressed_retrain",
        "--out",
        out,
        "--batch-size",
        32,
        "--eval-fraction",
        0.25,
    )
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
    result = amct(
        "compress",
        "--model",
        assets / "cnn.pt",
        "--cfg",
        assets / "quant.cfg",
        "--data",
        assets / "small.npz",
        "--out",
        tmp_path / "out",
        "--input-shape",
        "1,3,32,32",
    )
    assert result.exit_code == 1
    assert "array 'inputs' has per-sample shape [1, 28, 28] but input 'input' is [3, 32, 32]" in result.stderr


# Two int64 inputs whose second axis is dynamic (`seq`), as tests/service/test_signatures.py uploads them.
TOKENS = [
    {"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64"},
    {"name": "attention_mask", "shape": ["batch", "seq"], "dtype": "int64"},
]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """TinyEncoder (token ids + mask -> a 16-wide embedding) as TorchScript, a token dataset without labels, a
    quant cfg; and the eager model, to check the deploy ONNX against."""
    folder = tmp_path_factory.mktemp("encoder")
    torch.manual_seed(0)
    model = TinyEncoder().eval()
    example = token_data(2)
    torch.jit.trace(model, (torch.from_numpy(example["input_ids"]), torch.from_numpy(example["attention_mask"]))).save(
        str(folder / "encoder.pt")
    )
    np.savez(folder / "tokens.npz", **token_data(256, seed=1))
    (folder / "quant.cfg").write_bytes(QUANT_CFG)
    return folder, model


@pytest.mark.slow
def test_compress_runs_a_two_int64_input_model_by_its_signature_with_distill_outputs(encoder, tmp_path):
    folder, eager = encoder
    out = tmp_path / "out"
    result = amct(
        "compress",
        "--model",
        folder / "encoder.pt",
        "--cfg",
        folder / "quant.cfg",
        "--data",
        folder / "tokens.npz",
        "--kind",
        "quant_retrain",
        "--inputs",
        json.dumps(TOKENS),
        "--objective",
        "distill_outputs",
        "--distill-loss",
        "cosine",
        "--epochs",
        2,
        "--batch-size",
        32,
        "--lr",
        1e-3,
        "--eval-fraction",
        0.25,
        "--min-output-cosine",
        0.9,
        "--out",
        out,
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["training"]["objective"] == "distill_outputs"
    assert report["training"]["distill_loss"] == {"output": "cosine"}  # the engine found the one output itself
    assert report["eval"]["samples"] == 64 and "accuracy" not in report  # no labels: agreement with FP32 only
    assert report["quality_gate"]["passed"] and report["quality_gate"]["min_output_cosine"] == 0.9
    cosine = report["outputs"]["output"]["deploy"]["mean_cosine"]
    assert cosine >= 0.9 and f"{cosine:.4f}" in result.stdout

    # The deploy ONNX takes the two int64 inputs by name, `seq` dynamic: tokens of another length than trained on.
    session = ort.InferenceSession(str(out / "model_deploy_model.onnx"), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type) for i in session.get_inputs()] == [
        ("input_ids", "tensor(int64)"),
        ("attention_mask", "tensor(int64)"),
    ]
    held = token_data(64, seq=9, seed=2)
    got = torch.from_numpy(session.run(None, held)[0])
    with torch.no_grad():
        want = eager(torch.from_numpy(held["input_ids"]), torch.from_numpy(held["attention_mask"]))
    assert float(F.cosine_similarity(got, want, dim=1).mean()) >= 0.9


@pytest.mark.parametrize(
    "args, words",
    [
        (["--inputs", '[{"name": "input_ids", "shape": ["batch", 12]'], "--inputs is not valid JSON"),
        (
            ["--inputs", '[{"name": "input_ids", "shape": ["batch", 12], "dtype": "int8"}]'],
            "--inputs: inputs[0].dtype must be one of float32, float16, int64, int32, bool",
        ),
        (
            ["--inputs", '[{"name": "input_ids", "shape": ["batch", 0]}]'],
            "--inputs: inputs[0].shape: each dimension is an integer >= 1 or an axis name",
        ),
        (["--inputs", '{"name": "input_ids"}'], "--inputs: inputs must be a JSON list"),
        (["--inputs", json.dumps(TOKENS), "--input-shape", "1,12"], "give --inputs or --input-shape, not both"),
        # A valid signature the dataset does not fit: refused before the engine starts, naming the array.
        (
            ["--inputs", json.dumps([TOKENS[0], {**TOKENS[1], "name": "token_type_ids"}])],
            "the model's input 'token_type_ids' has no array of that name in the dataset (it has: attention_mask, "
            "input_ids)",
        ),
        (
            ["--inputs", json.dumps([TOKENS[0], {**TOKENS[1], "shape": ["batch", 8]}])],
            "array 'attention_mask' has per-sample shape [12] but input 'attention_mask' is [8]",
        ),
    ],
    ids=["json", "dtype", "dimension", "not-a-list", "both", "missing-array", "shape"],
)
def test_a_bad_signature_is_one_line_naming_the_problem(encoder, tmp_path, args, words):
    folder, _ = encoder
    out = tmp_path / "out"
    result = amct(
        "compress",
        "--model",
        folder / "encoder.pt",
        "--cfg",
        folder / "quant.cfg",
        "--data",
        folder / "tokens.npz",
        "--out",
        out,
        *args,
    )
    assert result.exit_code == 1
    assert words in _one_line(result)
    assert not out.exists()  # nothing ran


def test_distill_config_takes_a_signature(encoder, tmp_path):
    folder, _ = encoder
    out = tmp_path / "distill.json"
    result = amct("distill-config", "--model", folder / "encoder.pt", "--inputs", json.dumps(TOKENS), "--out", out)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["distill_group"] == [["fc1"], ["fc2"]]
    bad = amct("distill-config", "--model", folder / "encoder.pt", "--inputs", "[]", "--out", out)
    assert bad.exit_code == 1 and "--inputs: inputs must be a JSON list of 1 to 16 objects" in _one_line(bad)


def test_distill_config_writes_the_groups_of_the_model(assets, tmp_path):
    cfg = tmp_path / "distill.cfg"
    cfg.write_text("batch_num: 2\ngroup_size: 1\n")
    out = tmp_path / "distill.json"
    result = amct(
        "distill-config", "--model", assets / "cnn.pt", "--cfg", cfg, "--data", assets / "small.npz", "--out", out
    )
    assert result.exit_code == 0, result.output
    config = json.loads(out.read_text())
    assert config["batch_num"] == 2
    assert config["distill_group"] == [["conv1", "bn1", "relu1"], ["conv2", "bn2", "relu2"], ["fc"]]
    assert "conv1 → bn1 → relu1" in result.stdout and "arq_distill INT8" in result.stdout

    cfg.write_text("batch_num: 1\nno_such_field: 3\n")
    bad = amct("distill-config", "--model", assets / "cnn.pt", "--cfg", cfg, "--input-shape", "1,1,28,28", "--out", out)
    assert bad.exit_code == 1 and f"{cfg}:2:1" in bad.stderr and "no_such_field" in bad.stderr


@pytest.mark.slow
def test_client_commands_against_a_live_server(live_server, assets, tmp_path):
    # No --api-key: the CLI reads the key the embedded server left in <data-dir>/api-key.
    server = ["--server", live_server.base_url, "--data-dir", live_server.data_dir]
    first = amct(
        "jobs",
        "submit",
        "--model",
        assets / "cnn.pt",
        "--cfg",
        assets / "quant.cfg",
        "--data",
        assets / "small.npz",
        "--kind",
        "quant_retrain",
        "--batch-size",
        32,
        "--eval-fraction",
        0.25,
        *server,
    )
    assert first.exit_code == 0, first.output
    job_id = first.stdout.strip()

    with AmctClient(live_server.base_url, live_server.api_key) as client:
        job = client.get(job_id)
        unlabelled = client.upload_dataset(assets / "unlabelled.npz")
        with pytest.raises(ApiError) as refused:  # cross_entropy trains on labels
            client.submit(
                "quant_retrain", job["model_id"], job["config_id"], unlabelled["id"], objective="cross_entropy"
            )
        assert refused.value.status == 422 and refused.value.field == "dataset_id"
        # The worker runs one job at a time, so this one waits in the queue: cancel takes it at once.
        queued_id = client.submit("quant_retrain", job["model_id"], job["config_id"], job["dataset_id"], epochs=50)[
            "id"
        ]
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
    # Short ids, as `watch`, `cancel` and `download` take them.
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:] if line.strip()}
    assert "succeeded" in rows[job_id[:8]] and "cancelled" in rows[queued_id[:8]]
    only_cancelled = {
        j["id"] for j in json.loads(amct("jobs", "list", "--status", "cancelled", "--json", *server).stdout)
    }
    assert queued_id in only_cancelled and job_id not in only_cancelled

    fetched = amct(
        "jobs", "download", job_id, "--kind", "deploy", "--kind", "report", "--out", tmp_path / "dl", *server
    )
    assert fetched.exit_code == 0, fetched.output
    report = json.loads((tmp_path / "dl" / "report.json").read_text())
    deploy = next((tmp_path / "dl").glob("*deploy*.onnx"))
    assert deploy.stat().st_size == report["onnx_size_bytes"]["deploy"]
    assert abs(_accuracy(deploy, assets / "small.npz") - report["accuracy"]["deploy"]) < 0.15

    # A second download into the same folder refuses to overwrite, in one line, and writes nothing...
    (tmp_path / "dl" / "report.json").write_text("mine")
    again_dl = amct("jobs", "download", job_id[:8], "--kind", "report", "--out", tmp_path / "dl", *server)
    assert again_dl.exit_code == 1 and "would overwrite" in again_dl.stderr and "--force" in again_dl.stderr
    assert len(again_dl.stderr.strip().splitlines()) == 1
    assert (tmp_path / "dl" / "report.json").read_text() == "mine"
    # ...unless told to.
    forced = amct("jobs", "download", job_id[:8], "--kind", "report", "--out", tmp_path / "dl", "--force", *server)
    assert forced.exit_code == 0, forced.output
    assert json.loads((tmp_path / "dl" / "report.json").read_text()) == report

    # A finished job cannot be cancelled: the problem's detail, and exit status 1.
    again = amct("jobs", "cancel", job_id, *server)
    assert again.exit_code == 1 and "already succeeded" in again.stderr


@pytest.mark.slow  # starts the live server when run alone
def test_client_errors_name_the_problem(live_server):
    result = amct("jobs", "watch", "no-such-job", "--server", live_server.base_url, "--api-key", "amct_wrong")
    assert result.exit_code == 1 and "401" in result.stderr


@pytest.mark.slow  # starts the live server when run alone
def test_the_cli_finds_the_local_servers_key_from_any_folder(live_server, tmp_path, monkeypatch):
    # `amct serve` recorded its data dir under the config dir; no --api-key, no --data-dir, another folder.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AMCT_DATA_DIR", raising=False)
    monkeypatch.delenv("AMCT_API_KEY", raising=False)
    monkeypatch.setenv("AMCT_CONFIG_DIR", str(live_server.config_dir))
    listed = amct("jobs", "list", "--server", live_server.base_url.replace("127.0.0.1", "localhost"))
    assert listed.exit_code == 0, listed.output
    # No 401 (its one-line explanation), and the listing came: a table, or "no jobs" when run alone.
    # Not `"401" not in output`: a job id may start with 401 (one CI run listed 4014c921).
    first_line = listed.output.splitlines()[0]
    assert "Give a key with --api-key" not in listed.output and (first_line == "no jobs" or "status" in first_line)


@pytest.mark.slow
def test_watch_exits_1_for_a_failed_job_and_says_its_error(live_server, assets):
    # The worker has no torch_npu: the job fails at once with error type `unsupported`.
    with AmctClient(live_server.base_url, live_server.api_key) as client:
        model = client.upload_model(assets / "cnn.pt", "1,1,28,28")
        cfg = client.upload_config(assets / "quant.cfg")
        data = client.upload_dataset(assets / "small.npz")
        job_id = client.submit("quant_retrain", model["id"], cfg["id"], data["id"], device="npu")["id"]
    watched = amct("jobs", "watch", job_id[:8], "--server", live_server.base_url, "--api-key", live_server.api_key)
    assert watched.exit_code == 1
    assert "failed" in watched.stderr and "unsupported" in watched.stderr and "torch_npu" in watched.stderr
    # Its deploy model never came: the download says why, in one line.
    fetched = amct(
        "jobs",
        "download",
        job_id[:8],
        "--kind",
        "deploy",
        "--server",
        live_server.base_url,
        "--api-key",
        live_server.api_key,
    )
    assert fetched.exit_code == 1 and f"job {job_id} failed (unsupported)" in fetched.stderr
    assert "--kind log" in fetched.stderr


@pytest.mark.slow
def test_compress_with_a_relative_out_from_another_folder(assets, tmp_path, monkeypatch):
    # The README's `--out out/`: a path relative to the folder the command runs in.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = amct(
        "compress",
        "--model",
        assets / "cnn.pt",
        "--cfg",
        assets / "quant.cfg",
        "--data",
        assets / "small.npz",
        "--kind",
        "compressed_retrain",
        "--out",
        "out/",
        "--batch-size",
        64,
    )
    assert result.exit_code == 0, result.output
    report = json.loads((elsewhere / "out" / "report.json").read_text())
    assert report["kind"] == "compressed_retrain"
    assert (elsewhere / "out" / "model_deploy_model.onnx").stat().st_size == report["onnx_size_bytes"]["deploy"]
    assert not list((elsewhere / "out").glob(".amct-work-*"))
    # quant.cfg does not prune; quantisation adds no non-zero weights (codes at their zero point are zeros).
    params = report["parameters"]
    assert 0 < params["deploy"]["nonzero_weights"] <= params["deploy"]["weights"] == params["fp32"]["weights"]
    assert params["deploy"]["nonzero_weights"] <= params["fp32"]["nonzero_weights"]
    assert "nonzero weights¹" in result.stdout and "an integer code counts when ≠ its zero point" in result.stdout


# -- errors, keys and ids, against the API served in a thread (no worker: jobs stay queued) -----------------


@pytest.fixture(scope="module")
def app_server(tmp_path_factory):
    server = AppServer(tmp_path_factory.mktemp("cli-app"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def queued_jobs(app_server, assets):
    """Three quant_retrain jobs that wait in the queue (nobody consumes it)."""
    with AmctClient(app_server.base_url, app_server.api_key) as client:
        model = client.upload_model(assets / "cnn.pt", "1,1,28,28")
        cfg = client.upload_config(assets / "quant.cfg")
        data = client.upload_dataset(assets / "small.npz")
        return [client.submit("quant_retrain", model["id"], cfg["id"], data["id"])["id"] for _ in range(3)]


def _one_line(result) -> str:
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_an_unreachable_server_is_one_line_not_a_traceback():
    nobody = f"http://127.0.0.1:{free_port()}"
    for command in (
        ["jobs", "list"],
        ["jobs", "watch", str(uuid.uuid4())],
        ["jobs", "cancel", "abcd1234"],
        ["jobs", "download", "abcd1234"],
    ):
        result = amct(*command, "--server", nobody, "--api-key", "amct_x")
        assert result.exit_code == 1
        assert f"cannot reach the service at {nobody}" in _one_line(result) and "Connection refused" in result.stderr


def test_a_401_is_one_line_naming_the_three_ways_to_give_a_key(app_server):
    result = amct("jobs", "list", "--server", app_server.base_url, "--api-key", "amct_wrong")
    assert result.exit_code == 1
    line = _one_line(result)
    assert line.startswith("error: 401") and "--api-key / AMCT_API_KEY" in line  # what was sent
    assert all(way in line for way in ("--api-key", "AMCT_API_KEY", "api-key", "--data-dir", "servers.json"))


def test_a_404_is_one_line(app_server):
    missing = str(uuid.uuid4())
    result = amct("jobs", "watch", missing, "--server", app_server.base_url, "--api-key", app_server.api_key)
    assert result.exit_code == 1 and _one_line(result).startswith("error: 404")
    unknown = amct("jobs", "cancel", "ffffffff0", "--server", app_server.base_url, "--api-key", app_server.api_key)
    assert unknown.exit_code == 1 and "no job of this project has an id starting with 'ffffffff0'" in _one_line(unknown)


def test_jobs_list_fits_80_columns_with_short_ids_the_other_commands_take(app_server, queued_jobs):
    server = ["--server", app_server.base_url, "--api-key", app_server.api_key]
    listed = runner.invoke(app, ["jobs", "list", *server], env={"COLUMNS": "80"})
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    short = short_ids(queued_jobs)
    for job_id in queued_jobs:
        row = next(line for line in lines if line.startswith(short[job_id]))
        assert re.search(rf"^{short[job_id]}\s+queued\s+quant_retrain\s+0%", row), row  # the status whole

    # A unique start of an id is enough for cancel, download and watch.
    first = queued_jobs[0]
    fetched = amct("jobs", "download", first[:6], "--kind", "deploy", *server)
    assert fetched.exit_code == 1
    assert f"job {first} is still queued (0%)" in _one_line(fetched) and "amct jobs watch" in fetched.stderr
    cancelled = amct("jobs", "cancel", first[:6], *server)
    assert cancelled.exit_code == 0 and f"job {first}: cancelled" in cancelled.stdout
    watched = amct("jobs", "watch", first[:6], *server)
    assert watched.exit_code == 1 and "cancelled" in watched.stderr  # it did not succeed


def test_jobs_submit_sends_the_signature_the_objective_and_the_recalibration(app_server, encoder):
    folder, _ = encoder
    server = ["--server", app_server.base_url, "--api-key", app_server.api_key]
    submitted = amct(
        "jobs",
        "submit",
        "--model",
        folder / "encoder.pt",
        "--cfg",
        folder / "quant.cfg",
        "--data",
        folder / "tokens.npz",
        "--inputs",
        json.dumps(TOKENS),
        "--objective",
        "distill_outputs",
        "--distill-loss",
        "cosine",
        "--bn-recalibration-batches",
        4,
        "--min-output-cosine",
        0.98,
        "--world-size",
        2,
        *server,
    )
    assert submitted.exit_code == 0, submitted.output
    with httpx.Client(base_url=app_server.base_url, headers={"Authorization": f"Bearer {app_server.api_key}"}) as api:
        job = api.get(f"/v1/jobs/{submitted.stdout.strip()}").json()
        model = api.get(f"/v1/models/{job['model_id']}").json()
    assert job["kind"] == "compressed_retrain"
    assert {
        k: job["params"][k]
        for k in ("objective", "distill_loss", "bn_recalibration_batches", "min_output_cosine", "world_size", "nodes")
    } == {
        "objective": "distill_outputs",
        "distill_loss": "cosine",
        "bn_recalibration_batches": 4,
        "min_output_cosine": 0.98,
        "world_size": 2,
        "nodes": 1,
    }
    assert model["inputs"] == TOKENS
    # A bad signature is refused before anything uploads.
    bad = amct(
        "jobs",
        "submit",
        "--model",
        folder / "encoder.pt",
        "--cfg",
        folder / "quant.cfg",
        "--data",
        folder / "tokens.npz",
        "--inputs",
        '[{"name": "labels", "shape": [3]}]',
        *server,
    )
    assert bad.exit_code == 1 and "--inputs: inputs[0].name 'labels' must be a unique identifier" in _one_line(bad)


def test_a_prefix_of_several_jobs_is_refused():
    class Listing:  # the one call resolve_job makes for a prefix: a page of GET /v1/jobs
        def list(self, limit, cursor):
            return {
                "items": [{"id": "abcd1234-0000"}, {"id": "abcd9999-0000"}, {"id": "ffff0000-0000"}],
                "next_cursor": None,
            }

    assert resolve_job(Listing(), "abcd12")["id"] == "abcd1234-0000"
    with pytest.raises(typer.Exit) as ambiguous:
        resolve_job(Listing(), "abcd")
    assert ambiguous.value.exit_code == 1
    assert short_ids(["abcd1234aa", "abcd1234bb", "ffff"]) == {
        "abcd1234aa": "abcd1234a",
        "abcd1234bb": "abcd1234b",
        "ffff": "ffff",
    }


def test_the_key_file_of_a_recorded_local_server_is_found_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("AMCT_CONFIG_DIR", str(tmp_path / "config"))
    data_dir = tmp_path / "checkout" / "var"
    data_dir.mkdir(parents=True)
    (data_dir / "api-key").write_text("amct_local\n")
    local_servers.remember("http://0.0.0.0:8123", data_dir)  # `amct serve --host 0.0.0.0 --port 8123`
    monkeypatch.chdir(tmp_path)
    assert resolve_api_key(None, None, "http://localhost:8123/").key == "amct_local"
    assert resolve_api_key(None, None, "http://127.0.0.1:8123").key == "amct_local"
    assert resolve_api_key(None, None, "http://127.0.0.1:8124").key is None  # another server
    assert resolve_api_key("amct_given", None, "http://127.0.0.1:8123").key == "amct_given"


def test_help_shows_no_type_for_flags():
    for command in (["jobs", "submit"], ["jobs", "list"], ["jobs", "download"], ["serve"], ["compress"]):
        result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "120"})
        assert result.exit_code == 0
        assert "<bool>" not in result.stdout, command
        assert "--help" in result.stdout


def test_compress_refuses_what_the_api_refuses_before_the_engine_starts(assets, tmp_path):
    out = tmp_path / "out"
    zero = amct(
        "compress",
        "--model",
        assets / "cnn.pt",
        "--cfg",
        assets / "quant.cfg",
        "--data",
        assets / "small.npz",
        "--out",
        out,
        "--epochs",
        0,
    )
    assert zero.exit_code == 1 and "--epochs 0: Input should be greater than or equal to 1" in _one_line(zero)
    unpruned = amct(
        "compress",
        "--model",
        assets / "cnn.pt",
        "--cfg",
        assets / "quant.cfg",
        "--data",
        assets / "small.npz",
        "--out",
        out,
        "--kind",
        "quant_retrain",
        "--bn-recalibration-batches",
        8,
    )
    assert unpruned.exit_code == 1 and "a quant_retrain job does not prune" in _one_line(unpruned)
    assert not out.exists()  # refused before anything ran
    ranks = amct(
        "jobs",
        "submit",
        "--model",
        assets / "cnn.pt",
        "--cfg",
        assets / "quant.cfg",
        "--data",
        assets / "small.npz",
        "--world-size",
        100,
        "--server",
        "http://127.0.0.1:9",
    )
    assert ranks.exit_code == 1 and "--world-size 100: Input should be less than or equal to 64" in _one_line(ranks)


def test_uint8_images_are_refused_unless_accepted(tmp_path, assets):
    raw = tmp_path / "raw.npz"
    np.savez(raw, inputs=np.zeros((4, 1, 28, 28), np.uint8), labels=np.zeros(4, np.int64))
    refused = amct(
        "compress",
        "--model",
        assets / "cnn.pt",
        "--cfg",
        assets / "quant.cfg",
        "--data",
        raw,
        "--out",
        tmp_path / "out",
    )
    assert refused.exit_code == 1
    line = _one_line(refused)
    assert "uint8" in line and "/ 255" in line and "--accept-uint8" in line
    # Accepted, the submit goes on to the server (none is running here: the next error is that one).
    nobody = f"http://127.0.0.1:{free_port()}"
    accepted = amct(
        "jobs",
        "submit",
        "--model",
        assets / "cnn.pt",
        "--cfg",
        assets / "quant.cfg",
        "--data",
        raw,
        "--accept-uint8",
        "--server",
        nobody,
        "--api-key",
        "amct_x",
    )
    assert accepted.exit_code == 1 and "cannot reach the service" in accepted.stderr


def test_main_keeps_the_old_entry_point(capsys):
    # `python -m service` and the `amct` script call main(), which returns the exit status.
    assert main(["--help"]) == 0
    assert "serve" in capsys.readouterr().out
    assert main(["no-such-command"]) == 2


def test_a_bad_setting_is_one_line_naming_its_variable(capsys, monkeypatch):
    monkeypatch.setenv("AMCT_LEASE_S", "two minutes")
    assert main(["migrate"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: AMCT_LEASE_S: Input should be a valid number") and err.count("\n") == 1, err
    assert "Traceback" not in err and "Value error" not in err
