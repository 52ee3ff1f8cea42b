"""Child process: is the upload a TorchScript model the engine can work on?

Loads it, runs one forward pass on the declared input shape and captures its graph, then prints
one JSON line: `{"ok": true, "parameters", "output_shapes", "layers"}` or `{"ok": false, "stage",
"error"}`. Run as `python -m job_process.validate_model MODEL SHAPE DTYPE`.
"""

from __future__ import annotations

import json
import sys

from job_process.errors import describe
from job_process.sandbox import limit_self


def example_input(shape: list[int], dtype: str):
    import torch

    torch_dtype = getattr(torch, dtype)
    if torch_dtype.is_floating_point:
        return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(torch_dtype)
    return torch.zeros(*shape, dtype=torch_dtype)


def _shapes(out) -> list[list[int]]:
    if hasattr(out, "shape"):
        return [list(out.shape)]
    if isinstance(out, (tuple, list)):
        return [s for o in out for s in _shapes(o)]
    return []


def validate(path: str, shape: list[int], dtype: str) -> dict:
    import torch

    from amct_engine.graph.analysis import DISTILL_TYPES, RETRAIN_TYPES, quantizable_layers
    from amct_engine.graph.capture import capture_model

    stage = "load"
    try:
        model = torch.jit.load(path, map_location="cpu")
        model.eval()
        stage = "forward"
        x = example_input(shape, dtype)
        with torch.no_grad():
            out = model(x)
        stage = "capture"
        cm = capture_model(path, x)
    except Exception as e:  # any failure is the upload's; what a user reads of it: job_process/errors.py
        return {"ok": False, "stage": stage, "error": describe(e, stage)}
    layers = {
        "quantizable": [{"name": i.name, "type": i.type_name} for i in quantizable_layers(cm, RETRAIN_TYPES)],
        "distillable": [i.name for i in quantizable_layers(cm, DISTILL_TYPES)],
    }
    return {"ok": True, "parameters": sum(p.numel() for p in model.parameters()),
            "output_shapes": _shapes(out), "layers": layers}


def main(argv: list[str]) -> int:
    limit_self()
    path, shape, dtype = argv[0], [int(d) for d in argv[1].split(",")], argv[2]
    print(json.dumps(validate(path, shape, dtype)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
