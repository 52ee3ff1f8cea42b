"""The no-training job kinds (ptq, sensitivity, auto_mixed_precision, prune_search) through a real
`celery worker`, Redis and PostgreSQL; the `.cfg` files they write, fed back to `ptq` and `prune_retrain`;
and the same kinds on a model of two named int64 inputs.

Same stack as tests/service/test_worker.py: the API in process, the worker a separate process. Jobs
that several tests read run once per module (`jobs`).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from amct_engine.config.calibration_cfg import parse_calibration_cfg
from amct_engine.config.cfg_checks import check_cfg_for_api
from amct_engine.config.cfg_loader import parse_cfg_document
from tests.service.support import Api, npz_bytes, wait_terminal, worker_stack
from tests.signature_models import TinyEncoder, token_data

pytestmark = pytest.mark.slow

PTQ_CFG = b"""# INT8 PTQ, HFMG activations, 2 calibration batches
batch_num: 2
common_config { hfmg_quantize { num_of_bins: 2048 } arq_quantize { channel_wise: true } }
"""
AMP_CFG = b"""# mixed precision under a 3-point top-1 budget (180 search samples: one image is 0.56 points)
batch_num: 2
search_config { max_top1_drop: 3.0 }
"""
SENSITIVITY_CFG = b"""# each layer at INT8 and INT4, each channel group at half its channels
batch_num: 2
search_config { precisions: INT8 precisions: INT4 prune_ratios: 0.5 }
"""
PRUNE_CFG = b"""# half the multiply-accumulates
batch_num: 2
search_config { target_macs_ratio: 0.5 }
"""
TOKENS = [
    {"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64"},
    {"name": "attention_mask", "shape": ["batch", "seq"], "dtype": "int64"},
]
JOB = {"batch_size": 64, "eval_fraction": 0.25}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, pg_url, redis_url, assets):
    with worker_stack(tmp_path_factory.mktemp("search_stack"), pg_url, redis_url) as (api, worker):
        ids = {
            "model_id": api.upload_model(assets / "cnn.pt").json()["id"],
            "dataset_id": api.upload_dataset((assets / "fmnist.npz").read_bytes()).json()["id"],
        }
        yield api, worker, ids


@pytest.fixture(scope="module")
def jobs(stack):
    """kind -> (job, artifacts, events) of the Fashion-MNIST CNN's job of that kind, run on first use."""
    api, _worker, ids = stack
    done = {}

    def get(kind: str) -> tuple[dict, dict, list[dict]]:
        if kind not in done:
            cfg = {
                "ptq": PTQ_CFG,
                "auto_mixed_precision": AMP_CFG,
                "sensitivity": SENSITIVITY_CFG,
                "prune_search": PRUNE_CFG,
            }[kind]
            done[kind] = _run(api, ids, kind, cfg)
        return done[kind]

    return get


def _run(
    api: Api, ids: dict, kind: str, cfg: bytes, cfg_kind: str = "calibration", **params
) -> tuple[dict, dict, list[dict]]:
    config = api.upload_config(cfg, kind=cfg_kind)
    assert config.status_code == 201, config.text
    assert config.json()["summary"]["job_kinds"][kind] == {"ok": True}
    submit = api.submit(
        kind=kind,
        model_id=ids["model_id"],
        config_id=config.json()["id"],
        dataset_id=ids["dataset_id"],
        **{**JOB, **params},
    )
    assert submit.status_code == 202, submit.text
    job = wait_terminal(api, submit.json()["id"], timeout=400)
    assert job["status"] == "succeeded", job["error"]
    artifacts = {a["kind"]: a for a in api.client.get(f"/v1/jobs/{job['id']}/artifacts").json()["items"]}
    text = api.client.get(f"/v1/jobs/{job['id']}/events").text
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    return job, artifacts, events


def _content(api: Api, artifact: dict) -> bytes:
    return api.client.get(artifact["content_url"]).content


