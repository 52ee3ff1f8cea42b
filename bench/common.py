"""Measurement helpers shared by the benchmark scripts: wall-time stats, ORT sessions, accuracy and
latency (interleaved across models, so machine noise hits every model alike), file sizes, tables."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# The instruction-set flags a CPU's int8 speed depends on, as /proc/cpuinfo names them (every bench report prints
# the ones this machine has).
# Where the BBC News task's trained weights are cached (the MiniLM task model, bench/llama_bbc.py's encoder): what
# tests/test_bbc_task.py's request.config.cache gives, so the tests and the benches train once.
BBC_CACHE = Path(__file__).resolve().parents[1] / ".pytest_cache" / "d" / "bbc_news"
ISA_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


def isa_flags() -> list[str]:
    """The ISA_FLAGS this machine's CPU has."""
    from amct_engine.export.deploy_target import cpu_flags

    flags = cpu_flags()
    return [f for f in ISA_FLAGS if f in flags]


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
    """A ``progress`` callback for ``train_epochs`` that records the wall time and loss of every step.

    Call ``start()`` right before training; each callback closes one step. The time includes
    fetching the batch, so loaders must be alike when step times are compared.
    """

    def __init__(self) -> None:
        self.durations: list[float] = []
        self.losses: list[float] = []
        self._last: float | None = None

    def start(self) -> None:
        self._last = time.perf_counter()

    def __call__(self, info: Mapping[str, Any]) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.durations.append(now - self._last)
        self._last = now
        if info.get("loss") is not None:
            self.losses.append(float(info["loss"]))

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
            f"{path}: input {name!r} has symbolic non-batch dims {rest}; pass input_shapes={{{name!r}: [...]}}"
        )
    return [batch, *rest]


def ort_session(
    path: str | os.PathLike,
    threads: int | None = None,
    optimization: str | None = None,
    profile_prefix: str | None = None,
):
    """An onnxruntime CPU session; ``threads`` sets the intra-op threads (inter-op: 1), ``optimization`` the
    graph optimisation level by name (``"ORT_ENABLE_BASIC"``; default: onnxruntime's, i.e. all),
    ``profile_prefix`` turns on onnxruntime's profiler, writing to files with that prefix."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    if optimization is not None:
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, optimization)
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])


def random_feeds(
    session: Any, batch: int, path: str, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> dict[str, np.ndarray]:
    """Random inputs with the model's dtypes; the first dim of each is ``batch`` (others static or given)."""
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
    return feeds


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
    path = os.fspath(path)
    session = ort_session(path, threads)
    feeds = random_feeds(session, batch, path, input_shapes)
    return time_repeats(lambda: session.run(None, feeds), repeats=repeats, warmup=warmup)


def interleaved_latency(
    paths: Mapping[str, str | os.PathLike],
    batch: int,
    rounds: int = 20,
    per_round: int = 5,
    threads: int | None = None,
    feeds: Mapping[str, Mapping[str, np.ndarray]] | None = None,
) -> dict[str, dict[str, float]]:
    """Per-run latency ``{min, median, max}`` (seconds) of several ONNX models, measured round-robin.

    Each round runs every model ``per_round`` times in turn, so a burst of load on a shared machine
    slows all models of that round alike and ratios between them stay meaningful. ``feeds`` (per
    name) overrides the random inputs.
    """
    sessions = {name: ort_session(path, threads) for name, path in paths.items()}
    inputs = {
        name: (feeds or {}).get(name) or random_feeds(s, batch, os.fspath(paths[name])) for name, s in sessions.items()
    }
    samples: dict[str, list[float]] = {name: [] for name in sessions}
    for name, session in sessions.items():  # warm-up: first runs allocate and pick kernels
        for _ in range(3):
            session.run(None, inputs[name])
    for _ in range(rounds):
        for name, session in sessions.items():
            for _ in range(per_round):
                start = time.perf_counter()
                session.run(None, inputs[name])
                samples[name].append(time.perf_counter() - start)
    return {name: summarize(values) for name, values in samples.items()}


def interleaved_cpu_time(
    paths: Mapping[str, str | os.PathLike],
    batch: int,
    rounds: int = 10,
    per_round: int = 3,
    feeds: Mapping[str, Mapping[str, np.ndarray]] | None = None,
) -> dict[str, dict[str, float]]:
    """CPU time per run ``{min, median, max}`` (seconds) of several ONNX models on one intra-op thread with
    spinning off, measured round-robin: the work a run needs, which a shared machine's load barely moves
    (a busy neighbour delays a run, it does not make it compute more; caches are the residue)."""
    import onnxruntime as ort

    sessions = {}
    for name, path in paths.items():
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[name] = ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])
    inputs = {
        name: (feeds or {}).get(name) or random_feeds(s, batch, os.fspath(paths[name])) for name, s in sessions.items()
    }
    samples: dict[str, list[float]] = {name: [] for name in sessions}
    for name, session in sessions.items():
        session.run(None, inputs[name])
    for _ in range(rounds):
        for name, session in sessions.items():
            for _ in range(per_round):
                start = time.process_time()
                session.run(None, inputs[name])
                samples[name].append(time.process_time() - start)
    return {name: summarize(values) for name, values in samples.items()}


def ort_node_profile(path: str | os.PathLike, batch: int, runs: int = 30, top: int = 6) -> dict[str, Any]:
    """Where onnxruntime spends a run: mean µs per run of the ``top`` costliest nodes of the optimised graph
    (``[{node, op, us}]``, from onnxruntime's own profiler; one thread) and the mean µs of all nodes."""
    import json

    session = ort_session(path, threads=1, profile_prefix=os.path.join(os.path.dirname(os.fspath(path)), "ort_profile"))
    feeds = random_feeds(session, batch, os.fspath(path))
    for _ in range(runs):
        session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    totals: dict[tuple[str, str], float] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            key = (event["name"][: -len("_kernel_time")], event["args"]["op_name"])
            totals[key] = totals.get(key, 0.0) + event["dur"] / runs
    ranked = sorted(totals.items(), key=lambda item: -item[1])
    return {
        "batch": batch,
        "runs": runs,
        "total_us": sum(totals.values()),
        "nodes": [{"node": node, "op": op, "us": us} for (node, op), us in ranked[:top]],
    }


def ratios(num: Mapping[str, float], den: Mapping[str, float]) -> dict[str, float]:
    """``num / den`` of each of ``min, median, max``."""
    return {key: num[key] / den[key] for key in ("min", "median", "max")}


def ort_accuracy(
    path: str | os.PathLike,
    x: Any,
    y: Any,
    threads: int | None = None,
    chunk: int = 1000,
    optimization: str | None = None,
) -> float:
    """Top-1 accuracy of an ONNX classifier with one input in onnxruntime on CPU (x, y: tensors or arrays)."""
    session = ort_session(path, threads, optimization)
    name = session.get_inputs()[0].name
    x, y = np.asarray(x), np.asarray(y)
    logits = np.concatenate([session.run(None, {name: x[i : i + chunk]})[0] for i in range(0, len(x), chunk)])
    return float((logits.argmax(1) == y).mean())


def file_size(path: str | os.PathLike) -> int:
    """Size in bytes of a file, or of all files under a folder (e.g. ONNX + external data)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names)
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


def format_markdown(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A GitHub markdown table of pre-formatted cells (missing cells: "-")."""

    def cell(value: Any) -> str:
        return "-" if value is None else str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row.get(col)) for col in columns) + " |" for row in rows]
    return "\n".join(lines)


def error_summary(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message``, cut to ``limit`` characters, for a "failed: ..." row."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:limit]


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
