"""The resolver: what a .cfg asks of each layer (precedence, skip reasons), for quant and prune."""

from __future__ import annotations

import textwrap

import pytest

from amct_engine.config.cfg_layout import DISTILL_LAYOUT, LAYOUTS, RETRAIN_LAYOUT, weight_fields_without_quantizer
from amct_engine.config.cfg_loader import parse_cfg_document
from amct_engine.config.quant_json import DISTILL, RETRAIN, QuantJsonConfig, config_to_json, layer_specs_from_cfg
from amct_engine.config.resolve import resolve_layers
from amct_engine.config.specs import FilterPruneSpec, LayerQuantSpec, SelectivePruneSpec, WeightQuantSpec
from amct_engine.prune.layer_pruners import weight_layer_type_names
from amct_engine.prune.settings import prune_settings_from_cfg
from amct_engine.quant.registry import WEIGHT_QUANTIZERS

WEIGHT_LAYER_TYPES = weight_layer_type_names()

# {module path: class name}, in model order.
MODEL = {
    "conv1": "Conv2d",
    "bn1": "BatchNorm2d",
    "layer1.conv1": "Conv2d",
    "layer1.conv2": "Conv2d",
    "fc": "Linear",
}
WEIGHT_LAYERS = {n: t for n, t in MODEL.items() if t in WEIGHT_LAYER_TYPES}


def doc_of(text: str, kind: str = "retrain"):
    return parse_cfg_document(textwrap.dedent(text).lstrip("\n"), kind, "t.cfg")


# ----------------------------------------------------------------------------- precedence


def test_weight_settings_come_from_the_layer_then_its_type_then_the_global_config():
    doc = doc_of(
        """
        retrain_weight_quant_config { arq_retrain { dst_type: INT8 channel_wise: true } }
        override_layer_types {
          layer_type: "Conv2d"
          retrain_weight_quant_config { ulq_retrain { dst_type: INT8 channel_wise: false } }
        }
        override_layer_configs {
          layer_name: "layer1.conv2"
          retrain_weight_quant_config { arq_retrain { dst_type: INT4 channel_wise: true } }
        }
        """
    )
    layers = resolve_layers(doc, WEIGHT_LAYERS)
    assert layers["layer1.conv2"].quant.weight == WeightQuantSpec("arq", True, 4)  # its name
    assert layers["conv1"].quant.weight == WeightQuantSpec("ulq", False, 8)  # its type
    assert layers["layer1.conv1"].quant.weight == WeightQuantSpec("ulq", False, 8)
    assert layers["fc"].quant.weight.algo == "arq"  # the global config


def test_an_override_replaces_a_config_message_whole_not_field_by_field():
    # AMCT reads an override's config on its own: the unset dst_type is the proto default (INT8),
    # not the global INT16, and clip values are not inherited either.
    doc = doc_of(
        """
        retrain_data_quant_config {
          ulq_quantize { dst_type: INT16 clip_max_min { clip_max: 6 clip_min: -6 } }
        }
        override_layer_configs {
          layer_name: "conv1"
          retrain_data_quant_config { ulq_quantize { fixed_min: true } }
        }
        """
    )
    layers = resolve_layers(doc, WEIGHT_LAYERS)
    assert (layers["conv1"].quant.act.bits, layers["conv1"].quant.act.clip_max) == (8, None)
    assert layers["conv1"].quant.act.fixed_min is True
    assert (layers["fc"].quant.act.bits, layers["fc"].quant.act.clip_max) == (16, 6.0)


def test_an_override_without_a_weight_config_keeps_the_less_specific_one():
    doc = doc_of(
        """
        retrain_weight_quant_config { ulq_retrain { dst_type: INT4 } }
        override_layer_configs {
          layer_name: "conv1"
          retrain_data_quant_config { ulq_quantize { dst_type: INT8 } }
        }
        """
    )
    assert resolve_layers(doc, WEIGHT_LAYERS)["conv1"].quant.weight == WeightQuantSpec("ulq", True, 4)


def test_linear_stays_per_tensor_unless_its_own_override_asks_for_channel_wise():
    global_cw = "retrain_weight_quant_config { arq_retrain { channel_wise: true } }\n"
    assert resolve_layers(doc_of(global_cw), WEIGHT_LAYERS)["fc"].quant.weight.channel_wise is False
    asked = doc_of(
        global_cw + 'override_layer_types { layer_type: "Linear" '
        "retrain_weight_quant_config { arq_retrain { channel_wise: true } } }\n"
    )
    assert resolve_layers(asked, WEIGHT_LAYERS)["fc"].quant.weight.channel_wise is True


