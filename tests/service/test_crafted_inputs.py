"""Crafted inputs a hostile tester sent that ended in a 500 (issue 16): each is now a 4xx problem+json naming
the field, on SQLite and on a real PostgreSQL (where a NUL byte used to reach the driver and fail there).

- a `.cfg` nested hundreds or thousands of blocks deep (RecursionError in the parser);
- list cursors whose timestamp is year 9999 or 0001 with a time-zone offset (out of the database's range);
- event ids past any seq (`?after=1e30`, `Last-Event-ID: 1e25`, a 30-digit id: a broken chunked stream);
- NUL and other control characters in ids (path and body), names, filenames and the Idempotency-Key.
"""

from __future__ import annotations

import base64
import json

import pytest

from service.problems import PROBLEM_JSON
from tests.service.tenants import FEATURES, make_tenant, populate, tiny_dataset


@pytest.fixture(scope="module")
def tenant(api):
    return populate(make_tenant(api.client.app, api.settings, "crafted"))


def assert_problem(response, status: int, field: str, words: str = "") -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    body = response.json()
    assert body["status"] == status and body.get("field", "").lower() == field.lower(), body
    assert words in body["detail"], body
    return body


def cursor_of(value) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


# -- .cfg nesting ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "opener, depth",
    [("turbo {", 400), ("retrain_weight_quant_config {", 2000), ("a <", 5000)],
    ids=["400-unknown", "2000-known", "5000-angle"],
)
def test_a_cfg_nested_too_deep_is_a_422_naming_the_line(tenant, opener, depth):
    text = (opener + "\n") * depth + "}\n" * depth
    body = assert_problem(tenant.api.upload_config(text.encode()), 422, "file", "nested more than 32 levels")
    assert body["line"] == 33 and body["column"] == len(opener)  # the first block too deep


def test_a_cfg_at_the_nesting_limit_still_parses_to_its_own_error():
    """32 levels is allowed: the error is then about the unknown field, not the depth."""
    from amct_engine.config.cfg_loader import parse_cfg_document
    from amct_engine.config.errors import ConfigError

    with pytest.raises(ConfigError, match="turbo") as caught:
        parse_cfg_document("turbo {\n" * 32 + "}\n" * 32, "retrain")
    assert "nested" not in str(caught.value)


# -- cursors --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stamp",
    [
        "9999-12-31T23:59:59-05:00",
        "0001-01-01T00:00:00+05:00",
        "9999-12-31T23:59:59",
        "0001-01-01T00:00:00",
        "1969-12-31T00:00:00+00:00",
    ],
)
def test_a_cursor_out_of_range_is_a_422(tenant, stamp):
    response = tenant.api.client.get("/v1/jobs", params={"cursor": cursor_of([stamp, "x"])})
    assert_problem(response, 422, "cursor", "cursor")


def test_a_cursor_with_a_nul_in_its_id_is_a_422(tenant):
    response = tenant.api.client.get("/v1/jobs", params={"cursor": cursor_of(["2026-01-01T00:00:00+00:00", "a\0b"])})
    assert_problem(response, 422, "cursor", "cursor")


def test_a_cursor_this_api_returned_still_pages(tenant):
    api = tenant.api
    for _ in range(2):
        assert api.submit(**tenant.job_body()).status_code == 202
    first = api.client.get("/v1/jobs", params={"limit": 1}).json()
    second = api.client.get("/v1/jobs", params={"limit": 1, "cursor": first["next_cursor"]})
    assert second.status_code == 200, second.text
    assert second.json()["items"][0]["id"] != first["items"][0]["id"]


# -- event ids ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("after", ["1e30", "1" + "0" * 30, str(2**31)])
def test_events_after_past_any_seq_is_a_422(tenant, after):
    response = tenant.api.client.get(f"/v1/jobs/{tenant.ids['job_id']}/events", params={"after": after})
    assert_problem(response, 422, "after")


@pytest.mark.parametrize("header", ["1e25", "1" + "0" * 25, "9" * 5000, str(2**31)])
def test_last_event_id_past_any_seq_is_a_422(tenant, header):
    response = tenant.api.client.get(f"/v1/jobs/{tenant.ids['job_id']}/events", headers={"Last-Event-ID": header})
    assert_problem(response, 422, "Last-Event-ID")