def _report(api: Api, artifacts: dict) -> dict:
    return api.client.get(artifacts["report"]["content_url"]).json()


def _steps(events: list[dict]) -> list[tuple[int, int]]:
    return [(e["step"], e["total_steps"]) for e in events if e["type"] == "progress"]


def test_ptq_job_end_to_end(stack, jobs, assets):
    api, worker, ids = stack
    job, artifacts, events = jobs("ptq")
    assert set(artifacts) >= {"config", "record", "fused_onnx", "fake_quant", "deploy", "report"}
    assert _steps(events) == [(1, 2), (2, 2)]  # one event per calibration batch
    report = _report(api, artifacts)
    assert report["ptq"] == {"batch_num": 2, "calibration_samples": 128}
    assert report["accuracy"]["deploy"] >= report["accuracy"]["fp32"] - 0.01
    config = api.client.get(artifacts["config"]["content_url"]).json()
    assert config["conv1"]["activation_quant_params"] == {
        "act_algo": "hfmg_quantize",
        "num_bits": 8,
        "num_of_bins": 2048,
    }
    session = ort.InferenceSession(_content(api, artifacts["deploy"]), providers=["CPUExecutionProvider"])
    data = np.load(assets / "fmnist.npz")
    assert (session.run(None, {"input": data["inputs"][:300]})[0].argmax(1) == data["labels"][:300]).mean() > 0.7


def test_auto_mixed_precision_job_end_to_end(stack, jobs):
    api = stack[0]
    job, artifacts, events = jobs("auto_mixed_precision")
    report = _report(api, artifacts)["mixed_precision"]
    assert report["budget"] == {"max_top1_drop": 3.0} and report["samples"] == 180
    assert report["deployed"]["top1_drop"] <= 3.0
    assert set(report["precisions"]) == {"conv1", "conv2", "fc"}
    tried = {s["layer"]: s["accepted"] for s in report["steps"] if s["to"] == "INT4"}
    assert set(tried) == {"conv1", "conv2", "fc"}
    assert {n for n, ok in tried.items() if ok} == {n for n, p in report["precisions"].items() if p == "INT4"}
    assert report["weight_bytes"] == 20432 - sum(
        w // 2 for n, w in (("conv1", 144), ("conv2", 4608), ("fc", 15680)) if report["precisions"][n] == "INT4"
    )
    assert _steps(events)[-1] == (3, 3)  # the three layers tried at INT4
    # The chosen cfg downloads as text, parses with our loader, and says what the report says.
    cfg = api.client.get(artifacts["mixed_precision_cfg"]["content_url"]).text
    assert cfg == report["cfg_text"]
    msg = parse_calibration_cfg(cfg).message
    int4 = {o.layer_name for o in msg.override_layer_configs if o.calibration_config.arq_quantize.quant_bits == 4}
    assert int4 == {n for n, p in report["precisions"].items() if p == "INT4"}
    # The deploy file takes the signature's names, as every other kind's does.
    assert [i.name for i in onnx.load_from_string(_content(api, artifacts["deploy"])).graph.input] == ["input"]


def test_the_mixed_precision_cfg_fed_to_ptq_gives_the_same_deploy_model(stack, jobs, assets):
    api, _worker, ids = stack
    _job, amp_artifacts, _ = jobs("auto_mixed_precision")
    cfg = _content(api, amp_artifacts["mixed_precision_cfg"])
    _job, artifacts, _ = _run(api, ids, "ptq", cfg)  # same calibration batches: the first 2 x 64 samples
    x = np.load(assets / "fmnist.npz")["inputs"][:500]
    outputs = [
        ort.InferenceSession(_content(api, found["deploy"]), providers=["CPUExecutionProvider"]).run(
            None, {"input": x}
        )[0]
        for found in (amp_artifacts, artifacts)
    ]
    np.testing.assert_array_equal(outputs[0], outputs[1])
    amp_report, report = _report(api, amp_artifacts), _report(api, artifacts)
    assert report["accuracy"]["deploy"] == amp_report["accuracy"]["deploy"]
    assert report["onnx_size_bytes"]["deploy"] == amp_report["onnx_size_bytes"]["deploy"]


