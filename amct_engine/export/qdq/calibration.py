"""uint8 parameters for the tensors no quantiser of the model covers, from one run on the example input
(what onnxruntime's own static quantiser does; export/qdq/boundaries.py says which tensors)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

CALIBRATION_MARGIN = 1.25


def calibrate(
    model: onnx.ModelProto,
    names: list[str],
    feeds: dict[str, np.ndarray],
    lower_bounds: dict[str, float] | None = None,
) -> dict[str, tuple]:
    """uint8 (scale, zero point) covering each tensor's range on the example input, 0 included; a tensor with a
    lower bound (its producer's least output, export/qdq/op_roles.py `lower_bound`) starts no lower than it."""
    lower_bounds = lower_bounds or {}
    if not names:
        return {}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(
        helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names if n not in known
    )
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    values = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    found = {}
    for name in names:
        if not np.isfinite(values[name]).all():
            continue  # e.g. an attention mask's -inf: left float
        # A margin over the example's range: the example is a batch or two, other inputs reach further.
        lo, hi = (
            CALIBRATION_MARGIN * min(float(values[name].min()), 0.0),
            CALIBRATION_MARGIN * max(float(values[name].max()), 0.0),
        )
        lo = max(lo, min(lower_bounds.get(name, lo), 0.0))
        scale = (hi - lo) / 255 if hi > lo else 1.0
        found[name] = (np.float32(scale), np.uint8(np.clip(round(-lo / scale), 0, 255)))
    return found