def test_the_largest_event_id_is_an_empty_finished_stream(tenant):
    response = tenant.api.client.get(f"/v1/jobs/{tenant.ids['job_id']}/events", params={"after": 2**31 - 1})
    assert response.status_code == 200 and "id:" not in response.text


# -- control characters ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, field",
    [
        ("/v1/jobs/a%00b", "job_id"),
        ("/v1/jobs/a%00b/events", "job_id"),
        ("/v1/models/%00", "model_id"),
        ("/v1/configs/x%01y", "config_id"),
        ("/v1/datasets/%7F", "dataset_id"),
        ("/v1/artifacts/%00", "artifact_id"),
        ("/v1/jobs/a%0Ab/artifacts", "job_id"),
    ],
)
def test_a_control_character_in_a_path_id_is_a_422(tenant, path, field):
    assert_problem(tenant.api.client.get(path), 422, field, "control character")


def test_a_control_character_in_a_key_id_is_a_422(tenant):
    assert_problem(tenant.api.client.post("/v1/keys/%00/revoke"), 422, "key_id", "control character")


@pytest.mark.parametrize("field", ["model_id", "config_id", "dataset_id"])
def test_a_nul_in_a_body_id_is_a_422(tenant, field):
    body = tenant.job_body(**{field: tenant.ids[field] + "\0"})
    assert_problem(tenant.api.submit(**body), 422, field, "control character")


def test_a_nul_in_a_model_id_query_on_cancel_is_a_422(tenant):
    assert_problem(tenant.api.client.post("/v1/jobs/%00/cancel"), 422, "job_id", "control character")


def raw_upload(api, url: str, filename: bytes, data: bytes, **fields: str):
    """A multipart body written by hand: httpx would percent-encode a NUL in the filename, a raw client does not."""
    boundary = b"crafted-boundary"
    parts = [
        b'--%s\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n' % (boundary, k.encode(), v.encode())
        for k, v in fields.items()
    ]
    parts.append(
        b'--%s\r\nContent-Disposition: form-data; name="file"; filename="%s"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n%s\r\n" % (boundary, filename, data)
    )
    body = b"".join(parts) + b"--%s--\r\n" % boundary
    content_type = f"multipart/form-data; boundary={boundary.decode()}"
    return api.client.post(url, content=body, headers={"Content-Type": content_type})


@pytest.mark.parametrize("filename", [b"da\0ta.npz", b"a\x1bb.npz"])
def test_a_control_character_in_an_upload_filename_is_a_422(tenant, filename):
    response = raw_upload(tenant.api, "/v1/datasets", filename, tiny_dataset())
    assert_problem(response, 422, "file", "control character")


def test_a_nul_in_a_cfg_filename_is_a_422(tenant):
    response = raw_upload(tenant.api, "/v1/configs", b"q\0.cfg", b"retrain_data_quant_config {}\n", kind="retrain")
    assert_problem(response, 422, "file", "control character")


def test_a_nul_in_an_upload_name_is_a_422(tenant):
    response = tenant.api.client.post(
        "/v1/datasets", files={"file": ("data.npz", tiny_dataset())}, data={"name": "bad\0name"}
    )
    assert_problem(response, 422, "name", "control character")


def test_a_nul_in_a_model_upload_name_is_a_422(tenant):
    response = tenant.api.client.post(
        "/v1/models", files={"file": ("m.pt", b"PK")}, data={"name": "m\0", "input_shape": f"1,{FEATURES}"}
    )
    assert_problem(response, 422, "name", "control character")


def test_a_nul_in_a_key_name_is_a_422(tenant):
    assert_problem(
        tenant.api.client.post("/v1/keys", json={"scopes": ["read"], "name": "k\0"}), 422, "name", "control character"
    )


def test_a_lone_surrogate_in_a_body_id_is_a_422(tenant):
    body = json.dumps(tenant.job_body()).replace(tenant.ids["model_id"], "\\ud800")
    response = tenant.api.client.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert_problem(response, 422, "model_id", "character")


def test_a_control_character_in_the_idempotency_key_is_a_422(tenant):
    response = tenant.api.submit(headers={"Idempotency-Key": "k\x01y"}, **tenant.job_body())
    assert_problem(response, 422, "idempotency-key", "control character")


def test_ordinary_unicode_names_are_kept(tenant):
    response = tenant.api.client.post("/v1/datasets", files={"file": ("données ✓.npz", tiny_dataset())})
    assert response.status_code == 201, response.text
    assert response.json()["name"] == "données ✓.npz"
