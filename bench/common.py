"""Measurement helpers shared by the benchmark scripts: wall-time stats, ORT latency, file sizes."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """``{min, median, max}`` of a non-empty list of timings (seconds)."""
    if not samples:
        raise ValueError("no samples to summarise")
    return {"min": min(samples), "median": statistics.median(samples), "max": max(samples)}


def time_repeats(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> dict[str, float]:
    """Wall time of ``fn()`` over ``repeats`` calls after ``warmup`` untimed ones: ``{min, median, max}``."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return summarize(samples)


class StepTimer:
    """A ``progress`` callback for ``train_epochs`` that records the wall time of every step.

    Call ``start()`` right before training; each callback closes one step. The time includes
    fetching the batch, so loaders must be alike when step times are compared.
    """

    def __init__(self) -> None:
        self.durations: list[float] = []
        self._last: float | None = None

    def start(self) -> None:
        self._last = time.perf_counter()

    def __call__(self, info: Mapping[str, Any]) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.durations.append(now - self._last)
        self._last = now

    @property
    def median(self) -> float:
        return summarize(self.durations)["median"]


_ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def _input_shape(name: str, shape: Sequence[Any], batch: int, path: str) -> list[int]:
    if not shape:
        return []
    first = shape[0]
    if isinstance(first, int) and first != batch:
        raise ValueError(f"{path}: input {name!r} has a fixed batch of {first}, cannot run batch {batch}")
    rest = list(shape[1:])
    if not all(isinstance(d, int) for d in rest):
        raise ValueError(
            f"{path}: input {name!r} has symbolic non-batch dims {rest}; "
            f"pass input_shapes={{{name!r}: [...]}}"
        )
    return [batch, *rest]


def ort_latency(
    path: str | os.PathLike,
    batch: int,
    repeats: int = 50,
    warmup: int = 5,
    threads: int | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, float]:
    """Latency (seconds per run) of an ONNX model in ONNX Runtime on CPU: ``{min, median, max}``.

    Inputs are random with the model's dtypes; the first dim of each input is ``batch`` and the other
    dims must be static unless given in ``input_shapes``. ``threads`` sets ORT's intra-op threads.
    """
    import onnxruntime as ort

    path = os.fspath(path)
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for inp in session.get_inputs():
        dtype = _ORT_DTYPES.get(inp.type)
        if dtype is None:
            raise ValueError(f"{path}: input {inp.name!r} has unsupported type {inp.type}")
        if input_shapes and inp.name in input_shapes:
            shape = list(input_shapes[inp.name])
        else:
            shape = _input_shape(inp.name, inp.shape, batch, path)
        if np.issubdtype(dtype, np.floating):
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[inp.name] = np.zeros(shape, dtype=dtype)
    return time_repeats(lambda: session.run(None, feeds), repeats=repeats, warmup=warmup)


def file_size(path: str | os.PathLike) -> int:
    """Size in bytes of a file, or of all files under a folder (e.g. ONNX + external data)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return sum(
            os.path.getsize(os.path.join(folder, name))
            for folder, _, names in os.walk(path)
            for name in names
        )
    return os.path.getsize(path)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A plain fixed-width text table; floats are shown with 4 decimals."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4f}"
        return "-" if value is None else str(value)

    body = [[cell(row.get(col)) for col in columns] for row in rows]
    widths = [max(len(col), *(len(r[i]) for r in body)) for i, col in enumerate(columns)]
    lines = ["  ".join(col.ljust(w) for col, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines)


def package_versions(*packages: str) -> dict[str, str]:
    """Installed versions of the named distributions ("absent" when missing), for bench reports."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in packages:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "absent"
    return found
