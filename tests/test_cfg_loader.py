"""The .cfg loader: real protobuf text_format parsing, errors with exact positions."""

from __future__ import annotations

import pickle
import textwrap
from pathlib import Path

import pytest

from amct_engine.config.cfg_loader import (
    CfgDocument,
    load_cfg_document,
    load_distill_cfg,
    load_retrain_cfg,
    parse_cfg_document,
    parse_distill_cfg_text,
    parse_retrain_cfg_text,
)
from amct_engine.config.errors import ConfigError
from amct_engine.proto import distill_config_pytorch_pb2, retrain_config_pytorch_pb2

EXAMPLES = Path(__file__).parent / "fixtures" / "cfg"  # copies of ../shared/examples


def cfg(text: str) -> str:
    """Inline cfg text: line 1 is the first line after the opening quotes."""
    return textwrap.dedent(text).lstrip("\n")


def parse_error(text: str, kind: str = "retrain") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_cfg_document(cfg(text), kind, "t.cfg")
    return info.value


def assert_error(err: ConfigError, line: int, column: int, field: str | None, *fragments: str) -> None:
    assert (err.line, err.column, err.field) == (line, column, field), str(err)
    assert str(err) == f"t.cfg:{line}:{column}: {err.message}"
    for fragment in fragments:
        assert fragment in err.message, err.message


# ----------------------------------------------------------------------------- examples


def test_compressed_filter_prune_example_loads():
    msg = load_retrain_cfg(EXAMPLES / "compressed_filter_prune_int8.cfg")
    assert isinstance(msg, retrain_config_pytorch_pb2.AMCTRetrainConfig)
    bcp = msg.prune_config.filter_pruner.balanced_l2_norm_filter_prune
    assert bcp.prune_ratio == pytest.approx(0.3) and bcp.ascend_optimized
    assert list(msg.skip_layer_types) == ["Optype"] and list(msg.quant_skip_layers) == ["Opname"]
    assert msg.retrain_weight_quant_config.arq_retrain.channel_wise
    override = msg.override_layer_types[0]
    assert override.layer_type == "Optype"
    assert override.retrain_data_quant_config.ulq_quantize.clip_max_min.clip_min == -6.0
    assert override.prune_config.filter_pruner.balanced_l2_norm_filter_prune.prune_ratio == pytest.approx(0.5)


def test_compressed_m4n2_example_loads():
    msg = load_retrain_cfg(EXAMPLES / "compressed_m4n2_int8.cfg")
    selective = msg.prune_config.n_out_of_m_pruner.l1_selective_prune
    assert selective.n_out_of_m_type == retrain_config_pytorch_pb2.M4N2 and selective.update_freq == 0
    override = msg.override_layer_types[0].prune_config.n_out_of_m_pruner.l1_selective_prune
    assert override.update_freq == 1
    assert msg.retrain_weight_quant_config.arq_retrain.dst_type == retrain_config_pytorch_pb2.INT8


def test_distill_full_example_loads():
    msg = load_distill_cfg(EXAMPLES / "distill_full.cfg")
    assert isinstance(msg, distill_config_pytorch_pb2.AMCTDistillConfig)
    assert (msg.batch_num, msg.group_size, msg.data_dump) == (1, 1, True)
    assert (msg.distill_group[0].start_layer_name, msg.distill_group[0].end_layer_name) == (
        "layer1",
        "layer2",
    )
    assert msg.distill_data_quant_config.ulq_quantize.clip_max_min.clip_max == 6.0
    assert msg.distill_override_layers[0].layer_name == "layer4"
    assert msg.distill_override_layer_types[0].distill_weight_quant_config.HasField("ulq_distill")


def test_distill_minimal_example_loads_with_defaults():
    msg = load_distill_cfg(EXAMPLES / "distill_minimal.cfg")
    assert msg.data_dump is True
    assert (msg.batch_num, msg.group_size) == (1, 1)  # proto defaults, docs/spec/engine.md §2.1
    assert not msg.HasField("distill_data_quant_config")


