"""Post-training quantisation on the Fashion-MNIST CNN: ours (AMCT's API) against ORT's static PTQ and NNCF.

Rows (accuracy; one run each, in the engine table too):

- ``ORT static PTQ``: ``onnxruntime.quantization``'s documented flow on the FP32 row's model exported to
  ONNX: ``quant_pre_process`` (shape inference + graph optimisation), then ``quantize_static`` with QDQ
  format, per-channel INT8 weights and INT8 activations, MinMax calibration; the Torch-Pruning rows reuse
  ``quantize`` for their "+ ORT PTQ" variant;
- ours (``amct_engine.ptq``: IFMR or HFMG activations, ARQ weights, BN folded): ``create_quant_config`` ->
  ``quantize_model`` -> the calibration batches -> ``save_model``;
- ``nncf.quantize`` (PyTorch backend, NNCF's defaults), exported with ``torch.onnx.export``.

Every method calibrates on the first ``CALIBRATION_IMAGES`` training images in batches of
``CALIBRATION_BATCH`` (ORT's calibration reader hands out the same batches).

PTQ wall time (``time_flows``), what is compared: the user-visible calls, from the FP32 PyTorch model
in memory and the calibration images in memory to the INT8 ONNX file on disk, nothing left out:

- ours: the four AMCT calls, which write three ONNX files (the BN-folded float model AMCT's
  ``quantize_model`` writes, the fake-quant model and the deploy model) and check the two quantised
  ones with ``onnx.checker`` and one onnxruntime run each;
- ORT (``ORT_FROM_TORCH``): ``torch.onnx.export`` of the FP32 model (the TorchScript exporter, as our
  export uses; torch's default dynamo exporter takes seconds more), ``quant_pre_process`` and
  ``quantize_static``, the calibration reader and the files they write included;
  ``ORT_FROM_FILE`` is the same without the FP32 export (a user who already has the ONNX file);
- NNCF: ``nncf.quantize`` and ``torch.onnx.export`` of its model.

Imports, the first call of each flow (lazy imports, NNCF building its C++ extension) are one untimed
warm-up round; then ``rounds`` rounds, each running every flow once in a rotated order, so load on a
shared machine hits every flow alike. The ratio printed is ours / ORT's, min to min and median to
median, measured in the same run. Threads: torch's intra-op threads are ``--threads``; onnxruntime's
sessions inside ``quantize_static`` take onnxruntime's default (one per core). On a machine busier than
its cores, OpenMP's spin-waiting (``OMP_WAIT_POLICY``, active by default in torch's libgomp) makes every
multi-threaded torch op wait for a second core: the header prints the policy and the load average.

Mixed precision (``mixed_precision_points``): ``auto_mixed_precision`` at several top-1 budgets,
the deploy ONNX bytes against its test top-1 (docs/spec/engine.md §4.12), beside FP32, all-INT8 and
ORT's model; ``--plot`` draws them.

``make bench`` runs it as its ``ptq`` section (``run``: ``OMP_NUM_THREADS=1``, two torch threads; bench/report.py
renders the tables and the plot). Run on its own: ``python bench/ptq.py [--quick] [--threads N] [--rounds N]
[--plot PNG] [--json FILE]``, or its rows in the engine table ``python bench/engine_table.py --quick --only ptq``.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import file_size, isa_flags, ort_accuracy, summarize  # noqa: E402
from bench.fashion import export_fp32  # noqa: E402
from bench.ort_ptq import CALIBRATION_BATCH, quantize  # noqa: E402

CALIBRATION_IMAGES = 512
NAME = "ORT static PTQ (QDQ, per-channel)"
OURS = {"ifmr": "amct PTQ (IFMR, INT8)", "hfmg": "amct PTQ (HFMG, INT8)"}
NNCF_NAME = "NNCF PTQ (nncf.quantize)"
ORT_FROM_TORCH = "ORT: torch.onnx.export + quant_pre_process + quantize_static"
ORT_FROM_FILE = "ORT: quant_pre_process + quantize_static (FP32 ONNX file given)"
BUDGETS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0)  # top-1 points, for the mixed-precision curve


def _calibration_batches(setup) -> list:
    images = setup.x_train[:CALIBRATION_IMAGES]
    return [images[i : i + CALIBRATION_BATCH] for i in range(0, len(images), CALIBRATION_BATCH)]


# --------------------------------------------------------------------------- the flows (model -> INT8 ONNX file)


def ort_flow(setup, folder: Path, fp32_onnx: str | None = None) -> str:
    """FP32 export (unless ``fp32_onnx`` is given) + quant_pre_process + quantize_static: the INT8 file."""
    if fp32_onnx is None:
        fp32_onnx = export_fp32(setup.fp32_model, folder / "fp32.onnx", setup.example)
    return quantize(fp32_onnx, setup.x_train[:CALIBRATION_IMAGES].numpy(), folder / "ptq.onnx")["onnx"]


def amct_flow(setup, folder: Path, algo: str, fp32_model=None) -> str:
    """create_quant_config -> quantize_model -> batches -> save_model: the deploy file of ``fp32_model`` (the FP32
    row's model unless given)."""
    import torch

    import amct_engine as amct
    from bench.fashion import DYNAMIC_AXES, IO_NAMES

    fp32_model = setup.fp32_model if fp32_model is None else fp32_model
    batches = _calibration_batches(setup)
    cfg = folder / "ptq.cfg"
    cfg.write_text(f"batch_num: {len(batches)}\ncommon_config {{ {algo}_quantize {{}} }}\n")
    amct.create_quant_config(str(folder / "ptq.json"), fp32_model, setup.example, config_defination=str(cfg))
    model = amct.quantize_model(
        str(folder / "ptq.json"),
        str(folder / "fused.onnx"),
        str(folder / "record.txt"),
        fp32_model,
        setup.example,
        dynamic_axes=DYNAMIC_AXES,
        **IO_NAMES,
    )
    with torch.no_grad():
        for batch in batches:
            model(batch)
    return amct.save_model(str(folder / "fused.onnx"), str(folder / "record.txt"), str(folder / "ptq"))["deploy"]


def nncf_flow(setup, folder: Path) -> str:
    """nncf.quantize (PyTorch backend) on the same batches, ``nncf.strip`` to torch's own quantise ops (NNCF's
    FakeQuantize does not run in onnxruntime), exported to QDQ ONNX as bench/peers.py does; ImportError
    without NNCF."""
    import warnings

    # NNCF builds a C++ extension on its first use in a machine's life (minutes on 2 busy cores); its
    # default 60 s limit on that build would fail the row rather than measure anything.
    os.environ.setdefault("NNCF_EXTENSION_LOAD_TIMEOUT", "1800")
    import nncf
    import torch

    from bench.fashion import DYNAMIC_AXES, IO_NAMES

    batches = _calibration_batches(setup)
    with contextlib.redirect_stdout(io.StringIO()):  # NNCF's progress bars: stdout is for results
        quantized = nncf.quantize(
            copy.deepcopy(setup.fp32_model).eval(), nncf.Dataset(batches), subset_size=len(batches)
        )
    stripped = nncf.strip(
        quantized, do_copy=False, strip_format=nncf.StripFormat.NATIVE, example_input=setup.example[:1]
    )
    path = folder / "nncf_ptq.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            stripped, (setup.example,), str(path), dynamo=False, opset_version=17, dynamic_axes=DYNAMIC_AXES, **IO_NAMES
        )
    return str(path)


