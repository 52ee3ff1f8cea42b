"""The report's figures at other sizes (docs/spec/engine.md §1.8, §5.2).

The held-out rows of a job all have the dataset's sizes, so its agreement figures alone cannot show a
file that only runs at those sizes. `shapes` says what each file declares dynamic and the sizes the
engine checked it at (its `amct.size_checks` metadata); `other_sizes` evaluates every file again at a
second batch (one row at a time) and at two other sizes of every other dynamic axis (the held-out rows cut
or cycled along it), each file against the FP32 file at the same size. A file that fails there fails the
job, naming the axis.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch

from amct_engine.export.formats import DEFAULT_DEPLOY_FORMAT
from amct_engine.export.size_checks import declared_axes, read_size_checks
from amct_engine.graph.size_probe import AxisGroup, DynamicAxisError, axis_groups, candidate_sizes, resized

BATCH_ROWS, OTHER_AXIS_ROWS = 16, 64  # held-out rows evaluated at each other size


def shapes(onnx_files: dict[str, str]) -> dict:
    return {name: checks for name, path in onnx_files.items() if (checks := read_size_checks(path))}


def _groups(fp32_path: str, x: tuple[np.ndarray, ...], input_names: list[str] | None) -> list[AxisGroup]:
    """The FP32 file's dynamic axes over the signature's inputs (the file may have dropped an unread one)."""
    model = onnx.load(fp32_path, load_external_data=False)
    by_name = dict(zip([i.name for i in model.graph.input], declared_axes(model), strict=True))
    names = input_names or [i.name for i in model.graph.input]
    named = [by_name.get(name, {}) for name in names[: len(x)]]
    return axis_groups(tuple(torch.from_numpy(a) for a in x), named)


def token_axes(fp32_path: str, x: tuple[np.ndarray, ...], input_names: list[str] | None) -> list[AxisGroup]:
    """The dynamic axes other than the batch whose inputs are all `[batch, length]` integers: a sequence of
    token ids (and its mask), which the report times at a second length too (report.py `SEQUENCE_LENGTH`)."""
    return [
        group
        for group in _groups(fp32_path, x, input_names)
        if not group.is_batch
        and all(x[index].ndim == 2 and np.issubdtype(x[index].dtype, np.integer) for index, _ in group.members)
    ]


def at_size(x: tuple[np.ndarray, ...], group: AxisGroup, size: int) -> tuple[np.ndarray, ...]:
    """The rows with `group`'s axes cut or cycled to `size` (graph/size_probe.py `resized`)."""
    return tuple(np.ascontiguousarray(t.numpy()) for t in resized(tuple(torch.from_numpy(a) for a in x), group, size))


def other_sizes(
    onnx_files: dict[str, str],
    x: tuple[np.ndarray, ...],
    formats: dict[str, str],
    input_names: list[str] | None,
    predict,
    agreement,
) -> list[dict]:
    """One row per (axis, size): the rows evaluated and each non-FP32 file's agreement with the FP32 file
    on the first output. `predict(path, x, format, batch=, input_names=)` and `agreement(ref, other)` are
    the report's own."""
    rows = []
    for group in _groups(onnx_files["fp32"], x, input_names):
        if group.is_batch:
            plan = [(1, tuple(a[:BATCH_ROWS] for a in x))]
        else:
            cut = tuple(torch.from_numpy(a[:OTHER_AXIS_ROWS]) for a in x)
            plan = [(size, tuple(t.numpy() for t in resized(cut, group, size))) for size in candidate_sizes(group)[:2]]
        for size, inputs in plan:
            batch = 1 if group.is_batch else 256
            try:
                reference = predict(
                    onnx_files["fp32"], inputs, DEFAULT_DEPLOY_FORMAT, batch=batch, input_names=input_names
                )
            except Exception:  # the model itself does not take this size (its export check skipped it too)
                continue
            row = {"axis": group.name, "size": size, "samples": int(len(inputs[0]))}
            for name, path in onnx_files.items():
                if name == "fp32":
                    continue
                try:
                    out = predict(path, inputs, formats[name], batch=batch, input_names=input_names)
                except Exception as exc:
                    raise DynamicAxisError(
                        f"the {name} model fails at size {size} of dynamic axis "
                        f"'{group.name}' in the report's evaluation: {exc}"
                    ) from exc
                row[name] = agreement(reference[0], out[0])
            rows.append(row)
    return rows
