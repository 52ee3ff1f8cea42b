"""The pass that swaps quantised training layers in by module path (docs/spec/engine.md §1.2, §4.6, §4.8)."""

from __future__ import annotations

from torch import fx, nn

from amct_engine.config.quant_json import QuantJsonConfig
from amct_engine.graph.analysis import conv_bn_act_chains, input_bounded_below, input_non_negative
from amct_engine.graph.capture import CapturedModel
from amct_engine.quant.lookup_tables import round_lookup_tables
from amct_engine.quant.retrain_layer import make_act_quantizer, make_weight_quantizer, qat_layer_class
from amct_engine.record import RecordFile


def _input_nodes(cm: CapturedModel) -> dict[str, fx.Node]:
    """Module path -> the fx node that feeds its (first) input."""
    out = {}
    for node in cm.graph_module.graph.nodes:
        if node.op == "call_module" and node.args and isinstance(node.args[0], fx.Node):
            out.setdefault(node.target, node.args[0])
    return out


def insert_quant_layers(
    cm: CapturedModel, config: QuantJsonConfig, record: RecordFile | None, distill: bool = False
) -> nn.Module:
    """Replace every enabled layer of `cm.module` with a QuantRetrainLayer (its per-type subclass,
    `Conv2dQAT`, `LinearQAT`, …); returns `cm.module`.

    Retrain (docs/spec/engine.md §4.6) moves a following BN into the wrapper, defaults `fixed_min` to "input
    comes from a ReLU" (or another non-negative activation), and starts an input from SiLU, hardswish, GELU...
    from the asymmetric IFMR search (graph/analysis.py `input_bounded_below`). Distillation
    (docs/spec/engine.md §4.1, §6) keeps the BN in place, because distill groups call their modules one by
    one, and remembers its path so saving can fold it; its `fixed_min` defaults to false. Without that ReLU
    detection AMCT's symmetric IFMR start spends half of the codes on negative values that one-sided inputs
    never take (a GELU output in [-0.17, 24] gets the range [-19.5, 19.4]; the clip learning, 0.1 per step,
    cannot recover that in one epoch), so distillation starts from the asymmetric IFMR search instead.
    """
    model = cm.module
    round_lookup_tables(cm)  # the deploy file's int8 rows, trained with (quant/lookup_tables.py)
    following_bn = {chain.layer: chain.bn for chain in conv_bn_act_chains(cm) if chain.bn is not None}
    inputs = _input_nodes(cm)
    shared_act: dict[tuple, nn.Module] = {}
    for name in config.enabled_layers():
        spec = config.layers[name]
        from_relu = False if distill else input_non_negative(cm, name)
        asymmetric = distill or input_bounded_below(cm, name)
        # docs/spec/engine.md §4.8: retrain layers reading the same tensor with identical settings share one
        # quantiser. Distillation does not (AMCT's single-op QAT layers own theirs): its groups
        # train one after another, and a quantiser shared across groups would move under a group
        # that has already been trained.
        share_key = (inputs.get(name), spec.act, from_relu, asymmetric)
        act_quant = None if distill else shared_act.get(share_key)
        if act_quant is None:
            act_quant = make_act_quantizer(spec, config.batch_num, from_relu, asymmetric_init=asymmetric)
            if share_key[0] is not None:
                shared_act[share_key] = act_quant
        bn = None
        if name in following_bn and not distill:
            bn = model.get_submodule(following_bn[name])
            model.set_submodule(following_bn[name], nn.Identity())
        layer = model.get_submodule(name)
        wrapper = qat_layer_class(layer)(  # Conv2dQAT, LinearQAT, … (AMCT's class names)
            name,
            layer,
            act_quant,
            make_weight_quantizer(spec, layer),
            bn=bn,
            record=record,
            fakequant_precision_mode=config.fakequant_precision_mode,
        )
        wrapper.following_bn = following_bn.get(name) if distill else None
        model.set_submodule(name, wrapper)
    return model