# --------------------------------------------------------------------------- accuracy rows


def _row(setup, name: str, flow: Callable[[Path], str], deploy_kind: str) -> dict[str, Any]:
    if setup.fp32_model is None:
        raise RuntimeError("the FP32 row did not run: nothing to quantise")
    start = time.perf_counter()
    path = flow(setup.folder(name))
    return {
        "onnx": path,
        "calibrate_s": time.perf_counter() - start,
        "deploy_kind": deploy_kind,
        "torch_accuracy": ort_accuracy(path, setup.x_test, setup.y_test, setup.threads),
        "calibration_images": CALIBRATION_IMAGES,
    }


def ptq_row(setup) -> dict[str, Any]:
    """The PTQ row: quantise the FP32 row's model (trained like every other method) with training images."""
    return _row(setup, NAME, lambda folder: ort_flow(setup, folder), "QDQ ONNX (quantize_static)")


def amct_ptq_row(setup, algo: str) -> dict[str, Any]:
    return _row(setup, OURS[algo], lambda folder: amct_flow(setup, folder, algo), "integer ONNX (save_model)")


def nncf_ptq_row(setup) -> dict[str, Any]:
    return _row(setup, NNCF_NAME, lambda folder: nncf_flow(setup, folder), "QDQ ONNX (nncf.quantize)")


