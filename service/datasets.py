"""Reading uploaded datasets safely: `.npz` without pickles, safetensors; `inputs` and optional `labels`.

The worker's child process reads them with the same `load_arrays`, so what was described at
upload is what trains.
"""

from __future__ import annotations

import os

import numpy as np

from service.settings import Settings
from service.zipcheck import check_zip

FLOAT_KINDS = "fc"
INT_KINDS = "iu"


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


def check_arrays(arrays: dict[str, np.ndarray]) -> None:
    if "inputs" not in arrays:
        raise ValueError(f"the dataset has no 'inputs' array (it has: {', '.join(sorted(arrays)) or 'none'})")
    inputs = arrays["inputs"]
    if inputs.ndim < 1 or len(inputs) == 0:
        raise ValueError(f"'inputs' must hold at least one sample, got shape {list(inputs.shape)}")
    if inputs.dtype.kind not in FLOAT_KINDS + INT_KINDS:
        raise ValueError(f"'inputs' must be numeric, got dtype {inputs.dtype}")
    labels = arrays.get("labels")
    if labels is not None:
        if labels.ndim != 1 or labels.dtype.kind not in INT_KINDS:
            raise ValueError(f"'labels' must be a 1-D integer array, got {labels.dtype} {list(labels.shape)}")
        if len(labels) != len(inputs):
            raise ValueError(f"'labels' has {len(labels)} entries for {len(inputs)} inputs")
        if labels.min() < 0:
            raise ValueError("'labels' must be class indices >= 0")


def describe_dataset(path: str, settings: Settings) -> tuple[str, dict]:
    fmt = sniff_format(path)
    if fmt == "npz":
        check_zip(path, settings.max_zip_entries, settings.max_unpacked_bytes, "the .npz file")
    try:
        arrays = load_arrays(path, fmt)
    except Exception as e:  # a corrupt archive or header: the user's file, in their terms
        raise ValueError(f"cannot read the {fmt} file: {e}") from None
    check_arrays(arrays)
    description = {
        "samples": int(len(arrays["inputs"])),
        "has_labels": "labels" in arrays,
        "arrays": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in arrays.items()},
    }
    if "labels" in arrays:
        description["num_classes"] = int(arrays["labels"].max()) + 1
    return fmt, description