def test_prune_spec_comes_from_the_layer_then_its_type_then_the_global_config():
    doc = doc_of(
        """
        prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.3 } } }
        override_layer_types {
          layer_type: "Linear"
          prune_config { n_out_of_m_pruner { l1_selective_prune { update_freq: 2 } } }
        }
        override_layer_configs {
          layer_name: "layer1.conv2"
          prune_config {
            filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 ascend_optimized: false } }
          }
        }
        """
    )
    layers = resolve_layers(doc, WEIGHT_LAYERS)
    assert layers["layer1.conv2"].prune_spec == FilterPruneSpec(0.5, False)
    assert layers["fc"].prune_spec == SelectivePruneSpec("M4N2", 2)
    assert layers["conv1"].prune_spec == FilterPruneSpec(pytest.approx(0.3), True)


def test_an_override_with_only_quant_settings_keeps_the_global_prune_spec():
    doc = doc_of(
        """
        prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 } } }
        override_layer_configs {
          layer_name: "conv1"
          retrain_weight_quant_config { ulq_retrain { } }
        }
        """
    )
    assert resolve_layers(doc, WEIGHT_LAYERS)["conv1"].prune_spec == FilterPruneSpec(0.5, True)


# ----------------------------------------------------------------------------- skip reasons


SKIPS = """
retrain_weight_quant_config { arq_retrain { } }
prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 } } }
skip_layers: "conv1"
quant_skip_layers: "layer1.conv1"
regular_prune_skip_types: "Linear"
override_layer_configs {
  layer_name: "conv1"
  prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.25 } } }
}
"""


def test_skip_layers_takes_a_layer_out_of_both_modes_whatever_its_override_says():
    conv1 = resolve_layers(doc_of(SKIPS), MODEL)["conv1"]
    for skip in (conv1.quant_skip, conv1.prune_skip):
        assert (skip.cause, skip.fields) == ("skip_layer", ("skip_layers",))
    assert conv1.prune_skip.text == "is in skip_layers / regular_prune_skip_layers"
    assert conv1.quant_skip.text == "is in skip_layers / quant_skip_layers"
    assert conv1.prune == FilterPruneSpec(0.25, True) and conv1.prune_spec is None


def test_mode_specific_skip_lists_skip_only_their_mode():
    layers = resolve_layers(doc_of(SKIPS), MODEL)
    conv, fc = layers["layer1.conv1"], layers["fc"]
    assert conv.quant_skip.fields == ("quant_skip_layers",) and conv.prune_skip is None
    assert fc.quantized and (fc.prune_skip.cause, fc.prune_skip.fields) == ("skip_type", ("regular_prune_skip_types",))
    assert fc.prune_skip.text == "has type Linear, listed in skip_layer_types / regular_prune_skip_types"


def test_types_a_mode_does_not_handle_are_reported_as_such():
    bn1 = resolve_layers(doc_of(SKIPS), MODEL, prune_types=WEIGHT_LAYER_TYPES)["bn1"]
    assert bn1.prune_skip.cause == "unsupported_type"
    assert bn1.prune_skip.text == "has type BatchNorm2d, which pruning does not handle"


def test_compressed_mode_quantizes_only_the_configured_layers():
    doc = doc_of(
        """
        prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 } } }
        override_layer_types { layer_type: "Linear" retrain_weight_quant_config { arq_retrain { } } }
        """
    )
    layers = resolve_layers(doc, WEIGHT_LAYERS, quant_only_configured=True)
    assert layers["fc"].quantized
    skip = layers["conv1"].quant_skip
    assert skip.cause == "not_configured"
    assert skip.fields == ("retrain_data_quant_config", "retrain_weight_quant_config")
    assert resolve_layers(doc, WEIGHT_LAYERS)["conv1"].quantized  # the QAT API quantizes all


def test_a_layer_without_prune_settings_says_so():
    doc = doc_of("retrain_weight_quant_config { arq_retrain { } }\n")
    skip = resolve_layers(doc, WEIGHT_LAYERS)["conv1"].prune_skip
    assert (skip.cause, skip.fields) == ("not_configured", ("prune_config",))