def methods(setup) -> list[tuple[str, str, Callable[[], dict[str, Any]]]]:
    return [
        (NAME, "peer", lambda: ptq_row(setup)),
        (OURS["ifmr"], "ours", lambda: amct_ptq_row(setup, "ifmr")),
        (OURS["hfmg"], "ours", lambda: amct_ptq_row(setup, "hfmg")),
        (NNCF_NAME, "peer", lambda: nncf_ptq_row(setup)),
    ]


# --------------------------------------------------------------------------- wall time, interleaved


def timing_flows(setup, fp32_onnx: str) -> dict[str, Callable[[Path], str]]:
    return {
        OURS["ifmr"]: lambda folder: amct_flow(setup, folder, "ifmr"),
        OURS["hfmg"]: lambda folder: amct_flow(setup, folder, "hfmg"),
        ORT_FROM_TORCH: lambda folder: ort_flow(setup, folder),
        ORT_FROM_FILE: lambda folder: ort_flow(setup, folder, fp32_onnx),
        NNCF_NAME: lambda folder: nncf_flow(setup, folder),
    }


def time_flows(setup, rounds: int) -> dict[str, dict[str, Any]]:
    """``{flow: {min, median, max, runs}}`` (or ``{unavailable}``): one untimed warm-up, then ``rounds``
    rounds of every flow in a rotated order."""
    from bench.common import error_summary

    fp32_onnx = export_fp32(setup.fp32_model, setup.folder("timing") / "fp32.onnx", setup.example)
    flows, out = timing_flows(setup, fp32_onnx), {}
    for name, flow in list(flows.items()):
        try:
            flow(setup.folder(f"warm-up {name}"))
        except Exception as exc:  # NNCF missing or broken: the other flows still time
            out[name] = {"unavailable": error_summary(exc)}
            del flows[name]
    samples: dict[str, list[float]] = {name: [] for name in flows}
    order = list(flows)
    for r in range(rounds):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            folder = setup.folder(f"round {r} {name}")
            start = time.perf_counter()
            flows[name](folder)
            samples[name].append(time.perf_counter() - start)
    out.update({name: {**summarize(runs), "runs": runs} for name, runs in samples.items()})
    return out


def ratios(timing: dict[str, dict[str, Any]], ours: str, peer: str) -> dict[str, float] | None:
    """ours / peer, min to min and median to median."""
    a, b = timing.get(ours, {}), timing.get(peer, {})
    if "min" not in a or "min" not in b:
        return None
    return {"min": a["min"] / b["min"], "median": a["median"] / b["median"]}


# --------------------------------------------------------------------------- mixed precision


def mixed_precision_points(setup, budgets=BUDGETS) -> list[dict[str, Any]]:
    """auto_mixed_precision at each top-1 budget, searched on 2,000 held-out training images."""
    from amct_engine.mixed_precision import Budget, auto_mixed_precision

    held_out = slice(len(setup.x_train) - 2000, len(setup.x_train))
    points = []
    for budget in budgets:
        start = time.perf_counter()
        folder = setup.folder(f"mixed {budget}")
        result = auto_mixed_precision(
            setup.fp32_model,
            setup.example,
            _calibration_batches(setup),
            setup.x_train[held_out],
            setup.y_train[held_out],
            Budget(max_top1_drop=budget),
            folder,
        )
        points.append(
            {
                "budget": budget,
                "precisions": result.precisions,
                "weight_bytes": result.weight_bytes,
                "int8_weight_bytes": result.int8_weight_bytes,
                "file_bytes": result.file_bytes,
                "search_top1_drop": result.deployed.top1_drop,
                "search_s": time.perf_counter() - start,
                "test_accuracy": ort_accuracy(result.files["deploy"], setup.x_test, setup.y_test, setup.threads),
                "int8_test_accuracy": ort_accuracy(
                    str(folder / "int8_deploy_model.onnx"), setup.x_test, setup.y_test, setup.threads
                ),
            }
        )
    return points


