"""Content-addressed artifact store: blobs named by their sha256, on a local folder or S3."""

from __future__ import annotations

from core.storage.base import BlobRef, BlobStore, HashingWriter, blob_key, sha256_file
from core.storage.local import LocalStore


def open_store(uri: str, s3_endpoint_url: str | None = None) -> BlobStore:
    """`file:///path` or a bare path → LocalStore; `s3://bucket/prefix` → S3Store."""
    if uri.startswith("s3://"):
        from core.storage.s3 import S3Store  # boto3 only when S3 is configured

        return S3Store.from_uri(uri, endpoint_url=s3_endpoint_url)
    path = uri[len("file://") :] if uri.startswith("file://") else uri
    return LocalStore(path)


__all__ = ["BlobRef", "BlobStore", "HashingWriter", "LocalStore", "blob_key", "open_store", "sha256_file"]