def test_distill_cfgs_resolve_their_own_fields_and_never_prune():
    doc = doc_of(
        """
        distill_weight_quant_config { arq_distill { dst_type: INT4 } }
        distill_data_quant_config { ulq_quantize { dst_type: INT4 } }
        quant_skip_layer_types: "Linear"
        distill_override_layers {
          layer_name: "conv1"
          distill_weight_quant_config { ulq_distill { dst_type: INT8 } }
          distill_data_quant_config { ulq_quantize { dst_type: INT8 } }
        }
        """,
        "distill",
    )
    layers = resolve_layers(doc, WEIGHT_LAYERS)
    assert layers["conv1"].quant.weight == WeightQuantSpec("ulq", True, 8)
    assert layers["layer1.conv1"].quant.weight == WeightQuantSpec("arq", True, 4)
    assert layers["fc"].quant_skip.fields == ("quant_skip_layer_types",)
    assert all(layer.prune_skip.cause == "not_configured" for layer in layers.values())


# ----------------------------------------------------------------------------- callers agree


def test_quant_json_and_prune_settings_agree_with_the_resolver_on_the_same_layers():
    doc = doc_of(SKIPS)
    resolved = resolve_layers(doc, WEIGHT_LAYERS)
    modules = {name: type(t, (), {"groups": 1, "in_channels": 8})() for name, t in WEIGHT_LAYERS.items()}
    quant = layer_specs_from_cfg(doc.message, RETRAIN, modules)
    prune = prune_settings_from_cfg(doc.message, MODEL, WEIGHT_LAYER_TYPES)
    assert list(quant) == list(resolved) == list(WEIGHT_LAYERS)
    assert {n: s.enabled for n, s in quant.items()} == {n: r.quantized for n, r in resolved.items()}
    assert prune.specs == {n: r.prune_spec for n, r in resolved.items() if r.prune_spec is not None}
    assert prune.skipped == {
        n: r.prune_skip.text
        for n, r in resolved.items()
        if r.prune_skip and r.prune_skip.cause in ("skip_layer", "skip_type")
    }
    assert "bn1" not in prune.specs and "bn1" not in prune.skipped


def test_the_order_of_the_layers_given_is_kept():
    names = list(reversed(MODEL))
    assert list(resolve_layers(doc_of(SKIPS), {n: MODEL[n] for n in names})) == names


# ----------------------------------------------------------------------------- the weight-quantiser table


def test_every_proto_weight_algorithm_has_a_table_entry():
    for layout in LAYOUTS.values():
        assert weight_fields_without_quantizer(layout) == []
        assert set(layout.proto_weight_fields()) <= set(layout.weight_fields())


def test_a_proto_weight_algorithm_missing_from_the_table_is_found(monkeypatch):
    entries = dict(WEIGHT_QUANTIZERS.items())
    monkeypatch.setattr(WEIGHT_QUANTIZERS, "_entries", {"arq": entries["arq"]})
    assert weight_fields_without_quantizer(RETRAIN_LAYOUT) == ["ulq_retrain"]
    assert weight_fields_without_quantizer(DISTILL_LAYOUT) == ["ulq_distill"]


def test_json_algo_values_are_the_table_fields():
    for name, entry in WEIGHT_QUANTIZERS.items():
        for dialect, field in ((RETRAIN, entry.retrain_field), (DISTILL, entry.distill_field)):
            layers = {"conv1": LayerQuantSpec(True, weight=WeightQuantSpec(name))}
            assert config_to_json(QuantJsonConfig(dialect, layers=layers))["conv1"][dialect.weight_key]["algo"] == field
            assert dialect.cfg.weight_algo(field) == name


def test_the_layouts_name_real_proto_fields():
    for layout in LAYOUTS.values():
        fields = layout.message_class.DESCRIPTOR.fields_by_name
        named = [layout.data_config, layout.weight_config, *layout.skip_lists()]
        named += [layout.prune_config] if layout.prune_config else []
        assert all(f in fields for f in named), named
        for override in layout.overrides:
            entry_fields = fields[override.field].message_type.fields_by_name
            assert override.key in entry_fields
            assert all(f in entry_fields for f in layout.quant_configs)


def test_the_int4_fallback_warning_points_at_the_caller():
    doc = doc_of("retrain_weight_quant_config { arq_retrain { dst_type: INT4 } }\n")
    depthwise = {"conv1": type("Conv2d", (), {"groups": 8, "in_channels": 8})()}
    with pytest.warns(UserWarning, match="INT4 weights are not supported") as record:
        specs = layer_specs_from_cfg(doc.message, RETRAIN, depthwise)
    assert specs["conv1"].weight.bits == 8
    assert record[0].filename == __file__
