"""Streamed multipart uploads: the file part goes to disk while it is hashed and counted.

Starlette's `request.form()` spools a whole file before a route sees it and has no size limit
for files (docs/spec/service.md §3), so uploads read `request.stream()` through python-multipart's push parser
and stop with 413 the moment the limit is passed.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from fastapi import Request
from python_multipart.multipart import MultipartParser, parse_options_header

from core.storage.base import HashingWriter, LimitExceeded
from service.problems import Problem

MAX_FIELD_BYTES = 64 * 1024
# Headers and the form's text fields ride along with the file part.
ENVELOPE_BYTES = 1024 * 1024


@dataclass
class Upload:
    fields: dict[str, str] = field(default_factory=dict)
    path: Path | None = None
    filename: str | None = None
    sha256: str = ""
    size_bytes: int = 0

    @property
    def file(self) -> Path:
        """Where the uploaded file was written (receive_upload returns an Upload only once it has one)."""
        if self.path is None:
            raise RuntimeError("the upload has no file part")
        return self.path

    def discard(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


class _Receiver:
    """python-multipart callbacks: sort each part into a text field or the one file."""

    def __init__(self, upload: Upload, file_field: str, limit: int, tmp_dir: Path) -> None:
        self.upload, self.file_field, self.limit, self.tmp_dir = upload, file_field, limit, tmp_dir
        self._header_field = self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self._name: str | None = None
        self._text = bytearray()
        self._writer: HashingWriter | None = None
        self._file: BinaryIO | None = None
        self._in_file = False

    def callbacks(self) -> Any:  # python-multipart's MultipartCallbacks
        return {
            "on_part_begin": self.part_begin,
            "on_part_data": self.part_data,
            "on_part_end": self.part_end,
            "on_header_field": self.header_field,
            "on_header_value": self.header_value,
            "on_header_end": self.header_end,
            "on_headers_finished": self.headers_finished,
        }

    def part_begin(self) -> None:
        self._headers, self._name, self._text = {}, None, bytearray()

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def header_end(self) -> None:
        self._headers[self._header_field.lower()] = self._header_value
        self._header_field = self._header_value = b""

    def headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        if b"filename" not in options:
            return
        if self._name != self.file_field or self._writer is not None:
            raise Problem(
                422,
                f"unexpected file part {self._name!r}; send one file as {self.file_field!r}",
                field=self._name or self.file_field,
            )
        self.upload.filename = os.path.basename(options[b"filename"].decode("utf-8", "replace"))[:255]
        fd, name = tempfile.mkstemp(dir=self.tmp_dir, prefix="upload-")
        self.upload.path = Path(name)
        self._file = file = os.fdopen(fd, "wb")
        self._writer = HashingWriter(file, self.limit)
        self._in_file = True

    def part_data(self, data: bytes, start: int, end: int) -> None:
        if self._in_file and self._writer is not None:
            self._writer.write(data[start:end])
            return
        self._text += data[start:end]
        if len(self._text) > MAX_FIELD_BYTES:
            raise Problem(413, f"form field {self._name!r} is longer than {MAX_FIELD_BYTES} bytes", field=self._name)

    def part_end(self) -> None:
        if self._in_file and self._file is not None and self._writer is not None:
            self._in_file = False
            self._file.close()
            self.upload.sha256, self.upload.size_bytes = self._writer.sha256, self._writer.size
        elif self._name:
            self.upload.fields[self._name] = self._text.decode("utf-8", "replace")

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()


async def receive_upload(request: Request, file_field: str, limit: int, tmp_dir: Path) -> Upload:
    """Parse a multipart/form-data body; 413 past `limit` bytes of file, 415/422 for a bad form."""
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data" or b"boundary" not in options:
        raise Problem(415, "send the upload as multipart/form-data", field="Content-Type")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + ENVELOPE_BYTES:
        raise Problem(
            413, f"{file_field} is larger than the limit of {limit} bytes", field=file_field, limit_bytes=limit
        )
    tmp_dir.mkdir(parents=True, exist_ok=True)
    upload = Upload()
    receiver = _Receiver(upload, file_field, limit, tmp_dir)
    parser = MultipartParser(options[b"boundary"], receiver.callbacks())
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except LimitExceeded:
        receiver.close()
        upload.discard()
        raise Problem(
            413, f"{file_field} is larger than the limit of {limit} bytes", field=file_field, limit_bytes=limit
        ) from None
    except BaseException:
        receiver.close()
        upload.discard()
        raise
    receiver.close()
    if upload.path is None or not upload.sha256:
        upload.discard()
        raise Problem(422, f"the form has no file part named {file_field!r}", field=file_field)
    return upload