def test_sensitivity_job_end_to_end(stack, jobs):
    api = stack[0]
    job, artifacts, events = jobs("sensitivity")
    assert set(artifacts) >= {"config", "record", "fused_onnx", "fake_quant", "deploy", "sensitivity", "report"}
    report = _report(api, artifacts)
    table = report["sensitivity"]
    assert table["metric"] == "top1_drop" and table["samples"] == 180
    rows = table["rows"]
    # 3 layers x (INT8, INT4), then the two channel groups (conv1's and conv2's filters) at 0.5.
    assert sorted((r["layer"], r["variant"]) for r in rows) == sorted(
        [(n, p) for n in ("conv1", "conv2", "fc") for p in ("INT8", "INT4")]
        + [("conv1", "prune 0.5"), ("conv2", "prune 0.5")]
    )
    damages = [r["damage"] for r in rows]
    assert damages == sorted(damages, reverse=True)  # most damaged first
    assert all(r["damage"] == r["top1_drop"] for r in rows)  # a classifier: damage is the top-1 drop
    for variant in ("INT8", "INT4"):  # every quantizable layer once: the shares add up
        assert sum(r["macs_share"] for r in rows if r["variant"] == variant) == pytest.approx(1.0)
        assert sum(r["bytes_share"] for r in rows if r["variant"] == variant) == pytest.approx(1.0)
    # Progress: the two PTQ calibration batches, then the 8 measurements (the job process sends at most
    # ~10 progress lines a second, so a fast measurement's line may be skipped; the last one never is).
    steps = _steps(events)
    assert steps[:2] == [(1, 2), (2, 2)] and steps[-1] == (8, 8)
    assert all(total == 8 for _, total in steps[2:]) and [d for d, _ in steps[2:]] == sorted({d for d, _ in steps[2:]})
    assert json.loads(_content(api, artifacts["sensitivity"])) == table
    assert report["ptq"] == {"batch_num": 2, "calibration_samples": 128}


def test_prune_search_job_end_to_end(stack, jobs):
    api = stack[0]
    job, artifacts, events = jobs("prune_search")
    assert set(artifacts) >= {"record", "prune_search_cfg", "deploy", "checkpoint", "report"}
    report = _report(api, artifacts)
    search = report["prune_search"]
    assert search["target_macs_ratio"] == 0.5 and search["samples"] == 180
    assert search["measured_macs_ratio"] <= 0.5
    assert search["measured_macs_ratio"] == pytest.approx(search["estimated_macs_ratio"], abs=1e-6)
    assert search["ratios"] and set(search["ratios"]) <= {"conv1", "conv2"}  # fc feeds the output: never pruned
    # 2 groups x 6 ratios measured alone and the best choices measured whole, then the retraining epoch.
    steps, measured = _steps(events), 12 + len(search["choices"])  # (lines may be skipped: see above)
    search_steps = [s for s in steps if s[1] == measured]
    assert search_steps[-1] == (measured, measured) and search_steps == sorted(set(search_steps))
    assert steps[-1][0] == steps[-1][1] > 1 and steps[-1][1] != measured
    cfg = _content(api, artifacts["prune_search_cfg"]).decode()
    assert cfg == search["cfg_text"]
    doc = parse_cfg_document(cfg, "retrain")
    check_cfg_for_api(doc, "prune")
    ratios = {
        o.layer_name: o.prune_config.filter_pruner.balanced_l2_norm_filter_prune.prune_ratio
        for o in doc.message.override_layer_configs
    }
    assert ratios == pytest.approx(search["ratios"])
    assert report["parameters"]["deploy"]["weights"] < report["parameters"]["fp32"]["weights"]