def test_example_document_knows_positions():
    doc = load_cfg_document(EXAMPLES / "distill_full.cfg", "distill")
    assert doc.position_of("distill_group[0].end_layer_name") == (7, 5)
    assert doc.position_of("distill_override_layer_types[0].distill_weight_quant_config.ulq_distill") == (
        59,
        9,
    )
    # Fields left at their default are not in the file: locate() falls back to the block.
    assert doc.position_of("distill_override_layers[0].distill_weight_quant_config.arq_distill.fixed") is None
    assert doc.locate("distill_override_layers[0].distill_weight_quant_config.arq_distill.fixed") == (40, 9)


# ----------------------------------------------------------------------------- accepted syntax


def test_enum_values_by_name_or_number():
    by_name = parse_retrain_cfg_text(
        "prune_config { n_out_of_m_pruner { l1_selective_prune { n_out_of_m_type: M4N2 } } }"
    )
    by_number = parse_retrain_cfg_text(
        "prune_config { n_out_of_m_pruner { l1_selective_prune { n_out_of_m_type: 0 } } }"
    )
    assert by_name == by_number
    assert by_number.prune_config.n_out_of_m_pruner.l1_selective_prune.HasField("n_out_of_m_type")
    msg = parse_retrain_cfg_text("retrain_weight_quant_config { arq_retrain { dst_type: 0 } }")
    assert msg.retrain_weight_quant_config.arq_retrain.dst_type == retrain_config_pytorch_pb2.INT4


def test_text_format_variants_are_accepted():
    msg = parse_retrain_cfg_text(
        cfg(
            """
            # comments, "<...>" blocks, ';' and ',' separators, the list form and int for float
            batch_num: 4;
            skip_layers: ["a", 'b'], quant_skip_layers: "c" "d"
            retrain_data_quant_config < ulq_quantize < clip_max_min { clip_max: 6 clip_min: -6.0f } > >
            fakequant_precision_mode: FORCE_FP16_QUANT
            """
        )
    )
    assert msg.batch_num == 4 and list(msg.skip_layers) == ["a", "b"] and list(msg.quant_skip_layers) == ["cd"]
    assert msg.retrain_data_quant_config.ulq_quantize.clip_max_min.clip_max == 6.0
    assert msg.fakequant_precision_mode == retrain_config_pytorch_pb2.AMCTRetrainConfig.FORCE_FP16_QUANT


def test_empty_text_gives_defaults():
    assert parse_retrain_cfg_text("").batch_num == 1
    assert parse_distill_cfg_text("# only a comment\n").group_size == 1


def test_list_form_elements_are_located_at_themselves():
    doc = parse_cfg_document('skip_layers: ["a", "b"]\nskip_layers: "c"\n', "retrain")
    assert [doc.position_of(f"skip_layers[{i}]") for i in range(3)] == [(1, 15), (1, 20), (2, 1)]


def test_bytes_and_utf8_bom_are_accepted(tmp_path):
    path = tmp_path / "bom.cfg"
    path.write_bytes(b"\xef\xbb\xbfbatch_num: 3\n")
    assert load_retrain_cfg(path).batch_num == 3
    assert parse_cfg_document(b"batch_num: 2", "retrain").message.batch_num == 2


# ----------------------------------------------------------------------------- syntax errors