# --------------------------------------------------------------------------- the script


def header(threads: int) -> dict[str, Any]:
    """What the times depend on: the CPU's ISA flags, the thread settings and the versions."""
    import platform

    import onnxruntime
    import torch

    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "isa": isa_flags(),
        "torch": torch.__version__,
        "threads": threads,
        "onnxruntime": onnxruntime.__version__,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "(unset)"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
    }


ROW_KEYS = ("name", "family", "status", "reason", "deploy_kind", "calibrate_s")


def accuracy_rows(setup) -> list[dict[str, Any]]:
    """FP32 then every PTQ row, each scored the same way: its ONNX file in onnxruntime on the test set, and its
    bytes (no temporary paths kept)."""
    from bench.fashion import BASELINE, fp32_control, run_row

    rows = [
        run_row(name, family, fn)
        for name, family, fn in [(BASELINE, "baseline", lambda: fp32_control(setup)), *methods(setup)]
    ]
    out = []
    for row in rows:
        scored = {key: row[key] for key in ROW_KEYS if key in row}
        if row["status"] == "ok":
            scored.update(
                accuracy=ort_accuracy(row["onnx"], setup.x_test, setup.y_test, setup.threads),
                bytes=file_size(row["onnx"]),
            )
        out.append(scored)
    return out


def run(quick: bool = False, threads: int = 1, rounds: int | None = None, mixed: bool = True) -> dict[str, Any]:
    """The ``ptq`` section of ``make bench`` (bench/run_all.py), rendered by bench/report.py: the accuracy rows,
    the interleaved wall times with ours / each flow, and the mixed-precision points."""
    import tempfile

    import torch

    from bench.fashion import prepare

    rounds = rounds or (3 if quick else 5)
    torch.set_num_threads(threads)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="amct-ptq-bench-") as tmp:
        setup = prepare(Path(tmp), quick=quick, threads=threads)
        rows = accuracy_rows(setup)
        timing = time_flows(setup, rounds)
        points = mixed_precision_points(setup, BUDGETS[1:4] if quick else BUDGETS) if mixed else []
    return {
        "header": {**header(threads), "load_avg": [load, os.getloadavg()]},
        "setting": setup.describe(),
        "calibration": {"images": CALIBRATION_IMAGES, "batch": CALIBRATION_BATCH},
        "rows": rows,
        "rounds": rounds,
        "timing": timing,
        "ours": OURS["ifmr"],
        "ort_from_torch": ORT_FROM_TORCH,
        "ratios": {flow: ratios(timing, OURS["ifmr"], flow) for flow in timing if flow != OURS["ifmr"]},
        "mixed_precision": points,
    }


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    from bench import report

    parser = argparse.ArgumentParser(description="PTQ rows (ours, ORT static, NNCF), wall time and mixed precision")
    parser.add_argument("--quick", action="store_true", help="a few thousand images, for a smoke run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5; --quick 3)")
    parser.add_argument("--plot", type=Path, default=None, help="draw the mixed-precision points into this PNG")
    parser.add_argument("--no-mixed", action="store_true", help="skip the mixed-precision points")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result = run(args.quick, args.threads, args.rounds, mixed=not args.no_mixed)
    print("\n".join(report.ptq_tables(result)))
    if args.plot is not None and result["mixed_precision"]:
        report.plot_mixed_precision(result, args.plot)
        print(f"plot: {args.plot}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
