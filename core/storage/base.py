"""What every blob store offers, and the hashing helpers shared by uploads and the worker."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol

CHUNK = 1024 * 1024


@dataclass(frozen=True)
class BlobRef:
    sha256: str
    size_bytes: int
    uri: str


def blob_key(sha256: str) -> str:
    """`sha256/ab/cd/<hash>`: two fan-out levels keep directories and S3 listings small."""
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return f"sha256/{sha256[:2]}/{sha256[2:4]}/{sha256}"


def sha256_file(path: str | os.PathLike) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


class LimitExceeded(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} bytes")
        self.limit = limit


class HashingWriter:
    """Writes a stream to a file while hashing and counting it; stops past `limit` bytes."""

    def __init__(self, f: BinaryIO, limit: int) -> None:
        self._f, self._limit = f, limit
        self._digest = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self._limit:
            raise LimitExceeded(self._limit)
        self._digest.update(chunk)
        self._f.write(chunk)

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()


class BlobStore(Protocol):
    def put_file(self, path: str | os.PathLike, sha256: str | None = None) -> BlobRef:
        """Store the file's bytes under their hash (a no-op when already there)."""

    def exists(self, sha256: str) -> bool: ...

    def iter_bytes(self, sha256: str) -> Iterator[bytes]: ...

    def fetch(self, sha256: str, dest: str | os.PathLike) -> None:
        """Copy the blob to a local file."""

    def check(self) -> None:
        """Raise when the store cannot be reached or written (readiness)."""
