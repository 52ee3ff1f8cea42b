"""The weight-quantiser and deploy-format tables: a new entry is all it takes to add one.

Each test registers a throw-away entry (pointing at an object of this module) and removes it again.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import amct_engine as amct
from amct_engine.config.quant_json import RETRAIN, LayerQuantSpec, QuantJsonConfig, WeightQuantSpec
from amct_engine.export.formats import DEPLOY_FORMATS, DeployFormatEntry, register_deploy_format
from amct_engine.export.onnx_formats import ONNX_DEPLOY
from amct_engine.export.onnx_graph import compact_graph
from amct_engine.export.save import save_quantized_onnx
from amct_engine.graph.capture import capture_model
from amct_engine.prune.selective import MaskedWeightQuantizer, SelectiveMask
from amct_engine.quant.arq import ArqWeightQuantizer
from amct_engine.quant.insert import insert_quant_layers
from amct_engine.quant.primitives import quant_range
from amct_engine.quant.registry import WEIGHT_QUANTIZERS, WeightQuantizerEntry, register_weight_quantizer
from amct_engine.quant.retrain_layer import make_weight_quantizer
from amct_engine.quant.ulq_weight import UlqWeightQuantizer
from amct_engine.quant.weight_quantizer import WeightQuantizer
from amct_engine.record import RecordFile
from tests.test_quant_retrain import INPUT, _train_steps, trained_qat_model

# ---------------------------------------------------------------------------------------------
# weight quantisers


class FixedScaleWeightQuantizer(WeightQuantizer):
    """One fixed power-of-two scale for the whole tensor, nothing learnt (straight-through gradient)."""

    SCALE = 2.0**-6

    def __init__(self, bits: int = 8, channel_wise: bool = True, num_channels: int | None = None) -> None:
        super().__init__()
        self._bits = bits

    @property
    def bits(self) -> int:
        return self._bits

    @property
    def channel_wise(self) -> bool:
        return False

    def forward(self, weight: torch.Tensor, transpose_groups: int | None = None) -> torch.Tensor:
        qn, qp = quant_range(self.bits)
        quantized = torch.clamp(torch.round(weight / self.SCALE), qn, qp) * self.SCALE
        return weight + (quantized - weight).detach()

    def scale_offset(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([self.SCALE]), torch.zeros(1, dtype=torch.int32)


@pytest.fixture
def fixed_quantizer():
    entry = WeightQuantizerEntry("fixed", "fixed_retrain", "fixed_distill", f"{__name__}:FixedScaleWeightQuantizer")
    register_weight_quantizer(entry)
    try:
        yield entry
    finally:
        WEIGHT_QUANTIZERS.unregister("fixed")


def _fixed_spec() -> LayerQuantSpec:
    return LayerQuantSpec(enabled=True, weight=WeightQuantSpec(algo="fixed", channel_wise=False, bits=8))


def test_the_built_in_weight_quantizers_share_the_base_class():
    assert issubclass(ArqWeightQuantizer, WeightQuantizer) and issubclass(UlqWeightQuantizer, WeightQuantizer)
    selective = SelectiveMask("fc", torch.randn(2, 8), axis=1)
    assert isinstance(MaskedWeightQuantizer(selective, ArqWeightQuantizer()), WeightQuantizer)
    with pytest.raises(TypeError, match="abstract"):
        WeightQuantizer()


def test_the_mask_wrapper_hands_the_masked_weight_to_the_deployed_layer():
    weight = torch.tensor([[0.1, -0.4, 0.3, 0.2, 0.5, -0.6, 0.05, 0.7]])
    masked = MaskedWeightQuantizer(SelectiveMask("fc", weight, axis=1), ArqWeightQuantizer())
    expected = torch.tensor([[0.0, -0.4, 0.3, 0.0, 0.0, -0.6, 0.0, 0.7]])
    assert torch.equal(masked.weight_to_quantize(weight), expected)
    assert torch.equal(ArqWeightQuantizer().weight_to_quantize(weight), weight)  # the default: as is


def test_a_registered_weight_quantizer_is_built_for_a_spec_naming_it(fixed_quantizer):
    quantizer = make_weight_quantizer(_fixed_spec(), nn.Conv2d(1, 4, 3))
    assert isinstance(quantizer, FixedScaleWeightQuantizer) and quantizer.bits == 8


def test_an_unknown_weight_quantizer_names_the_known_ones():
    spec = LayerQuantSpec(enabled=True, weight=WeightQuantSpec(algo="lsq"))
    with pytest.raises(KeyError, match="unknown weight quantizer 'lsq'.*known: arq, ulq"):
        make_weight_quantizer(spec, nn.Linear(2, 2))


def test_the_qat_layer_trains_records_and_deploys_with_a_registered_quantizer(fixed_quantizer, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 28 * 28, 10))
    cm = capture_model(model, (INPUT,))
    config = QuantJsonConfig(RETRAIN, layers={"0": _fixed_spec(), "3": _fixed_spec()})
    record = RecordFile(tmp_path / "record.txt")
    qmodel = insert_quant_layers(cm, config, record)
    assert all(isinstance(qmodel.get_submodule(n).weight_quant, FixedScaleWeightQuantizer) for n in ("0", "3"))
    _train_steps(qmodel, 2)
    qmodel.eval()
    with torch.no_grad():
        expected = qmodel(INPUT).numpy()
    records = record.quant_layers()
    assert records["0"].scale_w == records["3"].scale_w == (FixedScaleWeightQuantizer.SCALE,)
    paths = save_quantized_onnx(qmodel, records, str(tmp_path / "fixed"), (INPUT,))
    session = ort.InferenceSession(paths["fake_quant"], providers=["CPUExecutionProvider"])
    out = session.run(None, {session.get_inputs()[0].name: INPUT.numpy()})[0]
    np.testing.assert_allclose(out, expected, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# deploy formats

REFERENCE_RUNS: list[dict[str, str]] = []  # metadata of each model the format's reference check saw


def _stamped(model: onnx.ModelProto) -> onnx.ModelProto:
    model = compact_graph(model)
    model.metadata_props.add(key="deploy_format", value="mine")
    return model


def _reference(model: onnx.ModelProto) -> onnx.ModelProto:
    REFERENCE_RUNS.append({p.key: p.value for p in model.metadata_props})
    return model


MINE = dataclasses.replace(ONNX_DEPLOY, name="mine", finalize=_stamped, to_reference_onnx=_reference)


@pytest.fixture
def mine_format():
    register_deploy_format(DeployFormatEntry("mine", "the onnx format, stamped", f"{__name__}:MINE"))
    REFERENCE_RUNS.clear()
    try:
        yield
    finally:
        DEPLOY_FORMATS.unregister("mine")


@pytest.fixture
def qat(tmp_path):
    config, qmodel, record, expected = trained_qat_model(tmp_path)
    return config, qmodel, record, expected


def test_a_registered_deploy_format_is_written_finalised_and_checked(mine_format, qat, tmp_path):
    config, qmodel, record, expected = qat
    paths = amct.save_quant_retrain_model(
        str(config), qmodel, str(record), str(tmp_path / "net"), INPUT, deploy_format="mine"
    )
    deploy = onnx.load(paths["deploy"])
    metadata = {p.key: p.value for p in deploy.metadata_props}
    assert metadata["deploy_format"] == "mine" and "amct_deploy_report" in metadata
    assert [r["deploy_format"] for r in REFERENCE_RUNS] == ["mine"]  # the deploy file, through this format's check
    assert {"QuantizeLinear", "Gemm"} <= {n.op_type for n in deploy.graph.node}  # the onnx format's layer writer
    session = ort.InferenceSession(paths["deploy"], providers=["CPUExecutionProvider"])
    out = session.run(None, {session.get_inputs()[0].name: INPUT.numpy()})[0]
    np.testing.assert_allclose(out, expected, atol=0.05 * np.abs(expected).max())


def test_an_unknown_deploy_format_lists_the_registered_ones(mine_format, qat, tmp_path):
    config, qmodel, record, _ = qat
    with pytest.raises(ValueError, match="deploy_format: unknown deploy format 'trt'; known: onnx, ascend, mine"):
        amct.save_quant_retrain_model(str(config), qmodel, str(record), str(tmp_path / "x"), INPUT, deploy_format="trt")
