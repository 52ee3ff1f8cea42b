"""The activation-calibrator table (amct_engine/quant/calibrators.py): a throw-away min-max calibrator,
registered with one entry and its observer, is named in the PTQ JSON, calibrates its layer and is written to
the deploy model (docs/architecture.md, "Add an activation calibrator")."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

import amct_engine as amct
from amct_engine.quant.calibrators import CALIBRATORS, CalibratorEntry, register_calibrator
from amct_engine.quant.ifmr import IfmrResult
from amct_engine.quant.primitives import quant_range
from tests.models import ConvBnReluNet, example_input


class MinMaxObserver(nn.Module):
    """The range of the first `batch_num` batches, 0 included; offset for asymmetric ranges."""

    def __init__(self, bits: int, batch_num: int, asymmetric: bool) -> None:
        super().__init__()
        self.bits, self.batch_num, self.asymmetric = bits, batch_num, asymmetric
        self.low, self.high, self.seen, self.result = 0.0, 0.0, 0, None

    @classmethod
    def from_spec(cls, spec, batch_num, asymmetric):
        return cls(spec.act_bits, batch_num, asymmetric)

    def forward(self, x: torch.Tensor) -> bool:
        if self.result is None:
            self.low, self.high = min(self.low, float(x.min())), max(self.high, float(x.max()))
            self.seen += 1
            if self.seen >= self.batch_num:
                qn, qp = quant_range(self.bits)
                scale = (self.high - self.low) / (qp - qn) if self.asymmetric else max(-self.low, self.high) / qp
                offset = round(qn - self.low / scale) if self.asymmetric else 0
                self.result = IfmrResult(
                    torch.tensor(scale),
                    torch.tensor(offset, dtype=torch.int32),
                    torch.tensor(self.high),
                    torch.tensor(self.low),
                )
        return self.result is not None


@pytest.fixture
def minmax():
    register_calibrator(CalibratorEntry("minmax", "minmax_quantize", (), f"{__name__}:MinMaxObserver"))
    yield
    CALIBRATORS.unregister("minmax")


def test_a_registered_calibrator_calibrates_the_layers_the_ptq_json_gives_it(tmp_path, minmax):
    torch.manual_seed(0)
    model = ConvBnReluNet().eval()
    x = example_input(ConvBnReluNet, batch=32)
    config, fused, record = tmp_path / "ptq.json", str(tmp_path / "fused.onnx"), str(tmp_path / "r.txt")
    amct.create_quant_config(str(config), model, x)
    data = json.loads(config.read_text())
    data["conv2"]["activation_quant_params"] = {"act_algo": "minmax_quantize", "num_bits": 8}
    config.write_text(json.dumps(data))

    calibration = amct.quantize_model(str(config), fused, record, model, x)
    assert type(calibration.get_submodule("conv2").act_quant.observer).__name__ == "MinMaxObserver"
    assert type(calibration.get_submodule("conv1").act_quant.observer).__name__ == "IfmrObserver"
    with torch.no_grad():
        calibration(x)
    observer = calibration.get_submodule("conv2").act_quant.observer
    scale = float(calibration.get_submodule("conv2").act_quant.scale_offset()[0])
    assert scale == pytest.approx((observer.high - observer.low) / 255, rel=1e-6)

    paths = amct.save_model(fused, record, str(tmp_path / "ptq"))
    session = ort.InferenceSession(paths["deploy"], providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        want = model(x).numpy()
    assert float(np.linalg.norm(got - want) / np.linalg.norm(want)) <= 0.05


def test_an_unknown_calibrator_in_the_ptq_json_names_the_known_ones(tmp_path):
    model = ConvBnReluNet().eval()
    x = example_input(ConvBnReluNet)
    config = tmp_path / "ptq.json"
    amct.create_quant_config(str(config), model, x)
    data = json.loads(config.read_text())
    data["conv2"]["activation_quant_params"]["act_algo"] = "minmax_quantize"
    config.write_text(json.dumps(data))
    with pytest.raises(
        ValueError,
        match=r"conv2.activation_quant_params.act_algo: must be one of ifmr_quantize, "
        r"hfmg_quantize",
    ):
        amct.quantize_model(str(config), str(tmp_path / "f.onnx"), str(tmp_path / "r.txt"), model, x)
