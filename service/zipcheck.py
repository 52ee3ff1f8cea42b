"""Look inside a zip (TorchScript files and .npz are zips) before anything unpacks it: pure zipfile, no code runs."""

from __future__ import annotations

import zipfile

MAX_RATIO = 200  # a zip bomb packs far tighter than weights or tensors ever do


def check_zip(path: str, max_entries: int, max_unpacked: int, what: str) -> list[zipfile.ZipInfo]:
    """The archive's entries, or ValueError saying what is wrong in the user's terms."""
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{what} is not a zip archive")
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
    if len(infos) > max_entries:
        raise ValueError(f"{what} has {len(infos)} entries; the limit is {max_entries}")
    total = sum(i.file_size for i in infos)
    if total > max_unpacked:
        raise ValueError(f"{what} unpacks to {total} bytes; the limit is {max_unpacked}")
    for info in infos:
        name = info.filename
        if name.startswith("/") or ".." in name.split("/"):
            raise ValueError(f"{what} has an unsafe entry name {name!r}")
        if info.compress_size and info.file_size / info.compress_size > MAX_RATIO and info.file_size > 1 << 20:
            raise ValueError(f"{what}: entry {name!r} is compressed {info.file_size // info.compress_size}:1")
    return infos
