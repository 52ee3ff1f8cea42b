"""Look inside a zip (TorchScript files and .npz are zips) before anything unpacks it: pure zipfile, no code runs."""

from __future__ import annotations

import zipfile

MAX_RATIO = 200  # a zip bomb packs far tighter than weights or tensors ever do
# The records torch.jit.load reads first, in the archive's folder: torch.save writes data.pkl but no constants.pkl.
TORCHSCRIPT_RECORDS = ("data.pkl", "constants.pkl")


def check_zip(path: str, max_entries: int, max_unpacked: int, what: str) -> list[zipfile.ZipInfo]:
    """The archive's entries, or ValueError saying what is wrong in the user's terms."""
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{what} is not a zip archive")
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError) as e:  # an end record that looks right in front of a broken directory
        raise ValueError(f"{what} is not a readable zip archive ({e})") from None
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


def check_torchscript(path: str, max_entries: int, max_unpacked: int, what: str) -> list[zipfile.ZipInfo]:
    """check_zip, then the layout torch.jit.load needs before it runs anything: every entry in one folder (the
    first entry's, as torch's reader takes it) holding data.pkl and constants.pkl. Refuses a text file, an
    .npz or a torch.save checkpoint in milliseconds, where loading it would take a sandboxed child."""
    infos = check_zip(path, max_entries, max_unpacked, what)
    if not infos:
        raise ValueError(f"{what} is an empty zip archive, not a TorchScript file")
    root, slash, _ = infos[0].filename.partition("/")
    names = {i.filename for i in infos}
    missing = [r for r in TORCHSCRIPT_RECORDS if f"{root}/{r}" not in names] if slash else list(TORCHSCRIPT_RECORDS)
    if missing:
        saved_by = " (torch.save writes weights without it)" if missing == ["constants.pkl"] else ""
        raise ValueError(f"{what} is a zip archive but not a TorchScript file: it has no {missing[0]}{saved_by}")
    return infos
