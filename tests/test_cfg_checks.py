"""Semantic checks of parsed .cfg files, per-API checks and layer-reference warnings."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import pytest

from amct_engine.config.cfg_checks import check_cfg_for_api
from amct_engine.config.cfg_loader import load_cfg_document, parse_cfg_document, parse_retrain_cfg_text
from amct_engine.config.errors import ConfigError, ConfigWarning
from amct_engine.config.layer_refs import check_layer_references

EXAMPLES = Path(__file__).parent / "fixtures" / "cfg"  # copies of ../shared/examples

# A small ResNet-like model, as {module path: class name}.
MODEL = {
    "": "ResNet",
    "conv1": "Conv2d",
    "bn1": "BatchNorm2d",
    "relu": "ReLU",
    "layer1.0.conv1": "Conv2d",
    "layer1.0.bn1": "BatchNorm2d",
    "layer1.0.conv2": "Conv2d",
    "fc": "Linear",
}


def cfg(text: str) -> str:
    """Inline cfg text: line 1 is the first line after the opening quotes."""
    return textwrap.dedent(text).lstrip("\n")


def doc_of(text: str, kind: str = "retrain", check: bool = True):
    return parse_cfg_document(cfg(text), kind, "t.cfg", check=check)


def check_error(text: str, kind: str = "retrain") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        doc_of(text, kind)
    return info.value


def assert_error(err: ConfigError, line: int | None, column: int | None, field: str | None, *fragments: str):
    assert (err.line, err.column, err.field) == (line, column, field), str(err)
    for fragment in fragments:
        assert fragment in err.message, err.message


# ----------------------------------------------------------------------------- prune_ratio


def test_prune_ratio_zero_is_rejected():
    err = check_error(
        """
        prune_config {
          filter_pruner {
            balanced_l2_norm_filter_prune { prune_ratio: 0 }
          }
        }
        """
    )
    assert_error(
        err,
        3,
        37,
        "prune_config.filter_pruner.balanced_l2_norm_filter_prune.prune_ratio",
        "prune_ratio must be between 0 and 1 (both excluded), got 0",
    )
    assert str(err).startswith("t.cfg:3:37: ")


def test_prune_ratio_above_one_in_an_override():
    err = check_error(
        """
        override_layer_configs {
          layer_name: "conv1"
          prune_config { filter_pruner { balanced_l2_norm_filter_prune {
            prune_ratio: 1.5
          } } }
        }
        """
    )
    assert_error(
        err,
        4,
        5,
        "override_layer_configs[0].prune_config.filter_pruner.balanced_l2_norm_filter_prune.prune_ratio",
        "got 1.5",
    )


def test_prune_ratio_one_is_excluded_and_half_is_fine():
    template = "prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: %s } } }"
    assert "got 1" in check_error(template % "1.0").message
    ratio = parse_retrain_cfg_text(template % "0.5").prune_config.filter_pruner
    assert ratio.balanced_l2_norm_filter_prune.prune_ratio == 0.5


def test_empty_prune_blocks_are_rejected():
    assert_error(check_error("prune_config { }"), 1, 1, "prune_config", "prune_config is empty")
    err = check_error('override_layer_types {\n  layer_type: "Conv2d"\n  prune_config { filter_pruner { } }\n}\n')
    assert_error(err, 3, 18, "override_layer_types[0].prune_config.filter_pruner", "balanced_l2_norm_filter_prune")


def test_overrides_may_mix_prune_kinds():
    # docs/spec/engine.md §1.3: one prune kind per scope, but an override may use the other kind.
    msg = doc_of(
        """
        prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.3 } } }
        override_layer_types {
          layer_type: "Linear"
          prune_config { n_out_of_m_pruner { l1_selective_prune { update_freq: 2 } } }
        }
        """
    ).message
    assert msg.override_layer_types[0].prune_config.HasField("n_out_of_m_pruner")


# ----------------------------------------------------------------------------- clip_max_min


def test_negative_clip_max():
    err = check_error(
        """
        retrain_data_quant_config {
          ulq_quantize {
            clip_max_min { clip_max: -6.0 clip_min: -6.0 }
          }
        }
        """
    )
    assert_error(
        err,
        3,
        20,
        "retrain_data_quant_config.ulq_quantize.clip_max_min.clip_max",
        "clip_max must be greater than 0, got -6",
    )


def test_positive_clip_min_in_a_distill_override():
    err = check_error(
        """
        distill_override_layers {
          layer_name: "conv1"
          distill_data_quant_config { ulq_quantize { clip_max_min {
            clip_max: 6
            clip_min: 0.5
          } } }
        }
        """,
        "distill",
    )
    assert_error(
        err,
        5,
        5,
        "distill_override_layers[0].distill_data_quant_config.ulq_quantize.clip_max_min.clip_min",
        "clip_min must be less than 0, got 0.5",
    )


# ----------------------------------------------------------------------------- dst_type pairs


def test_int4_activations_are_refused_for_qat():
    err = check_error(
        """
        retrain_data_quant_config {
          ulq_quantize { dst_type: INT4 }
        }
        retrain_weight_quant_config { arq_retrain { dst_type: INT4 } }
        """
    )
    assert_error(
        err,
        2,
        18,
        "retrain_data_quant_config.ulq_quantize.dst_type",
        "Int4 quantization aware training is not supported",
    )


def test_int4_activations_in_an_override_type():
    err = check_error(
        """
        override_layer_types {
          layer_type: "Conv2d"
          retrain_data_quant_config { ulq_quantize { dst_type: 0 } }
        }
        """
    )
    assert_error(
        err,
        3,
        46,
        "override_layer_types[0].retrain_data_quant_config.ulq_quantize.dst_type",
        'override_layer_types[0] (layer_type "Conv2d")',
    )


def test_a16w4_is_not_a_supported_pair():
    err = check_error(
        """
        retrain_data_quant_config { ulq_quantize { dst_type: INT16 } }
        retrain_weight_quant_config {
          ulq_retrain { dst_type: INT4 }
        }
        """
    )
    assert_error(
        err,
        3,
        17,
        "retrain_weight_quant_config.ulq_retrain.dst_type",
        "pair A16W4",
        "supported pairs: A8W8, A16W8, A8W4",
    )


def test_int16_weights_with_default_int8_activations():
    err = check_error(
        'override_layer_configs {\n  layer_name: "fc"\n'
        "  retrain_weight_quant_config { arq_retrain { dst_type: INT16 } }\n}\n"
    )
    assert_error(err, 3, 47, "override_layer_configs[0].retrain_weight_quant_config.arq_retrain.dst_type", "A8W16")


@pytest.mark.parametrize(("act", "wts"), [("INT8", "INT8"), ("INT16", "INT8"), ("INT8", "INT4")])
def test_supported_pairs_pass(act, wts):
    msg = parse_retrain_cfg_text(
        f"retrain_data_quant_config {{ ulq_quantize {{ dst_type: {act} }} }}\n"
        f"retrain_weight_quant_config {{ arq_retrain {{ dst_type: {wts} }} }}\n"
    )
    assert msg.HasField("retrain_weight_quant_config")


def test_override_pair_uses_the_override_own_defaults_not_the_global():
    # AMCT reads an override's quant configs alone (unset = INT8), so global INT16
    # activations do not make an override's INT4 weights an A16W4 pair.
    msg = parse_retrain_cfg_text(
        cfg(
            """
            retrain_data_quant_config { ulq_quantize { dst_type: INT16 } }
            override_layer_configs {
              layer_name: "fc"
              retrain_weight_quant_config { arq_retrain { dst_type: INT4 } }
            }
            """
        )
    )
    assert len(msg.override_layer_configs) == 1


def test_distill_activation_and_weight_types_must_match():
    err = check_error(
        """
        distill_data_quant_config { ulq_quantize { dst_type: INT4 } }
        distill_weight_quant_config {
          arq_distill { dst_type: INT8 }
        }
        """,
        "distill",
    )
    assert_error(
        err,
        3,
        17,
        "distill_weight_quant_config.arq_distill.dst_type",
        "activation dst_type INT4 and weight dst_type INT8 differ in the global config",
    )


def test_distill_mismatch_against_a_default_points_at_the_written_one():
    err = check_error(
        """
        distill_override_layer_types {
          layer_type: "Linear"
          distill_weight_quant_config { ulq_distill { dst_type: INT4 } }
        }
        """,
        "distill",
    )
    assert_error(
        err,
        3,
        47,
        "distill_override_layer_types[0].distill_weight_quant_config.ulq_distill.dst_type",
        "INT8 and weight dst_type INT4",
    )


def test_distill_int4_for_both_is_fine():
    doc = doc_of(
        "distill_data_quant_config { ulq_quantize { dst_type: INT4 } }\n"
        "distill_weight_quant_config { arq_distill { dst_type: INT4 } }\n",
        "distill",
    )
    assert doc.message.distill_weight_quant_config.arq_distill.dst_type == 0


# ----------------------------------------------------------------------------- names, counts


def test_duplicate_override_layer_name_is_reported_at_the_second():
    err = check_error(
        """
        override_layer_configs { layer_name: "conv1" }
        override_layer_configs { layer_name: "fc" }
        override_layer_configs {
          layer_name: "conv1"
        }
        """
    )
    assert_error(
        err,
        4,
        3,
        "override_layer_configs[2].layer_name",
        'layer_name "conv1" has more than one override_layer_configs entry (first at 1:26)',
    )


def test_duplicate_override_types_in_distill():
    err = check_error(
        'distill_override_layer_types { layer_type: "Conv2d" }\n'
        'distill_override_layer_types { layer_type: "Conv2d" }\n',
        "distill",
    )
    assert_error(err, 2, 32, "distill_override_layer_types[1].layer_type", "first at 1:32")


def test_batch_num_zero():
    assert_error(check_error("batch_num: 0\n"), 1, 1, "batch_num", "batch_num must be greater than 0, got 0")


def test_group_size_zero():
    err = check_error("batch_num: 2\ngroup_size: 0\n", "distill")
    assert_error(err, 2, 1, "group_size", "group_size must be greater than 0")


def test_empty_distill_group_names():
    err = check_error(
        """
        distill_group { start_layer_name: "conv1" end_layer_name: "relu" }
        distill_group {
          start_layer_name: "layer1.0.conv1"
          end_layer_name: "  "
        }
        """,
        "distill",
    )
    assert_error(err, 4, 3, "distill_group[1].end_layer_name", "end_layer_name of distill_group[1] must not be empty")


def test_first_problem_in_the_file_is_reported():
    err = check_error(
        """
        override_layer_configs {
          layer_name: "conv1"
          retrain_data_quant_config { ulq_quantize { dst_type: INT4 } }
        }
        batch_num: 0
        """
    )
    assert (err.line, err.field) == (
        3,
        "override_layer_configs[0].retrain_data_quant_config.ulq_quantize.dst_type",
    )


def test_repeated_skip_entries_warn_and_are_removed():
    text = 'skip_layers: "conv1"\nskip_layers: "fc"\nquant_skip_types: ["Conv2d", "Conv2d"]\n'
    text += 'skip_layers: "conv1"\n'
    with pytest.warns(ConfigWarning) as record:
        msg = parse_retrain_cfg_text(text, "t.cfg")
    assert list(msg.skip_layers) == ["conv1", "fc"] and list(msg.quant_skip_types) == ["Conv2d"]
    texts = sorted(str(w.message) for w in record)
    assert texts == [
        't.cfg:3:30: "Conv2d" is listed more than once in quant_skip_types; the repeat is ignored',
        't.cfg:4:1: "conv1" is listed more than once in skip_layers; the repeat is ignored',
    ]
    assert all(issubclass(w.category, UserWarning) for w in record)


def test_check_can_be_skipped_and_run_later():
    from amct_engine.config.cfg_checks import check_retrain_cfg

    doc = doc_of("batch_num: 0", check=False)
    assert doc.message.batch_num == 0
    with pytest.raises(ConfigError, match="batch_num must be greater than 0"):
        check_retrain_cfg(doc)


# ----------------------------------------------------------------------------- per API


def test_quant_api_rejects_a_prune_config_in_an_override():
    doc = doc_of(
        """
        retrain_weight_quant_config { arq_retrain { } }
        override_layer_types {
          layer_type: "Conv2d"
          prune_config { n_out_of_m_pruner { l1_selective_prune { } } }
        }
        """
    )
    with pytest.raises(ConfigError) as info:
        check_cfg_for_api(doc, "quant")
    assert_error(
        info.value,
        4,
        3,
        "override_layer_types[0].prune_config",
        "is a pruning setting, not allowed in a quantization-aware training config",
        "create_compressed_retrain_model",
    )


def test_quant_api_rejects_prune_skip_lists():
    doc = doc_of('regular_prune_skip_layers: "fc"\n')
    with pytest.raises(ConfigError, match="regular_prune_skip_layers is a pruning setting"):
        check_cfg_for_api(doc, "quant")


def test_prune_api_rejects_quant_configs():
    doc = load_cfg_document(EXAMPLES / "compressed_m4n2_int8.cfg", "retrain")
    with pytest.raises(ConfigError) as info:
        check_cfg_for_api(doc, "prune")
    # quant_skip_layers (line 12) is the first quantization setting in the file.
    assert_error(info.value, 12, 1, "quant_skip_layers", "is a quantization setting, not allowed in a prune config")
    assert str(info.value).startswith(f"{EXAMPLES / 'compressed_m4n2_int8.cfg'}:12:1: ")


def test_prune_api_needs_some_pruning():
    doc = doc_of('skip_layers: "fc"\n')
    with pytest.raises(ConfigError, match="enables no pruning"):
        check_cfg_for_api(doc, "prune")
    check_cfg_for_api(
        doc_of("prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.3 } } }"),
        "prune",
    )


def test_compressed_api_needs_quant_or_prune():
    doc = doc_of('skip_layers: "fc"\nbatch_num: 2\n')
    with pytest.raises(ConfigError) as info:
        check_cfg_for_api(doc, "compressed")
    assert_error(info.value, None, None, None, "enables neither quantization nor pruning")
    assert str(info.value).startswith("t.cfg: ")
    # An override alone switches a mode on (AMCT's parse_proto_enable).
    check_cfg_for_api(doc_of('override_layer_configs { layer_name: "fc" retrain_data_quant_config { } }'), "compressed")


def test_examples_suit_the_compressed_api():
    for name in ("compressed_filter_prune_int8.cfg", "compressed_m4n2_int8.cfg"):
        check_cfg_for_api(load_cfg_document(EXAMPLES / name, "retrain"), "compressed")


def test_api_check_on_a_bare_message_reads_positions_from_the_file(tmp_path):
    path = tmp_path / "qat.cfg"
    path.write_text(
        "batch_num: 2\n\nprune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.3 } } }\n"
    )
    msg = load_cfg_document(path, "retrain").message
    with pytest.raises(ConfigError) as info:
        check_cfg_for_api(msg, "quant", path)
    assert (info.value.line, info.value.column, info.value.path) == (3, 1, str(path))
    with pytest.raises(ConfigError) as info:
        check_cfg_for_api(msg, "quant")
    assert (info.value.line, str(info.value).split(":")[0]) == (None, "<config>")


def test_api_check_argument_errors():
    with pytest.raises(ValueError, match="api must be"):
        check_cfg_for_api(doc_of(""), "ptq")
    with pytest.raises(TypeError, match="AMCTRetrainConfig"):
        check_cfg_for_api(doc_of("", "distill"), "quant")


# ----------------------------------------------------------------------------- layer references


RETRAIN_SUPPORTED = ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose2d", "Linear")


def ref_error(text: str, kind: str = "retrain", supported=None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        check_layer_references(doc_of(text, kind), MODEL, supported_types=supported)
    return info.value


def test_unknown_layer_names_and_types_are_errors_with_suggestions():
    # AMCT raises for each of these (docs/spec/engine.md §1.1); the first in the file is reported
    cases = [
        (
            'skip_layers: "layer1.0.conv"\n',
            't.cfg:1:1: layer "layer1.0.conv" in skip_layers is not in the model '
            '(did you mean "layer1.0.conv2", "layer1.0.conv1" or "layer1.0.bn1"?)',
        ),
        (
            'batch_num: 1\nquant_skip_types: "Conv2D"\n',
            't.cfg:2:1: layer type "Conv2D" in quant_skip_types is not a supported layer type (did you mean "Conv2d"?)',
        ),
        (
            'override_layer_configs {\n  layer_name: "fc1"\n}\n',
            't.cfg:2:3: layer "fc1" in override_layer_configs[0].layer_name is not in the model (did you mean "fc"?)',
        ),
        (
            'override_layer_types {\n  layer_type: "LSTM"\n}\n',
            't.cfg:2:3: layer type "LSTM" in '
            "override_layer_types[0].layer_type is not a supported layer type (supported layer types: "
            "BatchNorm2d, Conv2d, Linear, ReLU, ResNet)",
        ),
    ]
    for text, message in cases:
        assert str(ref_error(text)) == message
    first = ref_error('skip_layers: "conv1"\noverride_layer_types { layer_type: "Optype" }\nskip_layers: "nope"\n')
    assert (first.line, first.field) == (2, "override_layer_types[0].layer_type")


def test_an_override_of_an_unsupported_type_or_a_missing_layer_is_an_error():
    # The two cases, against the types the retrain API compresses
    text = 'override_layer_types {\n  layer_type: "ReLU"\n  retrain_data_quant_config { ulq_quantize {} }\n}\n'
    err = ref_error(text, supported=RETRAIN_SUPPORTED)
    assert (err.line, err.column) == (2, 3)
    assert 'layer type "ReLU"' in err.message and "not a supported layer type" in err.message
    err = ref_error('override_layer_configs {\n  layer_name: "layer1.0.conv"\n}\n', supported=RETRAIN_SUPPORTED)
    assert err.message.endswith('is not in the model (did you mean "layer1.0.conv2" or "layer1.0.conv1"?)')
    # a layer that exists but whose type the API does not compress
    err = ref_error('skip_layers: "relu"\n', supported=RETRAIN_SUPPORTED)
    assert err.message.startswith('layer "relu" in skip_layers is a ReLU, which is not a supported layer type')


def test_a_supported_type_the_model_lacks_is_accepted():
    # AMCT checks override / skip types against the types it supports, not against the model's
    check_layer_references(doc_of('skip_layer_types: "Conv3d"\n'), MODEL, supported_types=RETRAIN_SUPPORTED)


def test_distill_group_names_are_checked():
    err = ref_error(
        """
        distill_group {
          start_layer_name: "conv1"
          end_layer_name: "rleu"
        }
        quant_skip_layers: "fc"
        """,
        "distill",
    )
    assert str(err) == (
        't.cfg:3:3: layer "rleu" in distill_group[0].end_layer_name is not in the model (did you mean "relu"?)'
    )


def test_known_references_give_no_warning():
    doc = doc_of('skip_layers: "conv1"\nskip_layer_types: "Linear"\noverride_layer_configs { layer_name: "fc" }\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_layer_references(doc, MODEL) is None


def test_placeholder_names_in_the_examples_are_errors():
    path = EXAMPLES / "compressed_filter_prune_int8.cfg"
    msg = load_cfg_document(path, "retrain").message
    with pytest.raises(ConfigError) as info:
        check_layer_references(msg, MODEL, path)  # bare message: positions from the file
    assert str(info.value).startswith(f'{path}:11:1: layer type "Optype" in skip_layer_types is not a supported')


def test_skip_entry_position_survives_deduplication():
    with pytest.warns(ConfigWarning):
        doc = doc_of('skip_layers: "conv1"\nskip_layers: "conv1"\nskip_layers: "conv9"\n')
    assert list(doc.message.skip_layers) == ["conv1", "conv9"]
    with pytest.raises(ConfigError) as info:
        check_layer_references(doc, MODEL)
    assert str(info.value).startswith('t.cfg:3:1: layer "conv9" in skip_layers')
