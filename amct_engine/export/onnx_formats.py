"""The ONNX files a quantised model is saved as: one `OnnxFormat` object per kind of file.

`save_quantized_onnx` writes the fake-quant model with `FAKE_QUANT` and the deploy model with the
object the `deploy_format` names in `amct_engine.export.formats.DEPLOY_FORMATS` (`ONNX_DEPLOY`,
`ASCEND_DEPLOY`); it never asks which format it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import onnx

from amct_engine.export.ascend import ASCEND_DOMAIN, ascend_to_standard_onnx, finalize_ascend_model
from amct_engine.export.backends import AscendDeployBackend, FakeQuantBackend, QdqDeployBackend
from amct_engine.export.qdq.finalize import finalize_qdq_deploy
from amct_engine.export.quant_layer import LayerWriter


def _as_written(model: onnx.ModelProto) -> onnx.ModelProto:
    return model


@dataclass(frozen=True)
class OnnxFormat:
    """How one kind of ONNX file is written, finished and checked.

    - `layer_writer`: emits each quantised layer into the traced graph (export.layer_graph);
    - `finalize_with_inputs`: like `finalize`, also given the example input feeds (name -> array)
      and the resolved deploy target (export/qdq/calibration.py calibrates the quantisers it adds);
    - `custom_opsets`: domain -> version for custom ops the writer emits (the file's opset imports);
    - `finalize`: applied to the written file (None: kept as the exporter wrote it);
    - `to_reference_onnx`: a standard-ONNX model computing the same, which `check_onnx` runs in
      onnxruntime (the identity for a standard-ONNX format);
    - `stores_for_target`: its weight codes are stored as the deploy target's kernels take them
      (export.deploy_target: signedness, 7-bit codes on AVX2); else the record's codes as they are.
    """

    name: str
    layer_writer: LayerWriter
    finalize_with_inputs: Callable[..., onnx.ModelProto] | None = None
    custom_opsets: Mapping[str, int] = field(default_factory=dict)
    finalize: Callable[[onnx.ModelProto], onnx.ModelProto] | None = None
    to_reference_onnx: Callable[[onnx.ModelProto], onnx.ModelProto] = _as_written
    stores_for_target: bool = False

    @property
    def rewritten_for_reference(self) -> bool:
        """True when onnxruntime runs this format only through `to_reference_onnx` (timings say so)."""
        return self.to_reference_onnx is not _as_written


# The float graph with QuantizeLinear/DequantizeLinear that matches the PyTorch QAT model.
FAKE_QUANT = OnnxFormat("fake_quant", FakeQuantBackend)

# QDQ graph onnxruntime fuses into QLinearConv/QGemm/QLinearAdd/... end to end (export/qdq/).
ONNX_DEPLOY = OnnxFormat("onnx", QdqDeployBackend, finalize_with_inputs=finalize_qdq_deploy, stores_for_target=True)

# docs/spec/engine.md §5: AMCT's layout for ATC; onnxruntime checks it through the reference rewrite.
ASCEND_DEPLOY = OnnxFormat(
    "ascend",
    AscendDeployBackend,
    custom_opsets={ASCEND_DOMAIN: 1},
    finalize=finalize_ascend_model,
    to_reference_onnx=ascend_to_standard_onnx,
)