def test_the_prune_search_cfg_fed_to_prune_retrain_gives_the_same_pruned_model(stack, jobs):
    api, _worker, ids = stack
    _job, search_artifacts, _ = jobs("prune_search")
    cfg = _content(api, search_artifacts["prune_search_cfg"])
    _job, artifacts, _ = _run(api, ids, "prune_retrain", cfg, cfg_kind="retrain")
    shapes = [
        {t.name: list(t.dims) for t in onnx.load_from_string(_content(api, found["deploy"])).graph.initializer}
        for found in (search_artifacts, artifacts)
    ]
    assert shapes[0] == shapes[1]  # the same channels kept in every layer
    search_report, report = _report(api, search_artifacts), _report(api, artifacts)
    assert report["parameters"]["deploy"] == search_report["parameters"]["deploy"]
    # prune_search re-estimates the BatchNorms before its epoch, prune_retrain does not: the same architecture
    # trained from slightly different starts.
    assert abs(report["accuracy"]["deploy"] - search_report["accuracy"]["deploy"]) < 0.1


@pytest.fixture(scope="module")
def encoder(stack, tmp_path_factory):
    """TinyEncoder (input_ids, attention_mask) -> [n, 16], uploaded with its signature, and 600 token samples."""
    api = stack[0]
    folder = tmp_path_factory.mktemp("encoder")
    torch.manual_seed(0)
    data = token_data(600)
    torch.jit.trace(
        TinyEncoder().eval(), tuple(torch.from_numpy(data[n][:2]) for n in ("input_ids", "attention_mask"))
    ).save(str(folder / "encoder.pt"))
    model = api.upload_model(folder / "encoder.pt", input_shape="", name="encoder", inputs=json.dumps(TOKENS))
    assert model.status_code == 201, model.text
    dataset = api.upload_dataset(npz_bytes(**data), filename="tokens.npz")
    assert dataset.status_code == 201, dataset.text
    return {"model_id": model.json()["id"], "dataset_id": dataset.json()["id"]}


@pytest.mark.parametrize("kind", ["ptq", "sensitivity", "auto_mixed_precision", "prune_search"])
def test_the_calibration_and_search_kinds_take_a_model_of_two_named_inputs(stack, encoder, kind):
    api = stack[0]
    cfg = b"batch_num: 2\nsearch_config { prune_ratios: 0.5 min_cosine: 0.98 target_macs_ratio: 0.5 }\n"
    _job, artifacts, _ = _run(api, encoder, kind, cfg)
    report = _report(api, artifacts)
    deploy = onnx.load_from_string(_content(api, artifacts["deploy"]))
    assert [i.name for i in deploy.graph.input] == ["input_ids", "attention_mask"]
    assert report["agreement_with_original"]["deploy"]["mean_cosine"] > 0.8
    if kind == "sensitivity":  # no labels: the damage is 100 x (1 - output cosine)
        rows = report["sensitivity"]["rows"]
        assert report["sensitivity"]["metric"] == "cosine"
        assert {(r["layer"], r["variant"]) for r in rows} == {
            ("fc1", "INT8"),
            ("fc1", "INT4"),
            ("fc2", "INT8"),
            ("fc2", "INT4"),
            ("fc1", "prune 0.5"),
        }
        assert all(
            r["top1_drop"] is None and r["damage"] == pytest.approx(100 * (1 - r["cosine"]), abs=1e-3) for r in rows
        )
    if kind == "auto_mixed_precision":
        mixed = report["mixed_precision"]
        assert mixed["budget"] == {"min_cosine": pytest.approx(0.98)} and mixed["deployed"]["cosine"] >= 0.98
        assert set(mixed["precisions"]) == {"fc1", "fc2"}
    if kind == "prune_search":  # fc1's 32 outputs feed fc2 only; fc2's are the model's output
        search = report["prune_search"]
        assert set(search["ratios"]) == {"fc1"} and search["measured_macs_ratio"] <= 0.5
        assert report["training"]["objective"] == "distill_outputs"  # no labels: against the FP32 model
