"""The quantised training form of one Conv/Linear layer (AMCT's RetrainQuant, docs/spec/engine.md §4.6)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from amct_engine.config.quant_json import BITS_DST, LayerQuantSpec
from amct_engine.layers import behaviour_of
from amct_engine.quant.deployed import QuantFactors, compute_factors, deployed_forward, fold_batch_norm
from amct_engine.quant.registry import WEIGHT_QUANTIZERS
from amct_engine.quant.ulq_act import UlqActQuantizer
from amct_engine.quant.weight_quantizer import WeightQuantizer
from amct_engine.record import LayerQuantRecord, RecordFile

FLT_EPSILON = 1.192092896e-07


class QuantRetrainLayer(nn.Module):
    """ULQ-quantised input, ARQ/ULQ-quantised weight, then the layer and its following BN.

    The BN trains unfolded inside the wrapper (its parent slot becomes nn.Identity) and is folded
    at save time (docs/spec/engine.md §4.6). Quantisation factors go to the record on the first eval forward
    after training (docs/spec/engine.md §1.2, "Important").

    In eval mode the layer computes what the deployed model computes (BN folded, integer weight
    codes, int32 bias; `deployed_forward`), from exactly the factors it writes to the record, so
    the accuracy measured in PyTorch is the accuracy of the exported models.
    """

    def __init__(
        self,
        name: str,
        layer: nn.Module,
        act_quant: UlqActQuantizer,
        weight_quant: WeightQuantizer,
        bn: nn.Module | None = None,
        record: RecordFile | None = None,
        fakequant_precision_mode: str = "DEFAULT",
    ):
        super().__init__()
        self.layer_name = name
        self.layer = layer
        self.act_quant = act_quant
        self.weight_quant = weight_quant
        self.bn = bn
        self.record = record
        self.fakequant_precision_mode = fakequant_precision_mode
        # Distillation keeps a following BN outside the wrapper; saving folds it in (docs/spec/engine.md §6.3).
        self.following_bn: str | None = None
        self._deployed: tuple[nn.Module, QuantFactors] | None = None
        # New weights (a checkpoint) invalidate the factors cached for eval.
        self.register_load_state_dict_post_hook(_invalidate_after_load)

    @property
    def _record_pending(self) -> bool:
        """True until an eval forward has written this layer's current factors."""
        return self._deployed is None

    def invalidate(self) -> None:
        self._deployed = None

    # PTQ calibration (ptq.py) sets it on Conv2d layers: their outputs continue channels-last.
    channels_last_output = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._forward(x)
        return y.contiguous(memory_format=torch.channels_last) if self.channels_last_output else y

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self._deployed = None
            return self.training_forward(x)
        if self._deployed is None:
            with torch.no_grad():
                x_q, w_q = self._quantized_operands(x)  # calibrates IFMR and refreshes the weight scales
                if not self.act_quant.calibrated:
                    return self._layer_forward(x_q, w_q)  # IFMR still collecting its batch_num batches
            # Calibrated now: the deployed form computes this forward (the fake-quant one is not run for nothing).
            self._deployed = self._freeze()
        layer, factors = self._deployed
        return deployed_forward(layer, factors, x)

    def training_forward(self, x: torch.Tensor) -> torch.Tensor:
        """Fake-quantised input and weight, the layer, then the unfolded BN (docs/spec/engine.md §4.6)."""
        return self._layer_forward(*self._quantized_operands(x))

    def _quantized_operands(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_q = self.act_quant(x)
        return x_q, self.weight_quant(self.layer.weight, behaviour_of(self.layer).weight_groups(self.layer))

    def _layer_forward(self, x_q: torch.Tensor, w_q: torch.Tensor) -> torch.Tensor:
        if self.channels_last_output:  # a channels-last weight makes torch's conv write channels-last
            w_q = w_q.contiguous(memory_format=torch.channels_last)
        y = functional_call(self.layer, {"weight": w_q}, (x_q,))
        return self.bn(y) if self.bn is not None else y

    def _freeze(self) -> tuple[nn.Module, QuantFactors]:
        """Write the record entry and derive the deployed layer from exactly those factors."""
        record = self.quant_record()
        if self.record is not None:
            self.record.write_layers({self.layer_name: record})
        # The deployed layer holds the weight the quantiser reads (weight_to_quantize: 4:2-masked when a
        # mask comes first), so eval runs the weights that were trained and that the save bakes in.
        weight = self.weight_quant.weight_to_quantize(self.layer.weight.detach())
        layer = fold_batch_norm(self.layer, self.bn, weight)
        factors = compute_factors(self.layer_name, layer, record)
        if self.channels_last_output:
            weight_q = factors.weight_q.contiguous(memory_format=torch.channels_last)
            factors = dataclasses.replace(factors, weight_q=weight_q)
        return layer, factors

    def quant_record(self) -> LayerQuantRecord:
        """Scale/offset of data and weight, with a following BN's factor folded into scale_w."""
        scale_d, offset_d = self.act_quant.scale_offset()
        scale_d, offset_d = float(scale_d), int(offset_d)
        if self.fakequant_precision_mode == "FORCE_FP16_QUANT":
            scale_d = float(torch.tensor(scale_d).half())  # docs/spec/engine.md §2.2: scale_d at fp16 precision
        scale_d = reciprocal_stable(scale_d)
        scale_w = self.weight_quant.scale_offset()[0].reshape(-1)  # the scale the forward used
        bn_factor = self.bn_fold_factor()
        if bn_factor is not None:
            # docs/spec/engine.md §4.6: matches the Conv+BN folding done at save time.
            scale_w = scale_w.expand(bn_factor.numel()) * bn_factor.abs()
        scale_w = torch.where(scale_w < FLT_EPSILON, torch.ones_like(scale_w), scale_w)
        return LayerQuantRecord(
            scale_d=scale_d,
            offset_d=offset_d,
            scale_w=tuple(scale_w.tolist()),
            offset_w=(0,) * scale_w.numel(),
            act_type=BITS_DST[self.act_quant.bits],
            wts_type=BITS_DST[self.weight_quant.bits],
            fakequant_precision_mode=self.fakequant_precision_mode,
        )

    def bn_fold_factor(self) -> torch.Tensor | None:
        """gamma / sqrt(var + eps) of the following BN, or None."""
        if self.bn is None:
            return None
        bn = self.bn
        gamma = bn.weight.detach() if bn.weight is not None else torch.ones_like(bn.running_var)
        return (gamma / torch.sqrt(bn.running_var + bn.eps)).float()


# AMCT's users see its QAT ops by class (docs/spec/engine.md §1.5: create_distill_model makes Conv2dQAT /
# LinearQAT; docs/spec/engine.md §1.1 AMCT_OPERATIONS): one subclass per layer type, so code written against AMCT that
# checks the type keeps working; `isinstance(m, QuantRetrainLayer)` holds for all of them.
class Conv1dQAT(QuantRetrainLayer):
    """A quantised nn.Conv1d."""


class Conv2dQAT(QuantRetrainLayer):
    """A quantised nn.Conv2d."""


class Conv3dQAT(QuantRetrainLayer):
    """A quantised nn.Conv3d."""


class ConvTranspose1dQAT(QuantRetrainLayer):
    """A quantised nn.ConvTranspose1d."""


class ConvTranspose2dQAT(QuantRetrainLayer):
    """A quantised nn.ConvTranspose2d."""


class ConvTranspose3dQAT(QuantRetrainLayer):
    """A quantised nn.ConvTranspose3d."""


class LinearQAT(QuantRetrainLayer):
    """A quantised nn.Linear."""


QAT_LAYER_CLASSES: dict[type[nn.Module], type[QuantRetrainLayer]] = {
    nn.Conv1d: Conv1dQAT,
    nn.Conv2d: Conv2dQAT,
    nn.Conv3d: Conv3dQAT,
    nn.ConvTranspose1d: ConvTranspose1dQAT,
    nn.ConvTranspose2d: ConvTranspose2dQAT,
    nn.ConvTranspose3d: ConvTranspose3dQAT,
    nn.Linear: LinearQAT,
}


def qat_layer_class(layer: nn.Module) -> type[QuantRetrainLayer]:
    """The QAT class of ``layer``: its nearest torch.nn base's (``Conv2dQAT``), else QuantRetrainLayer."""
    for cls in type(layer).__mro__:
        if cls in QAT_LAYER_CLASSES:
            return QAT_LAYER_CLASSES[cls]
    return QuantRetrainLayer


def reciprocal_stable(scale: float) -> float:
    """The float32 scale next to `scale` whose float32 reciprocal maps back to it.

    The Ascend layout stores 1/scale_d (docs/spec/engine.md §5); with this, 1/(1/scale_d) is scale_d again, so a
    reference that recovers scale_d quantises exactly like the fake-quant model (moves <= 1 ulp).
    """
    one = np.float32(1)
    value = np.float32(scale)
    for _ in range(8):
        back = one / (one / value)
        if back == value:
            break
        value = back
    return float(value)


def _invalidate_after_load(module: QuantRetrainLayer, _incompatible_keys) -> None:
    module.invalidate()


def out_channels(layer: nn.Module) -> int:
    return behaviour_of(layer).out_channels(layer)


def make_weight_quantizer(spec: LayerQuantSpec, layer: nn.Module) -> WeightQuantizer:
    """The quantiser `spec.weight.algo` names in WEIGHT_QUANTIZERS, sized to the layer's Cout."""
    cls = WEIGHT_QUANTIZERS[spec.weight.algo].quantizer_class()
    if not (isinstance(cls, type) and issubclass(cls, WeightQuantizer)):
        raise TypeError(f"weight quantizer {spec.weight.algo!r} is {cls!r}, not a WeightQuantizer subclass")
    return cls(bits=spec.weight.bits, channel_wise=spec.weight.channel_wise, num_channels=out_channels(layer))


def make_act_quantizer(
    spec: LayerQuantSpec, batch_num: int, input_from_relu: bool, asymmetric_init: bool = False
) -> UlqActQuantizer:
    act = spec.act
    # docs/spec/engine.md §4.1: fixed_min defaults to true when the layer's input comes from a ReLU.
    fixed_min = input_from_relu if act.fixed_min is None else act.fixed_min
    return UlqActQuantizer(
        bits=act.bits,
        fixed_min=fixed_min,
        clip_max=act.clip_max,
        clip_min=act.clip_min,
        batch_num=batch_num,
        asymmetric_init=asymmetric_init,
    )
