"""Describing an uploaded dataset: `inputs` and optional `labels`, checked before anything trains on them.

The files are read with job_process/arrays.py, the reader the job process trains from, so what was
described at upload is what trains.
"""

from __future__ import annotations

import numpy as np

from job_process.arrays import load_arrays, sniff_format
from service.settings import Settings
from service.zipcheck import check_zip

FLOAT_KINDS = "fc"
INT_KINDS = "iu"


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
