"""The content-addressed store: a local folder, and S3 through moto's real HTTP server."""

from __future__ import annotations

import hashlib

import pytest

from core.storage import LocalStore, open_store

BLOB = b"onnx bytes " * 1000
SHA = hashlib.sha256(BLOB).hexdigest()


@pytest.fixture(scope="module")
def s3_server():
    """moto in server mode: boto3 talks HTTP to it exactly as to S3 or MinIO."""
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_store(s3_server, monkeypatch):
    import boto3

    for key, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket="amct")
    return open_store("s3://amct/prod/blobs", s3_endpoint_url=s3_server)


@pytest.fixture
def local_store(tmp_path):
    return open_store(f"file://{tmp_path / 'store'}")


@pytest.fixture(params=["local", "s3"])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


def test_put_names_the_blob_by_its_sha256(store, tmp_path):
    (tmp_path / "f.onnx").write_bytes(BLOB)
    ref = store.put_file(tmp_path / "f.onnx")
    assert (ref.sha256, ref.size_bytes) == (SHA, len(BLOB))
    assert ref.uri.endswith(f"sha256/{SHA[:2]}/{SHA[2:4]}/{SHA}")
    assert store.exists(SHA) and b"".join(store.iter_bytes(SHA)) == BLOB
    store.fetch(SHA, tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == BLOB
    store.check()


def test_the_same_bytes_are_stored_once(store, tmp_path):
    (tmp_path / "a").write_bytes(BLOB)
    (tmp_path / "b").write_bytes(BLOB)
    assert store.put_file(tmp_path / "a") == store.put_file(tmp_path / "b")


def test_a_wrong_expected_hash_is_refused(store, tmp_path):
    (tmp_path / "a").write_bytes(BLOB)
    with pytest.raises(ValueError, match="sha256"):
        store.put_file(tmp_path / "a", sha256="0" * 64)
    assert not store.exists("0" * 64)


def test_s3_keys_live_under_the_prefix(s3_store, s3_server, tmp_path):
    import boto3

    (tmp_path / "a").write_bytes(BLOB)
    s3_store.put_file(tmp_path / "a")
    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=s3_server).list_objects_v2(Bucket="amct")["Contents"]]
    assert keys == [f"prod/blobs/sha256/{SHA[:2]}/{SHA[2:4]}/{SHA}"]


def test_local_blobs_are_read_only_and_leave_no_temp_files(local_store: LocalStore, tmp_path):
    (tmp_path / "a").write_bytes(BLOB)
    local_store.put_file(tmp_path / "a")
    files = [p for p in local_store.root.rglob("*") if p.is_file()]
    assert files == [local_store.path_of(SHA)] and oct(files[0].stat().st_mode & 0o777) == "0o444"
