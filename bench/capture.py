"""How long graph capture takes on a ResNet-50-sized model, against AMCT's way (ONNX export + load).

"Ours" is AMCT's first call, ``create_quant_retrain_config``: capture the model into the FX IR and
write the config of every quantisable layer. AMCT itself starts from ONNX: ``torch.onnx.export`` then
``onnx.load`` (the TorchScript exporter, and the dynamo exporter for an nn.Module). Both sources are
timed: the nn.Module, and a traced TorchScript file (ours reads the file; the ONNX route exports the
loaded ScriptModule).

Run: ``.venv/bin/python bench/capture.py [--repeats 3]``; prints JSON (seconds min / median / max).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import amct_engine as amct  # noqa: E402
from amct_engine.graph.analysis import quantizable_layers  # noqa: E402
from amct_engine.graph.capture import capture_model  # noqa: E402
from amct_engine.graph.distill_groups import distill_groups  # noqa: E402
from bench.common import error_summary, ratios, time_repeats  # noqa: E402
from bench.resnets import ResNet50  # noqa: E402


def onnx_export_and_load(model: nn.Module, x: torch.Tensor, dynamo: bool) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            program = torch.onnx.export(model, (x,), dynamo=True, verbose=False)
            program.save(buffer)
        else:
            torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17)
    return onnx.load_from_string(buffer.getvalue())


def ours(model: nn.Module | Path, x: torch.Tensor, folder: Path) -> None:
    """AMCT's first call: capture the model and write the retrain config (every quantisable layer)."""
    amct.create_quant_retrain_config(
        str(folder / "retrain.json"), model if isinstance(model, nn.Module) else str(model), x
    )


def run(quick: bool = False, repeats: int | None = None) -> dict[str, Any]:
    """Seconds (min / median / max over ``repeats``) per route; ratios ours / ONNX route of the same source."""
    repeats = repeats or (1 if quick else 3)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed" per export
    torch.manual_seed(0)
    model = ResNet50().eval()
    x = torch.randn(1, 3, 224, 224)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ts_path = folder / "resnet50_traced.pt"
        torch.jit.save(torch.jit.trace(model, (x,)), str(ts_path))
        ours(ts_path, x, folder)  # warm-up: first calls import the converters
        same = distill_groups(capture_model(ts_path, x)) == distill_groups(capture_model(model, x))
        routes = {
            "nn.Module": {
                "ours": lambda: ours(model, x, folder),
                "torch.onnx.export(dynamo=False) + onnx.load": lambda: onnx_export_and_load(model, x, False),
                "torch.onnx.export(dynamo=True) + onnx.load": lambda: onnx_export_and_load(model, x, True),
            },
            "TorchScript file": {
                "ours": lambda: ours(ts_path, x, folder),
                # the file is loaded inside the timing, as ours reads it
                "torch.jit.load + torch.onnx.export(dynamo=False) + onnx.load": lambda: onnx_export_and_load(
                    torch.jit.load(str(ts_path)), x, False
                ),
            },
        }
        results: dict[str, Any] = {}
        for source, entries in routes.items():
            results[source] = {}
            for label, fn in entries.items():
                print(f"[capture] {source}: {label} …", file=sys.stderr, flush=True)
                try:
                    results[source][label] = {"status": "ok", "s": time_repeats(fn, repeats, warmup=0)}
                except Exception as exc:  # the dynamo exporter is optional: report, do not stop
                    results[source][label] = {"status": "failed", "reason": error_summary(exc)}
            base = results[source]["ours"]
            for entry in results[source].values():
                if entry["status"] == "ok" and base["status"] == "ok":
                    entry["ratio_vs_ours"] = ratios(entry["s"], base["s"])
    return {
        "model": f"ResNet-50 layout, {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters",
        "quantizable_layers": len(quantizable_layers(capture_model(model, x))),
        "same_groups_from_torchscript": same,
        "repeats": repeats,
        "routes": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(run(repeats=args.repeats), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
