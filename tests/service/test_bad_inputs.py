"""A corpus of bad requests: every one is a 4xx application/problem+json that names the field or the reason.

Broken cfgs, wrong JSON types, missing fields, zip bombs and random bytes named .pt, oversized
uploads, shapes that do not fit, ids of another project, and missing, revoked or under-scoped keys.
test_api.py and test_uploads.py hold the cases they already cover; these are others. Only one
case reaches the model-validation child (a torch.save file that is a zip but not TorchScript).
"""

from __future__ import annotations

import base64
import io
import json
import struct
import zipfile

import numpy as np
import pytest

from service import auth
from service.problems import PROBLEM_JSON
from tests.service.support import QUANT_CFG, make_settings, npz_bytes, open_api
from tests.service.tenants import FEATURES, keyed_client, make_tenant, populate, tiny_dataset

CONFIG_LIMIT = 2048
DATASET_LIMIT = 32 * 1024


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    settings = make_settings(
        tmp_path_factory.mktemp("bad-inputs"), max_config_bytes=CONFIG_LIMIT, max_dataset_bytes=DATASET_LIMIT
    )
    with open_api(settings) as client:
        app = client.app
        a, b = populate(make_tenant(app, settings, "bad-a")), populate(make_tenant(app, settings, "bad-b"))
        sessions = app.state.sessions
        keys = {scope: auth.create_key(sessions, "bad-a", [scope], scope)[1] for scope in ("read", "write")}
        revoked_id, keys["revoked"] = auth.create_key(sessions, "bad-a", ["admin"], "revoked")
        auth.revoke_key(sessions, revoked_id)
        unlabelled = a.api.upload_dataset(tiny_dataset(labels=False), filename="unlabelled.npz")
        flat = a.api.upload_dataset(
            npz_bytes(inputs=np.zeros((4, FEATURES, 2), "float32"), labels=np.zeros(4, "int64")), filename="3d.npz"
        )
        a.ids.update(unlabelled_id=unlabelled.json()["id"], wrong_shape_id=flat.json()["id"])
        yield {"app": app, "a": a, "b": b, "keys": keys}


# -- how to make each bad request -----------------------------------------------------------------------------


def _model(c, data: bytes, filename: str = "model.pt", **fields):
    form = {"name": "m", "input_shape": f"1,{FEATURES}", **fields}
    return c["a"].api.client.post("/v1/models", files={"file": (filename, data)}, data=form)


def _cfg(c, data: bytes, kind: str = "retrain"):
    return c["a"].api.upload_config(data, kind=kind, filename="bad.cfg")


def _dataset(c, data: bytes, filename: str = "bad.npz"):
    return c["a"].api.upload_dataset(data, filename=filename)


def _submit(c, headers=None, **overrides):
    return c["a"].api.submit(headers=headers, **c["a"].job_body(**overrides))


def _submit_raw(c, content: bytes | str):
    return c["a"].api.client.post("/v1/jobs", content=content, headers={"Content-Type": "application/json"})


def _as(c, who: str, method: str, url: str, **kwargs):
    secret = c["keys"].get(who, who) if who else None
    return keyed_client(c["app"], secret).request(method, url, **kwargs)


def zip_claiming(entries: int = 4, claimed: int = 0xF000_0000) -> bytes:
    """A few hundred bytes whose directory says each entry unpacks to ~4 GB."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(entries):
            zf.writestr(f"archive/data/{i}", b"\0" * 1024)
    data = bytearray(buf.getvalue())
    at = data.find(b"PK\x01\x02")
    while at != -1:  # each central-directory record: uncompressed size at +24
        data[at + 24 : at + 28] = struct.pack("<I", claimed)
        at = data.find(b"PK\x01\x02", at + 4)
    return bytes(data)


def zip_dense() -> bytes:
    """64 MiB of zeros deflated to ~64 KB: over the ratio any weights or tensors reach."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("archive/data/0", b"\0" * (64 << 20))
    return buf.getvalue()


