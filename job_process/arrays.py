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