def test_unknown_field_from_a_file_names_the_path_as_given(tmp_path, monkeypatch):
    (tmp_path / "retrain.cfg").write_text(
        cfg(
            """
            # QAT with a typo
            batch_num: 1
            retrain_weight_quant_config {
                arq_retrain { channel_wise: true }
            }

                prune_rato: 0.3
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_retrain_cfg("retrain.cfg")
    err = info.value
    assert str(err) == 'retrain.cfg:7:5: unknown field "prune_rato" in AMCTRetrainConfig (did you mean "prune_config"?)'
    assert (err.path, err.line, err.column, err.field) == ("retrain.cfg", 7, 5, "prune_rato")
    assert isinstance(err, ValueError)


def test_unknown_nested_field_suggests_the_close_name():
    err = parse_error(
        """
        override_layer_configs {
          layer_name: "conv1"
          prune_config { filter_pruner { balanced_l2_norm_filter_prune {
            prune_ration: 0.3
          } } }
        }
        """
    )
    assert_error(
        err,
        4,
        5,
        "override_layer_configs[0].prune_config.filter_pruner.balanced_l2_norm_filter_prune.prune_ration",
        'unknown field "prune_ration" in BalancedL2NormFilterPruner (did you mean "prune_ratio"?)',
    )


def test_wrong_enum_name():
    err = parse_error(
        """
        retrain_weight_quant_config {
          arq_retrain { dst_type: INT3 }
        }
        """
    )
    assert_error(
        err,
        2,
        27,
        "retrain_weight_quant_config.arq_retrain.dst_type",
        "invalid value INT3",
        "one of INT4, INT8, INT16",
    )


def test_enum_number_out_of_range():
    err = parse_error("prune_config { n_out_of_m_pruner { l1_selective_prune { n_out_of_m_type: 3 } } }")
    assert_error(err, 1, 74, "prune_config.n_out_of_m_pruner.l1_selective_prune.n_out_of_m_type", "one of M4N2")


def test_int16_does_not_exist_for_distillation():
    err = parse_error("distill_data_quant_config { ulq_quantize { dst_type: INT16 } }", "distill")
    assert_error(err, 1, 54, "distill_data_quant_config.ulq_quantize.dst_type", "INT16", "one of INT4, INT8")


def test_bad_value_type():
    err = parse_error("batch_num: 1\ngroup_size: two\n", "distill")
    assert_error(err, 2, 13, "group_size", 'invalid value two for field "group_size"', "unsigned integer")


def test_negative_value_for_unsigned_field():
    assert_error(parse_error("batch_num: -1"), 1, 12, "batch_num", "(out of range)")


def test_bad_bool():
    err = parse_error("retrain_data_quant_config {\n  ulq_quantize { fixed_min: yes }\n}\n")
    assert_error(err, 2, 29, "retrain_data_quant_config.ulq_quantize.fixed_min", "expected true or false")


def test_unquoted_string_in_a_list():
    err = parse_error('skip_layers: ["conv1", fc]')
    assert_error(err, 1, 24, "skip_layers[1]", 'invalid value fc for field "skip_layers"', "quoted string")


def test_unterminated_string():
    err = parse_error('quant_skip_layers: "conv1\n')
    assert_error(err, 1, 20, "quant_skip_layers[0]", "closing quote is missing")


def test_two_algorithms_in_one_oneof():
    err = parse_error(
        """
        retrain_weight_quant_config {
          arq_retrain { dst_type: INT8 }
          ulq_retrain { dst_type: INT8 }
        }
        """
    )
    assert_error(
        err,
        3,
        3,
        "retrain_weight_quant_config.ulq_retrain",
        '"ulq_retrain" cannot be set together with "arq_retrain"',
        'oneof "weights_retrain_algo"',
    )


def test_two_prune_kinds_in_one_scope():
    err = parse_error(
        """
        prune_config {
          filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.3 } }
          n_out_of_m_pruner { l1_selective_prune { } }
        }
        """
    )
    assert_error(err, 3, 3, "prune_config.n_out_of_m_pruner", 'with "filter_pruner"')


def test_scalar_given_twice():
    err = parse_error("batch_num: 1\nbatch_num: 2\n")
    # protobuf points at the second value; we point at the second field name.
    assert_error(err, 2, 1, "batch_num", 'field "batch_num" is given more than once', "first at 1:1")


def test_message_given_twice_inside_an_override():
    err = parse_error(
        """
        override_layer_configs {
          layer_name: "conv1"
          retrain_data_quant_config { ulq_quantize { } }
          retrain_data_quant_config { ulq_quantize { } }
        }
        """
    )
    assert_error(err, 4, 3, "override_layer_configs[0].retrain_data_quant_config", "first at 3:3")


def test_unclosed_brace_at_end_of_file():
    err = parse_error(
        """
        batch_num: 2
        prune_config {
          filter_pruner {
            balanced_l2_norm_filter_prune { prune_ratio: 0.3 }
        }
        """
    )
    assert_error(err, 2, 1, "prune_config", 'block "prune_config" is never closed', '"}" is missing')


def test_unclosed_brace_before_a_later_field():
    err = parse_error(
        """
        prune_config {
          filter_pruner {
            balanced_l2_norm_filter_prune { prune_ratio: 0.3 }
        }
        batch_num: 2
        """
    )
    # protobuf sees batch_num inside prune_config; we say which block is still open.
    assert_error(
        err,
        5,
        1,
        "prune_config.batch_num",
        'unknown field "batch_num" in PruneConfig',
        '"batch_num" is a field of AMCTRetrainConfig: is a "}" missing to close "prune_config" opened at 1:1?',
    )


def test_extra_closing_brace():
    err = parse_error("batch_num: 2\nprune_config { }\n}\n")
    assert_error(err, 3, 1, None, 'unexpected "}"')


def test_missing_colon():
    assert_error(parse_error("batch_num 3"), 1, 11, "batch_num", 'missing ":" between field "batch_num"')


def test_scalar_field_written_as_a_block():
    assert_error(parse_error("batch_num { }"), 1, 11, "batch_num", "holds a single value, not a block")


def test_message_field_written_as_a_value():
    assert_error(parse_error("prune_config: 3"), 1, 15, "prune_config", "is a message (PruneConfig)")


# ----------------------------------------------------------------------------- required fields


def test_missing_clip_min():
    err = parse_error(
        """
        retrain_data_quant_config {
          ulq_quantize {
            clip_max_min { clip_max: 6 }
          }
        }
        """
    )
    assert_error(
        err,
        3,
        5,
        "retrain_data_quant_config.ulq_quantize.clip_max_min.clip_min",
        'missing required field "clip_min"',
    )


def test_missing_prune_ratio():
    err = parse_error("prune_config {\n  filter_pruner {\n    balanced_l2_norm_filter_prune {}\n  }\n}\n")
    assert_error(
        err,
        3,
        5,
        "prune_config.filter_pruner.balanced_l2_norm_filter_prune.prune_ratio",
        'missing required field "prune_ratio" in balanced_l2_norm_filter_prune',
    )


def test_missing_override_layer_name_reports_the_first_in_file():
    err = parse_error(
        """
        override_layer_types { layer_type: "Conv2d" }
        override_layer_configs { retrain_weight_quant_config { arq_retrain {} } }
        """
    )
    assert_error(err, 2, 1, "override_layer_configs[0].layer_name", 'missing required field "layer_name"')


def test_missing_distill_group_end():
    err = parse_error('batch_num: 2\ndistill_group { start_layer_name: "conv1" }\n', "distill")
    assert_error(err, 2, 1, "distill_group[0].end_layer_name", 'missing required field "end_layer_name"')


# ----------------------------------------------------------------------------- files and errors


def test_missing_file_raises_file_not_found(tmp_path):
    missing = tmp_path / "nope.cfg"
    with pytest.raises(FileNotFoundError) as info:
        load_distill_cfg(missing)
    assert info.value.filename == str(missing) and str(missing) in str(info.value)


def test_invalid_utf8_is_located(tmp_path):
    path = tmp_path / "latin1.cfg"
    path.write_bytes(b'batch_num: 1\nskip_layers: "caf\xe9"\n')
    with pytest.raises(ConfigError) as info:
        load_retrain_cfg(path)
    assert (info.value.line, info.value.column) == (2, 18)
    assert str(info.value).startswith(f"{path}:2:18: ")


def test_config_error_rendering_and_pickling():
    err = ConfigError("something is wrong", "a/b.cfg", 3, 7, "batch_num")
    assert str(err) == "a/b.cfg:3:7: something is wrong"
    assert str(ConfigError("no position", "a.cfg")) == "a.cfg: no position"
    assert str(ConfigError("line only", "a.cfg", 2)) == "a.cfg:2: line only"
    back = pickle.loads(pickle.dumps(err))
    assert (back.message, back.path, back.line, back.column, back.field) == (
        "something is wrong",
        "a/b.cfg",
        3,
        7,
        "batch_num",
    )


def test_document_from_message_without_text_has_no_positions():
    doc = CfgDocument.of(retrain_config_pytorch_pb2.AMCTRetrainConfig())
    assert doc.path == "<config>" and doc.locate("batch_num") is None
    err = doc.error("batch_num", "bad")
    assert (err.line, err.column, str(err)) == (None, None, "<config>: bad")


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="kind"):
        parse_cfg_document("", "quantise")
    # The PTQ cfg (docs/spec/engine.md §2.5) is a kind of its own.
    assert parse_cfg_document("batch_num: 3", "calibration").message.batch_num == 3
