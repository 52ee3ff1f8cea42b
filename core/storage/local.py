"""The local-folder blob store (embedded default)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from core.storage.base import CHUNK, BlobRef, blob_key, sha256_file


class LocalStore:
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def path_of(self, sha256: str) -> Path:
        return self.root / blob_key(sha256)

    def uri_of(self, sha256: str) -> str:
        return self.path_of(sha256).as_uri()

    def put_file(self, path, sha256=None) -> BlobRef:
        digest, size = sha256_file(path)
        if sha256 is not None and sha256 != digest:
            raise ValueError(f"{path}: sha256 is {digest}, expected {sha256}")
        target = self.path_of(digest)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            # Copy to a temp name beside the target, then rename: a reader never sees half a blob.
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".incoming-")
            os.close(fd)
            try:
                shutil.copyfile(path, tmp)
                os.chmod(tmp, 0o444)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return BlobRef(digest, size, target.as_uri())

    def exists(self, sha256: str) -> bool:
        return self.path_of(sha256).is_file()

    def iter_bytes(self, sha256: str) -> Iterator[bytes]:
        with open(self.path_of(sha256), "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def fetch(self, sha256: str, dest) -> None:
        shutil.copyfile(self.path_of(sha256), dest)

    def check(self) -> None:
        probe = self.root / ".ready"
        probe.write_bytes(b"ok")
        probe.unlink()
