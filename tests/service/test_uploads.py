"""Upload limits and validation: 413 past the size limit, 422 naming the field for bad files."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from tests.service.support import Api, make_settings, npz_bytes, open_api
from tests.service.test_api import assert_problem


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("uploads"))
    with open_api(settings) as client:
        yield Api(client, settings)


def _multipart(boundary: str, fields: dict[str, str], filename: str, chunks) -> object:
    """A multipart body sent in chunks, with no Content-Length (chunked transfer encoding)."""

    def body():
        for name, value in fields.items():
            yield (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n').encode()
        yield (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        yield from chunks
        yield f"\r\n--{boundary}--\r\n".encode()

    return body()


def test_a_model_over_the_limit_is_413_before_it_is_read(api, monkeypatch):
    monkeypatch.setattr(api.settings, "max_model_bytes", 10_000)
    response = api.client.post(
        "/v1/models", files={"file": ("big.pt", b"x" * 2_000_000)}, data={"name": "big", "input_shape": "1,1,28,28"}
    )
    body = assert_problem(response, 413, "file")
    assert body["limit_bytes"] == 10_000


def test_a_streamed_model_is_cut_off_at_the_limit(api, monkeypatch):
    monkeypatch.setattr(api.settings, "max_model_bytes", 100_000)
    chunks = (b"y" * 65536 for _ in range(64))  # 4 MiB, never sent whole
    response = api.client.post(
        "/v1/models",
        content=_multipart("b0undary", {"name": "m", "input_shape": "1,28"}, "m.pt", chunks),
        headers={"Content-Type": "multipart/form-data; boundary=b0undary"},
    )
    assert_problem(response, 413, "file")
    assert list(api.settings.tmp_dir.glob("upload-*")) == []  # the partial file is gone


def test_a_file_that_is_not_torchscript_is_422_without_loading_it(api):
    response = api.client.post(
        "/v1/models", files={"file": ("m.pt", b"\x80\x04not a zip")}, data={"name": "m", "input_shape": "1,1,28,28"}
    )
    body = assert_problem(response, 422, "file")
    assert "not a zip archive" in body["detail"]


def test_a_model_that_fails_on_its_input_shape_is_422_with_the_stage(api, assets):
    response = api.upload_model(assets / "cnn.pt", input_shape="1,3,28,28")
    body = assert_problem(response, 422, "file")
    assert body["stage"] == "forward" and "expected input[1, 3, 28, 28] to have 1 channels" in body["detail"]


@pytest.mark.parametrize("shape", ["", "1,a", "0,3", "1,2,3,4,5,6,7,8,9", "100000,100000"])
def test_bad_input_shapes_are_422(api, assets, shape):
    assert_problem(api.upload_model(assets / "cnn.pt", input_shape=shape), 422, "input_shape")


def test_form_without_a_file_or_not_multipart(api):
    assert_problem(api.client.post("/v1/configs", data={"kind": "retrain"}, files={"other": ("x", b"1")}), 422, "other")
    assert_problem(api.client.post("/v1/configs", json={"kind": "retrain"}), 415, "Content-Type")


def _zip_bomb() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("inputs.npy", b"\0" * (50 << 20))
    return buf.getvalue()


@pytest.mark.parametrize(
    "data, message",
    [
        (npz_bytes(inputs=np.zeros((0, 3))), "at least one sample"),
        (npz_bytes(inputs=np.zeros((3, 2)), labels=np.arange(2)), "'labels' has 2 samples but 'inputs' has 3"),
        (npz_bytes(inputs=np.array([1.0, np.nan])), "array 'inputs' holds NaN or Inf"),
        (npz_bytes(inputs=np.zeros((3, 2)), labels=np.zeros(3)), "1-D integer array"),
        (npz_bytes(inputs=np.array([{"a": 1}], dtype=object)), "holds Python objects (a pickle)"),  # refused unread
        (_zip_bomb(), "compressed"),
        (b"plain text", "neither an .npz nor a .safetensors"),
    ],
)
def test_bad_datasets_are_422_saying_why(api, data, message):
    body = assert_problem(api.upload_dataset(data), 422, "file")
    assert message in body["detail"]


def test_safetensors_datasets_are_accepted(api):
    from safetensors.numpy import save

    data = save({"inputs": np.zeros((3, 1, 28, 28), np.float32), "labels": np.array([0, 1, 2])})
    response = api.upload_dataset(data, filename="d.safetensors")
    assert response.status_code == 201, response.text
    assert response.json()["format"] == "safetensors" and response.json()["description"]["samples"] == 3
