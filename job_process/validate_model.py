"""Child process: is the upload a TorchScript model the engine can work on?

Loads it, runs one forward pass on example tensors made from its signature (job_host/signature.py)
and captures its graph, then prints one JSON line: `{"ok": true, "parameters", "outputs",
"output_shapes", "layers"}` (`outputs`: the output structure) or `{"ok": false, "stage", "error"}`.
Run as `python -m job_process.validate_model MODEL SIGNATURE_JSON BATCH`.
"""

from __future__ import annotations

import json
import sys

from job_host.errors import describe
from job_host.sandbox import limit_self
from job_host.signature import SignatureError, example_inputs, output_leaves, output_structure


def validate(path: str, inputs: list[dict], batch: int) -> dict:
    import torch

    from amct_engine.graph.analysis import quantizable_layers
    from amct_engine.graph.capture import capture_model
    from amct_engine.layer_table import distill_type_names, retrain_type_names

    stage = "load"
    try:
        model = torch.jit.load(path, map_location="cpu")
        model.eval()
        stage = "forward"
        outputs = output_structure(model, inputs, batch)
        stage = "capture"
        x = example_inputs(inputs, batch)
        cm = capture_model(path, x)
        _check_dynamic_axes(model, cm.module, x, inputs)
    except SignatureError as e:  # our own words about the outputs' types
        return {"ok": False, "stage": "outputs", "error": str(e)}
    except Exception as e:  # any failure is the upload's; what a user reads of it: job_host/errors.py
        # the path is the sandbox's copy of the upload: the user knows it as their model file
        names = {f"TorchScript file {path}": "the model file", str(path): "the model file"}
        return {"ok": False, "stage": stage, "error": describe(e, stage, names)}
    layers = {
        "quantizable": [{"name": i.name, "type": i.type_name} for i in quantizable_layers(cm, retrain_type_names())],
        "distillable": [i.name for i in quantizable_layers(cm, distill_type_names())],
    }
    return {
        "ok": True,
        "parameters": sum(p.numel() for p in model.parameters()),
        "outputs": outputs,
        "output_shapes": [leaf["shape"] for _, leaf in output_leaves(outputs)],
        "layers": layers,
    }


def _check_dynamic_axes(model, captured, x: tuple, inputs: list[dict]) -> None:
    """The captured graph runs, and computes what the model computes, at two other sizes of every axis the
    signature names (docs/spec/engine.md §1.8); DynamicAxisError names the axis that does not."""
    from amct_engine.graph.size_probe import axis_groups, probe_dynamic_axes, torch_runner

    named = [{axis: d for axis, d in enumerate(spec["shape"]) if isinstance(d, str)} for spec in inputs]
    groups = axis_groups(x, named)
    if groups:
        probe_dynamic_axes(
            torch_runner(model), torch_runner(captured), x, groups, [s["name"] for s in inputs], "the signature"
        )


def main(argv: list[str]) -> int:
    limit_self()
    path, inputs, batch = argv[0], json.loads(argv[1]), int(argv[2])
    print(json.dumps(validate(path, inputs, batch)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
