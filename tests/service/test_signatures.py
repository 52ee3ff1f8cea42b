"""Model signatures and named-array datasets through the API (issue 17 items 1-2, issue 16 item 5).

Real TorchScript files checked in the real sandboxed child; datasets checked at upload (streamed)
and against the model's signature at submit, each refusal a 422 naming the array.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from service.checks import checks_slot
from tests.service.support import QUANT_CFG, Api, make_settings, npz_bytes, open_api
from tests.service.test_api import assert_problem
from tests.signature_models import TinyEncoder, TwoHeadCnn, token_data

TOKENS = [
    {"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64"},
    {"name": "attention_mask", "shape": ["batch", "seq"], "dtype": "int64"},
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("signature-models")
    torch.manual_seed(0)
    d = token_data(2)
    torch.jit.trace(
        TinyEncoder().eval(), (torch.from_numpy(d["input_ids"]), torch.from_numpy(d["attention_mask"]))
    ).save(str(folder / "encoder.pt"))
    torch.jit.trace(TwoHeadCnn().eval(), torch.randn(2, 1, 28, 28)).save(str(folder / "two_head.pt"))
    return folder


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("signatures"))
    with open_api(settings) as client:
        yield Api(client, settings)


@pytest.fixture(scope="module")
def uploaded(api, models):
    encoder = api.upload_model(models / "encoder.pt", input_shape="", name="encoder", inputs=json.dumps(TOKENS))
    assert encoder.status_code == 201, encoder.text
    two_head = api.upload_model(models / "two_head.pt", input_shape="2,1,28,28", name="two-head")
    assert two_head.status_code == 201, two_head.text
    config = api.upload_config(QUANT_CFG)
    return {"encoder": encoder.json(), "two_head": two_head.json(), "config_id": config.json()["id"]}


def test_two_int64_inputs_are_taken_by_name_with_dynamic_axes(api, uploaded):
    model = api.client.get(f"/v1/models/{uploaded['encoder']['id']}").json()
    assert model["inputs"] == TOKENS
    # The check ran the model on batch 2 and seq 7 (the example sizes of the axes batch and seq).
    assert model["outputs"] == {"type": "tensor", "shape": [2, 16], "dtype": "float32"}
    assert model["input_shape"] == [2, 7] and model["input_dtype"] == "int64"


def test_a_tuple_output_is_recorded_with_its_shapes(api, uploaded):
    model = uploaded["two_head"]
    assert model["inputs"] == [{"name": "input", "shape": ["batch", 1, 28, 28], "dtype": "float32"}]
    assert model["outputs"] == {
        "type": "tuple",
        "items": [
            {"type": "tensor", "shape": [2, 10], "dtype": "float32"},
            {"type": "tensor", "shape": [2, 4], "dtype": "float32"},
        ],
    }


@pytest.mark.parametrize(
    "inputs, field",
    [
        ("not json", "inputs"),
        ("[]", "inputs"),
        (json.dumps([{"name": "x", "shape": ["batch", 4], "dtype": "complex64"}]), "inputs[0].dtype"),
        (json.dumps([{"name": "x", "shape": ["batch", 0]}]), "inputs[0].shape"),
        (json.dumps([{"name": "x", "shape": [2]}, {"name": "x", "shape": [2]}]), "inputs[1].name"),
        (json.dumps([{"name": "labels", "shape": [2]}]), "inputs[0].name"),
    ],
)
def test_bad_signatures_are_422_naming_the_field(api, models, inputs, field):
    body = assert_problem(api.upload_model(models / "encoder.pt", input_shape="", inputs=inputs), 422, field)
    assert "inputs" in body["detail"]


def test_a_signature_the_model_cannot_run_is_422_at_the_forward_stage(api, models):
    floats = json.dumps(
        [
            {"name": "input_ids", "shape": ["batch", "seq"], "dtype": "float32"},
            {"name": "attention_mask", "shape": ["batch", "seq"], "dtype": "float32"},
        ]
    )
    body = assert_problem(api.upload_model(models / "encoder.pt", input_shape="", inputs=floats), 422, "file")
    assert body["stage"] == "forward"


def _dataset(api, **arrays) -> str:
    response = api.upload_dataset(npz_bytes(**arrays))
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _submit(api, uploaded, model: str, dataset_id: str, **extra):
    return api.submit(
        kind="quant_retrain",
        model_id=uploaded[model]["id"],
        config_id=uploaded["config_id"],
        dataset_id=dataset_id,
        **extra,
    )


TOK = token_data(8)


@pytest.mark.parametrize(
    "arrays, array, words",
    [
        ({"input_ids": TOK["input_ids"]}, "attention_mask", "has no array of that name"),
        (
            {"input_ids": TOK["input_ids"].astype("float32"), "attention_mask": TOK["attention_mask"]},
            "input_ids",
            "integer arrays only",
        ),
        ({"input_ids": TOK["input_ids"], "attention_mask": TOK["attention_mask"][:, :5]}, "attention_mask", "'seq'"),
        (
            {"input_ids": TOK["input_ids"][:, :, None], "attention_mask": TOK["attention_mask"]},
            "input_ids",
            "per-sample shape",
        ),
    ],
    ids=["missing-name", "float-token-ids", "seq-differs", "extra-axis"],
)
def test_a_dataset_that_does_not_fit_the_signature_is_422_naming_the_array(api, uploaded, arrays, array, words):
    body = assert_problem(_submit(api, uploaded, "encoder", _dataset(api, **arrays)), 422, "dataset_id")
    assert body["array"] == array and words in body["detail"], body


def test_labels_beyond_the_output_width_are_422_at_submit(api, uploaded):
    images = np.zeros((6, 1, 28, 28), "float32")
    dataset = _dataset(api, input=images, labels=np.array([0, 1, 2, 3, 9, 10]))
    body = assert_problem(_submit(api, uploaded, "two_head", dataset), 422, "dataset_id")
    assert body["array"] == "labels" and "holds class 10" in body["detail"] and "10 classes" in body["detail"]
    wrong_shape = _dataset(api, input=np.zeros((6, 1, 28, 27), "float32"), labels=np.arange(6))
    body = assert_problem(_submit(api, uploaded, "two_head", wrong_shape), 422, "dataset_id")
    assert body["array"] == "input"


def test_nan_inputs_and_uneven_counts_are_422_at_upload(api):
    body = assert_problem(
        api.upload_dataset(npz_bytes(input_ids=TOK["input_ids"], scale=np.array([1.0, np.inf] * 4))), 422, "file"
    )
    assert body["array"] == "scale" and "NaN or Inf" in body["detail"]
    body = assert_problem(
        api.upload_dataset(npz_bytes(input_ids=TOK["input_ids"], attention_mask=TOK["attention_mask"][:5])), 422, "file"
    )
    assert body["array"] == "attention_mask" and "has 5 samples" in body["detail"]


def test_token_datasets_fit_and_default_to_distill_outputs(api, uploaded):
    job = _submit(api, uploaded, "encoder", _dataset(api, **TOK))
    assert job.status_code == 202, job.text
    assert job.json()["params"]["objective"] == "distill_outputs"
    gated = _submit(api, uploaded, "encoder", _dataset(api, **TOK), max_accuracy_drop=0.05)
    assert_problem(gated, 422, "max_accuracy_drop")  # top-1 needs labels


def test_uploads_beyond_the_concurrent_check_cap_get_429_with_retry_after(api, models):
    with checks_slot(api.settings, "dataset"), checks_slot(api.settings, "dataset"):
        busy = api.upload_dataset(npz_bytes(**TOK))
        body = assert_problem(busy, 429, "file")
        assert busy.headers["retry-after"] == str(api.settings.check_retry_after_s) and body["limit"] == 2
    with checks_slot(api.settings, "model"), checks_slot(api.settings, "model"):
        assert_problem(api.upload_model(models / "two_head.pt", input_shape="2,1,28,28"), 429, "file")
    assert api.upload_dataset(npz_bytes(**TOK)).status_code == 201  # the slots are free again
