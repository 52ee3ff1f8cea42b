"""The S3-compatible blob store (production): `ARTIFACT_STORE=s3://bucket/prefix`.

Credentials and region come from boto3's usual chain (AWS_ACCESS_KEY_ID, …); the endpoint from
`AMCT_S3_ENDPOINT_URL` for MinIO or other S3-compatible servers.
"""

from __future__ import annotations

from collections.abc import Iterator

import boto3
from botocore.exceptions import ClientError

from core.storage.base import CHUNK, BlobRef, blob_key, sha256_file


class S3Store:
    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None, client=None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client or boto3.client("s3", endpoint_url=endpoint_url)

    @classmethod
    def from_uri(cls, uri: str, endpoint_url: str | None = None) -> S3Store:
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        if not bucket:
            raise ValueError(f"ARTIFACT_STORE {uri!r} names no bucket (s3://bucket/prefix)")
        return cls(bucket, prefix, endpoint_url)

    def key_of(self, sha256: str) -> str:
        key = blob_key(sha256)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_file(self, path, sha256=None) -> BlobRef:
        digest, size = sha256_file(path)
        if sha256 is not None and sha256 != digest:
            raise ValueError(f"{path}: sha256 is {digest}, expected {sha256}")
        key = self.key_of(digest)
        if not self.exists(digest):
            # upload_file switches to multipart for big files; the object appears only when complete.
            self.client.upload_file(str(path), self.bucket, key)
        return BlobRef(digest, size, f"s3://{self.bucket}/{key}")

    def exists(self, sha256: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self.key_of(sha256))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def iter_bytes(self, sha256: str) -> Iterator[bytes]:
        body = self.client.get_object(Bucket=self.bucket, Key=self.key_of(sha256))["Body"]
        try:
            yield from body.iter_chunks(CHUNK)
        finally:
            body.close()

    def fetch(self, sha256: str, dest) -> None:
        self.client.download_file(self.bucket, self.key_of(sha256), str(dest))

    def check(self) -> None:
        self.client.head_bucket(Bucket=self.bucket)
