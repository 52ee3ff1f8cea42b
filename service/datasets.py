"""Describing an uploaded dataset (named arrays), and checking it against a model's signature at submit.

A dataset is an `.npz` or safetensors file of named arrays, one sample per row of the first axis:
one array per model input, named after it (a one-input model also takes `inputs`), optional
`labels` (class indices) and optional targets for the `mse` / `l1` objectives (`targets` for a
one-output model, or named after the outputs: job_host/signature.py `output_leaves`).

The API never unpacks a file whole (issue 16 item 5): headers are read from the archive
(job_host/arrays.py `array_headers`) and values streamed in chunks to find NaN/Inf and integer
ranges, so a 2 GiB array costs the API one chunk of memory. The job process trains on the same
arrays with `load_arrays`, so what was described at upload is what trains.
"""

from __future__ import annotations

import numpy as np

from core.settings import Settings
from job_host.arrays import array_headers, sniff_format
from job_host.objective_names import TARGET_OBJECTIVES
from job_host.signature import FLOAT_DTYPES, SignatureError, class_width, input_arrays, output_leaves, target_arrays
from job_host.text_data import TextDataError, describe_text, text_format
from service.zipcheck import check_zip

FLOAT_KINDS = "fc"
INT_KINDS = "iu"
NUMERIC_KINDS = "fciub"


class DatasetError(ValueError):
    """A dataset that does not suit (the file, or the job's model): `array` names the array at fault."""

    def __init__(self, message: str, array: str | None = None) -> None:
        super().__init__(message)
        self.array = array


def _stats(header) -> dict:
    """Per-array facts the submit check needs, from one streamed pass: finite (floats), min/max (integers)."""
    kind = header.dtype.kind
    if kind == "f":
        finite = all(bool(np.isfinite(chunk).all()) for chunk in header.chunks())
        return {"finite": finite}
    if kind in INT_KINDS and header.shape and header.shape[0]:
        low, high = None, None
        for chunk in header.chunks():
            if chunk.size:
                low = int(chunk.min()) if low is None else min(low, int(chunk.min()))
                high = int(chunk.max()) if high is None else max(high, int(chunk.max()))
        return {"min": low, "max": high}
    return {}


def describe_dataset(path: str, settings: Settings, filename: str | None = None) -> tuple[str, dict]:
    """An upload's format and description (or a local file's: `amct compress`); the archive is checked against
    the settings' zip limits first. A file named `.txt` or `.jsonl` (`filename`, else the path's name) that is
    neither array format is read as text (job_host/text_data.py: the LLM kinds' datasets)."""
    try:
        fmt = sniff_format(path)
    except ValueError as e:
        text = text_format(filename or path)
        if text is None:
            raise DatasetError(f"{e} (a text dataset for llm_quant: a .txt or .jsonl file)") from None
        try:
            return text, describe_text(path, text)
        except TextDataError as e:
            raise DatasetError(f"the {text} file does not read: {e}") from None
    if fmt == "npz":
        check_zip(path, settings.max_zip_entries, settings.max_unpacked_bytes, "the .npz file")
    return fmt, describe_arrays(path, fmt)


def describe_arrays(path: str, fmt: str) -> dict:
    """Shapes, dtypes, finiteness and integer ranges of every array, checked as one dataset (DatasetError)."""
    try:
        headers = array_headers(path, fmt)
    except DatasetError:
        raise
    except Exception as e:  # a corrupt archive or header: the user's file, in their terms
        raise DatasetError(f"cannot read the {fmt} file: {e}") from None
    arrays = {}
    for h in headers:
        _check_header(h)
        try:
            arrays[h.name] = {"shape": list(h.shape), "dtype": str(h.dtype), **_stats(h)}
        except Exception as e:
            raise DatasetError(f"cannot read array {h.name!r}: {e}", h.name) from None
    samples = _check_arrays(arrays)
    description = {"samples": samples, "has_labels": "labels" in arrays, "arrays": arrays}
    if "labels" in arrays:
        description["num_classes"] = arrays["labels"]["max"] + 1
    return description


def _check_header(h) -> None:
    if h.dtype.kind not in NUMERIC_KINDS or h.dtype.names is not None:
        raise DatasetError(f"array {h.name!r} must be numeric, got dtype {h.dtype}", h.name)
    if len(h.shape) < 1 or h.shape[0] == 0:
        raise DatasetError(
            f"array {h.name!r} must hold at least one sample (its first axis), got shape {list(h.shape)}", h.name
        )


