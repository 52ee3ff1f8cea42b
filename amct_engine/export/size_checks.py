"""Every ONNX file we write runs at every size its dynamic axes allow (docs/spec/engine.md §5.2).

Before a file is written, `check_file_sizes` runs it in onnxruntime at two other sizes of each axis it
declares dynamic (the `dim_param` of its inputs) and compares it there with the PyTorch model it was
written from (graph/size_probe.py). The sizes checked go into the file itself, as the metadata entry
`amct.size_checks` (`read_size_checks`), so a report or a user can see what a file was checked at.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import torch

from amct_engine.graph.size_probe import axis_groups, probe_dynamic_axes, torch_runner

SIZE_CHECKS_KEY = "amct.size_checks"


def declared_axes(model: onnx.ModelProto) -> list[dict[int, str]]:
    """Per graph input, in order: axis -> the name of each dynamic (`dim_param`) dimension."""
    axes = []
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        axes.append({i: d.dim_param for i, d in enumerate(dims) if d.dim_param})
    return axes


def session_runner(session: ort.InferenceSession) -> Callable[[tuple[torch.Tensor, ...]], list[np.ndarray]]:
    names = [i.name for i in session.get_inputs()]

    def run(inputs: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
        feeds = {n: t.detach().cpu().numpy() for n, t in zip(names, inputs, strict=False)}
        return session.run(None, feeds)

    return run


def check_file_sizes(
    model: onnx.ModelProto,
    session: ort.InferenceSession,
    example: Sequence[torch.Tensor],
    reference: torch.nn.Module,
    what: str,
) -> dict:
    """Run `session` (of `model`) against `reference` at two other sizes of each dynamic axis; returns what
    `record_size_checks` stores. Raises graph.size_probe.DynamicAxisError naming the axis that fails."""
    input_names = [i.name for i in model.graph.input]
    axes = declared_axes(model)
    groups = axis_groups(tuple(example), axes)
    checked = (
        probe_dynamic_axes(torch_runner(reference), session_runner(session), example, groups, input_names, what)
        if groups
        else {}
    )
    return {
        "inputs": [
            {"name": name, "dynamic_axes": {str(a): n for a, n in named.items()}}
            for name, named in zip(input_names, axes, strict=True)
        ],
        "example_sizes": {g.name: g.size for g in groups},
        "checked_sizes": checked,
    }


def record_size_checks(model: onnx.ModelProto, checks: dict) -> None:
    """Store `checks` in the file's metadata (replacing an earlier entry)."""
    kept = [p for p in model.metadata_props if p.key != SIZE_CHECKS_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=SIZE_CHECKS_KEY, value=json.dumps(checks, sort_keys=True))


def read_size_checks(model: str | onnx.ModelProto) -> dict | None:
    """What `record_size_checks` stored in a file, or None (a file from elsewhere, or an older one)."""
    if isinstance(model, str):
        model = onnx.load(model, load_external_data=False)
    entry = next((p.value for p in model.metadata_props if p.key == SIZE_CHECKS_KEY), None)
    return json.loads(entry) if entry else None