def torch_save_pickle() -> bytes:
    """torch.save of a state dict: a zip like TorchScript, but a pickle, not a module."""
    import torch

    buf = io.BytesIO()
    torch.save({"weight": torch.zeros(3, FEATURES)}, buf)
    return buf.getvalue()


def truncated_safetensors() -> bytes:
    """A header promising 4x16 float32 (256 bytes) followed by 100 bytes."""
    header = b'{"inputs": {"dtype": "F32", "shape": [4, 16], "data_offsets": [0, 256]}}'
    return struct.pack("<Q", len(header)) + header + b"\0" * 100


def cursor_of(value) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


RNG = np.random.default_rng(7)
# (case id, request, status, field, words the detail must contain)
CORPUS = [
    # keys and scopes
    ("no-key", lambda c: _as(c, None, "GET", "/v1/jobs"), 401, "Authorization", "Bearer"),
    (
        "basic-auth-scheme",
        lambda c: _as(c, None, "GET", "/v1/jobs", headers={"Authorization": "Basic YTpi"}),
        401,
        "Authorization",
        "Bearer",
    ),
    ("unknown-key", lambda c: _as(c, "amct_" + "A" * 43, "GET", "/v1/me"), 401, "Authorization", "unknown"),
    ("revoked-key", lambda c: _as(c, "revoked", "GET", "/v1/me"), 401, "Authorization", "revoked"),
    (
        "read-key-uploads",
        lambda c: _as(c, "read", "POST", "/v1/configs", files={"file": ("q.cfg", QUANT_CFG)}, data={"kind": "retrain"}),
        403,
        "Authorization",
        "write",
    ),
    ("write-key-lists-keys", lambda c: _as(c, "write", "GET", "/v1/keys"), 403, "Authorization", "admin"),
    # another project's ids
    (
        "other-project-model",
        lambda c: c["a"].api.client.get(f"/v1/models/{c['b'].ids['model_id']}"),
        404,
        "model_id",
        "no model",
    ),
    (
        "other-project-dataset-in-job",
        lambda c: _submit(c, dataset_id=c["b"].ids["dataset_id"]),
        404,
        "dataset_id",
        "no dataset",
    ),
    (
        "other-project-artifact-content",
        lambda c: c["a"].api.client.get(f"/v1/artifacts/{c['b'].ids['artifact_id']}/content"),
        404,
        "artifact_id",
        "no artifact",
    ),
    (
        "other-project-key-revoke",
        lambda c: c["a"].api.client.post(f"/v1/keys/{c['b'].key_id}/revoke"),
        404,
        "key_id",
        "no key",
    ),
    # broken cfgs
    (
        "cfg-unclosed-block",
        lambda c: _cfg(c, b"retrain_weight_quant_config {\n  arq_retrain { channel_wise: true }\n"),
        422,
        "file",
        "never closed",
    ),
    ("cfg-unknown-field", lambda c: _cfg(c, QUANT_CFG + b"turbo_mode: true\n"), 422, "file", "turbo_mode"),
    (
        "cfg-bad-enum",
        lambda c: _cfg(c, b"retrain_weight_quant_config { arq_retrain { dst_type: INT3 } }\n"),
        422,
        "file",
        "INT4, INT8, INT16",
    ),
    (
        "cfg-string-for-bool",
        lambda c: _cfg(c, b'retrain_weight_quant_config { arq_retrain { channel_wise: "yes" } }\n'),
        422,
        "file",
        "true or false",
    ),
    (
        "cfg-ratio-out-of-range",
        lambda c: _cfg(c, b"prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 1.5 } } }\n"),
        422,
        "file",
        "prune_ratio",
    ),
    ("cfg-random-bytes", lambda c: _cfg(c, RNG.bytes(512)), 422, "file", "UTF-8"),
    ("cfg-retrain-as-distill", lambda c: _cfg(c, QUANT_CFG, kind="distill"), 422, "file", "AMCTDistillConfig"),
    ("cfg-oversized", lambda c: _cfg(c, b"# pad\n" * (CONFIG_LIMIT // 6 + 100)), 413, "file", str(CONFIG_LIMIT)),
    (
        "cfg-missing-kind",
        lambda c: c["a"].api.client.post("/v1/configs", files={"file": ("q.cfg", QUANT_CFG)}),
        422,
        "kind",
        "kind",
    ),
    # models
    ("pt-zip-claiming-16-gb", lambda c: _model(c, zip_claiming()), 422, "file", "unpacks to"),
    ("pt-zip-bomb-1000-to-1", lambda c: _model(c, zip_dense()), 422, "file", "compressed"),
    ("pt-random-bytes", lambda c: _model(c, RNG.bytes(4096)), 422, "file", "not a zip"),
    ("pt-text-file", lambda c: _model(c, b"def forward(x):\n    return x\n"), 422, "file", "not a zip"),
    ("pt-torch-save-not-torchscript", lambda c: _model(c, torch_save_pickle()), 422, "file", "not a TorchScript file"),
    ("pt-float-input-shape", lambda c: _model(c, b"PK", input_shape="1.5,16"), 422, "input_shape", "1.5,16"),
    ("pt-unknown-dtype", lambda c: _model(c, b"PK", input_dtype="float8"), 422, "input_dtype", "float32"),
    ("pt-name-too-long", lambda c: _model(c, b"PK", name="n" * 201), 422, "name", "200"),
    (
        "pt-no-file-part",
        lambda c: c["a"].api.client.post("/v1/models", files={"name": (None, "m")}, data={"input_shape": "1,16"}),
        422,
        "file",
        "no file",
    ),
    # datasets
    (
        "dataset-oversized",
        lambda c: _dataset(c, npz_bytes(inputs=np.zeros((DATASET_LIMIT // 4 + 16,), "float32"))),
        413,
        "file",
        str(DATASET_LIMIT),
    ),
    ("dataset-string-inputs", lambda c: _dataset(c, npz_bytes(inputs=np.array(["a", "b"]))), 422, "file", "numeric"),
    (
        "dataset-negative-labels",
        lambda c: _dataset(c, npz_bytes(inputs=np.zeros((2, 3)), labels=np.array([0, -1]))),
        422,
        "file",
        ">= 0",
    ),
    ("dataset-no-samples", lambda c: _dataset(c, npz_bytes(inputs=np.zeros((0, 3)))), 422, "file", "one sample"),
    (
        "dataset-truncated-safetensors",
        lambda c: _dataset(c, truncated_safetensors(), "d.safetensors"),
        422,
        "file",
        "cannot read the safetensors file",
    ),
    # jobs
    ("job-body-is-a-list", lambda c: _submit_raw(c, json.dumps([c["a"].job_body()])), 422, "body", "dict"),
    ("job-body-truncated-json", lambda c: _submit_raw(c, '{"kind": "quant_retrain", '), 422, "body", "JSON"),
    ("job-epochs-a-string", lambda c: _submit(c, epochs="ten"), 422, "epochs", "integer"),
    ("job-batch-size-fraction", lambda c: _submit(c, batch_size=3.5), 422, "batch_size", "integer"),
    ("job-kind-a-number", lambda c: _submit(c, kind=3), 422, "kind", "quant_retrain"),
    (
        "job-missing-model-id",
        lambda c: c["a"].api.client.post(
            "/v1/jobs", json={k: v for k, v in c["a"].job_body().items() if k != "model_id"}
        ),
        422,
        "model_id",
        "required",
    ),
    (
        "job-dataset-rank-mismatch",
        lambda c: _submit(c, dataset_id=c["a"].ids["wrong_shape_id"]),
        422,
        "dataset_id",
        f"[{FEATURES}, 2]",
    ),
    (
        "job-unlabelled-for-cross-entropy",
        lambda c: _submit(c, dataset_id=c["a"].ids["unlabelled_id"], objective="cross_entropy"),
        422,
        "dataset_id",
        "labels",
    ),
    ("job-unknown-objective", lambda c: _submit(c, objective="hinge"), 422, "objective", "distill_outputs"),
    ("job-unknown-distill-loss", lambda c: _submit(c, distill_loss="huber"), 422, "distill_loss", "cosine"),
    ("job-temperature-zero", lambda c: _submit(c, temperature=0), 422, "temperature", "greater than 0"),
    (
        "job-accuracy-gate-without-labels",
        lambda c: _submit(c, dataset_id=c["a"].ids["unlabelled_id"], max_accuracy_drop=0.05),
        422,
        "max_accuracy_drop",
        "labels",
    ),
    ("job-cosine-gate-above-one", lambda c: _submit(c, min_output_cosine=1.5), 422, "min_output_cosine", "1"),
    (
        "job-bn-recalibration-without-pruning",
        lambda c: _submit(c, bn_recalibration_batches=8),
        422,
        "bn_recalibration_batches",
        "a quant_retrain job does not prune",
    ),
    (
        "job-bn-recalibration-negative",
        lambda c: _submit(c, bn_recalibration_batches=-1),
        422,
        "bn_recalibration_batches",
        "greater than or equal to 0",
    ),
    ("model-inputs-not-json", lambda c: _model(c, b"PK", input_shape="", inputs="{name"), 422, "inputs", "JSON"),
    (
        "model-inputs-bad-dtype",
        lambda c: _model(c, b"PK", input_shape="", inputs='[{"name": "x", "shape": [1], "dtype": "int8"}]'),
        422,
        "inputs[0].dtype",
        "int64",
    ),
    (
        "dataset-inf-values",
        lambda c: _dataset(c, npz_bytes(x=np.array([1.0, np.inf], "float32"))),
        422,
        "file",
        "NaN or Inf",
    ),
    (
        "job-idempotency-key-too-long",
        lambda c: _submit(c, headers={"Idempotency-Key": "k" * 201}),
        422,
        "idempotency-key",
        "200",
    ),
    (
        "jobs-cursor-wrong-shape",
        lambda c: c["a"].api.client.get("/v1/jobs", params={"cursor": cursor_of({"a": 1})}),
        422,
        "cursor",
        "cursor",
    ),
    ("jobs-limit-zero", lambda c: c["a"].api.client.get("/v1/jobs", params={"limit": 0}), 422, "limit", "1"),
    (
        "job-unknown-id",
        lambda c: c["a"].api.client.get("/v1/jobs/00000000-0000-0000-0000-000000000000"),
        404,
        "job_id",
        "no job",
    ),
    (
        "events-negative-after",
        lambda c: c["a"].api.client.get(f"/v1/jobs/{c['a'].ids['job_id']}/events", params={"after": -1}),
        422,
        "after",
        "0",
    ),
    # keys
    (
        "key-unknown-scope",
        lambda c: c["a"].api.client.post("/v1/keys", json={"scopes": ["root"]}),
        422,
        "scopes.0",
        "admin",
    ),
    ("key-no-scopes", lambda c: c["a"].api.client.post("/v1/keys", json={"scopes": []}), 422, "scopes", "1"),
]


def test_the_corpus_is_large_and_distinct():
    assert len(CORPUS) >= 30
    assert len({case[0] for case in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize(
    "request_of, status, field, words", [case[1:] for case in CORPUS], ids=[case[0] for case in CORPUS]
)
def test_bad_input_is_a_4xx_problem_naming_the_field_and_reason(ctx, request_of, status, field, words):
    response = request_of(ctx)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    body = response.json()
    assert body["status"] == status and body["title"] and body["detail"]
    assert body.get("field", "").lower() == field.lower(), body
    assert words in body["detail"], body