def _check_arrays(arrays: dict[str, dict]) -> int:
    """Sample count; the same for every array. NaN/Inf and bad labels are refused here, whatever the model."""
    if not arrays:
        raise DatasetError("the dataset holds no arrays")
    first = next(iter(arrays))
    samples = arrays[first]["shape"][0]
    for name, a in arrays.items():
        if a["shape"][0] != samples:
            raise DatasetError(
                f"array {name!r} has {a['shape'][0]} samples but {first!r} has {samples}; "
                "every array needs one row per sample",
                name,
            )
        if a.get("finite") is False:
            raise DatasetError(f"array {name!r} holds NaN or Inf values", name)
    labels = arrays.get("labels")
    if labels is not None:
        if len(labels["shape"]) != 1 or np.dtype(labels["dtype"]).kind not in INT_KINDS:
            raise DatasetError(
                f"'labels' must be a 1-D integer array, got {labels['dtype']} {labels['shape']}", "labels"
            )
        if labels["min"] < 0:
            raise DatasetError("'labels' must be class indices >= 0", "labels")
    return int(samples)


# -- against a model -----------------------------------------------------------------------------


def check_against_model(description: dict, inputs: list[dict], outputs: dict | None, objective: str) -> None:
    """Refuse at submit what would fail in the worker: DatasetError naming the array."""
    arrays = description["arrays"]
    axes: dict[str, tuple[int, str]] = {}
    try:
        sources = input_arrays(inputs, arrays)
    except SignatureError as e:
        raise DatasetError(str(e), e.field) from None
    for name, array in sources.items():
        spec = next(s for s in inputs if s["name"] == name)
        _check_input(spec, array, arrays[array], axes)
    width = class_width(outputs)
    labels = arrays.get("labels")
    # Datasets described before the streamed check have num_classes but no min/max.
    top = labels.get("max", description.get("num_classes", 1) - 1) if labels is not None else None
    if labels is not None and top is not None and width is not None and top >= width:
        raise DatasetError(
            f"'labels' holds class {top} but the model's output has {width} classes (labels must be < {width})",
            "labels",
        )
    if objective == "cross_entropy" and labels is None:
        raise DatasetError(
            "the cross_entropy objective trains on 'labels', which the dataset lacks; use "
            "objective distill_outputs (no labels needed)",
            "labels",
        )
    if objective in TARGET_OBJECTIVES:
        targets = target_arrays(outputs, arrays)
        if not targets:
            names = [n for n, _ in output_leaves(outputs)] if outputs else ["output"]
            raise DatasetError(
                f"the {objective} objective needs target arrays named after the outputs "
                f"({', '.join(names)}) or 'targets'",
                "targets",
            )
        leaves = dict(output_leaves(outputs)) if outputs else {}
        for output, array in targets.items():
            want = leaves.get(output, {}).get("shape", [None])[1:]
            got = arrays[array]["shape"][1:]
            if want and want != got:
                raise DatasetError(f"array {array!r} has per-sample shape {got} but output {output!r} is {want}", array)


def _check_input(spec: dict, array: str, a: dict, axes: dict[str, tuple[int, str]]) -> None:
    kind, want = np.dtype(a["dtype"]).kind, spec["dtype"]
    if want in FLOAT_DTYPES and kind not in FLOAT_KINDS + INT_KINDS:
        raise DatasetError(f"array {array!r} is {a['dtype']}; input {spec['name']!r} takes {want}", array)
    if want not in FLOAT_DTYPES and kind not in INT_KINDS + "b":
        # Token ids and masks are never cast from floats: a float array here is the wrong array.
        raise DatasetError(
            f"array {array!r} is {a['dtype']}; input {spec['name']!r} takes {want} (integer arrays only)", array
        )
    got, dims = a["shape"][1:], spec["shape"][1:]
    if len(got) != len(dims):
        raise DatasetError(
            f"array {array!r} has per-sample shape {got} but input {spec['name']!r} is {dims} "
            "(its shape without the batch axis)",
            array,
        )
    for axis, (g, d) in enumerate(zip(got, dims, strict=True), start=1):
        if isinstance(d, int) and g != d:
            raise DatasetError(
                f"array {array!r} has per-sample shape {got} but input {spec['name']!r} is {dims}", array
            )
        if isinstance(d, str):
            seen = axes.setdefault(d, (g, array))
            if seen[0] != g:
                raise DatasetError(
                    f"array {array!r} has {g} on axis {axis} ({d!r}) but {seen[1]!r} has {seen[0]}", array
                )
