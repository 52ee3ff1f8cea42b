"""Reading a dataset file into named arrays: `.npz` without pickles, or safetensors.

The API describes an upload with these functions (service/datasets.py) and the job process trains on
what they return, so what was described at upload is what trains.
"""

from __future__ import annotations

import os

import numpy as np


def sniff_format(path: str) -> str:
    """By content, not by name: an .npz is a zip; safetensors starts with a JSON header's length."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head.startswith(b"PK"):
        return "npz"
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < os.path.getsize(path):
        return "safetensors"
    raise ValueError("the file is neither an .npz nor a .safetensors file")


def load_arrays(path: str, fmt: str) -> dict[str, np.ndarray]:
    if fmt == "npz":
        # allow_pickle=False: an object array in an .npz would be a pickle, i.e. code.
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    from safetensors.numpy import load_file

    return load_file(path)


# -- streaming: headers and values without holding an array whole (the API describes uploads this way) --

SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "BOOL": "bool",
}
CHUNK_BYTES = 16 << 20


class ArrayHeader:
    """Name, shape and dtype of one array in a dataset file, and how to stream its values."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype, opener) -> None:
        self.name, self.shape, self.dtype, self._opener = name, tuple(int(d) for d in shape), dtype, opener

    def chunks(self, chunk_bytes: int = CHUNK_BYTES):
        """The values, flat, a chunk at a time (order does not matter to what the API checks)."""
        size = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        step = max(self.dtype.itemsize, chunk_bytes - chunk_bytes % self.dtype.itemsize)
        with self._opener() as f:
            left = size
            while left > 0:
                buf = f.read(min(step, left))
                if not buf:
                    raise ValueError(f"array {self.name!r} ends before its {size} bytes")
                left -= len(buf)
                yield np.frombuffer(buf[: len(buf) - len(buf) % self.dtype.itemsize], dtype=self.dtype)


def array_headers(path: str, fmt: str) -> list[ArrayHeader]:
    """Every array's header, read without unpacking the file; ValueError in the user's terms."""
    return _npz_headers(path) if fmt == "npz" else _safetensors_headers(path)


def _npz_headers(path: str) -> list[ArrayHeader]:
    import zipfile

    headers = []
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            with zf.open(info) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                else:
                    raise ValueError(f"array {name!r}: .npy format version {version} is not supported")
                offset = f.tell()
            if dtype.hasobject:
                raise ValueError(f"array {name!r} holds Python objects (a pickle); datasets must be numeric")
            headers.append(ArrayHeader(name, shape, dtype, _npz_opener(path, info.filename, offset)))
    return headers


def _npz_opener(path: str, member: str, offset: int):
    from contextlib import contextmanager

    @contextmanager
    def opener():
        import zipfile

        with zipfile.ZipFile(path) as zf, zf.open(member) as f:
            f.read(offset)  # the .npy header: a few hundred bytes
            yield f

    return opener


def _safetensors_headers(path: str) -> list[ArrayHeader]:
    import json

    size = os.path.getsize(path)
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if length > min(size - 8, 100 << 20):
            raise ValueError("the safetensors header is larger than the file")
        header = json.loads(f.read(length))
    base, headers = 8 + length, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(entry.get("dtype"))
        if dtype is None:
            raise ValueError(f"array {name!r}: dtype {entry.get('dtype')} is not supported")
        start, end = entry["data_offsets"]
        shape, dt = tuple(entry["shape"]), np.dtype(dtype)
        if base + end > size or end - start != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
            raise ValueError(f"array {name!r}: its data offsets do not match its shape or the file")
        headers.append(ArrayHeader(name, shape, dt, _file_opener(path, base + start)))
    return headers


def _file_opener(path: str, offset: int):
    from contextlib import contextmanager

    @contextmanager
    def opener():
        with open(path, "rb") as f:
            f.seek(offset)
            yield f

    return opener
