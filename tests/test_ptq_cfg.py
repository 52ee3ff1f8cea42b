"""The PTQ calibration .cfg (AMCTConfig) and the PTQ JSON: parsed, resolved, and errors at their position."""

from __future__ import annotations

import pytest

from amct_engine.config.calibration_cfg import parse_calibration_cfg, resolve_ptq_layers
from amct_engine.config.errors import ConfigError

CFG = """\
batch_num: 2
activation_offset: false
skip_layers: "fc2"
common_config { hfmg_quantize { num_of_bins: 2048 } arq_quantize { channel_wise: true } }
override_layer_types { layer_type: "Linear" calibration_config { arq_quantize { quant_bits: 4 } } }
override_layer_configs {
  layer_name: "conv1"
  calibration_config { ifmr_quantize { search_step: 0.02 dst_type: INT16 } }
}
"""
TYPES = {"conv1": "Conv2d", "conv2": "Conv2d", "fc": "Linear", "fc2": "Linear"}


def test_cfg_resolves_layer_over_type_over_common_and_skips():
    msg = parse_calibration_cfg(CFG).message
    assert (msg.batch_num, msg.activation_offset) == (2, False)
    specs = resolve_ptq_layers(msg, TYPES)
    assert (specs["conv1"].act_algo, specs["conv1"].act_bits, specs["conv1"].search_step) == (
        "ifmr",
        16,
        pytest.approx(0.02),
    )
    assert (specs["conv2"].act_algo, specs["conv2"].num_of_bins, specs["conv2"].wts_bits) == ("hfmg", 2048, 8)
    assert (specs["fc"].act_algo, specs["fc"].wts_bits, specs["fc"].enabled) == ("hfmg", 4, True)
    assert not specs["fc2"].enabled


@pytest.mark.parametrize(
    ("text", "where", "words"),
    [
        (
            "batch_num: 1\ncommon_config { hfmg_quantize { num_of_bins: 1000 } }\n",
            (2, 33),
            "num_of_bins must be one of",
        ),
        ("common_config {\n  arq_quantize { quant_bits: 3 }\n}\n", (2, 18), "quant_bits must be 4 or 8"),
        ("common_config { ifmr_quantize { dst_type: INT16 } arq_quantize { quant_bits: 4 } }\n", (1, 33), "A16W4"),
        ('override_layer_configs { layer_name: "a" }\n', (1, 1), 'missing required field "calibration_config"'),
        ("common_config { ifmr_quantize { serch_step: 0.1 } }\n", (1, 33), "search_step"),
        (
            'override_layer_types { layer_type: "Linear" calibration_config {} }\n'
            'override_layer_types { layer_type: "Linear" calibration_config {} }\n',
            (2, 24),
            "more than one",
        ),
        ("search_config {\n  target_macs_ratio: 1.5\n}\n", (2, 3), "target_macs_ratio must lie in (0, 1)"),
        ("search_config { prune_ratios: 0.5 prune_ratios: 1.0 }\n", (1, 35), "a prune ratio must lie in (0, 1), got 1"),
        ("search_config { max_top1_drop: -1 }\n", (1, 17), "max_top1_drop must be >= 0"),
    ],
)
def test_cfg_errors_name_the_field_at_its_position(text, where, words):
    with pytest.raises(ConfigError) as err:
        parse_calibration_cfg(text, "ptq.cfg")
    assert (err.value.line, err.value.column) == where, str(err.value)
    assert words in str(err.value) and str(err.value).startswith(f"ptq.cfg:{where[0]}:{where[1]}")


def test_search_settings_default_to_a_top1_budget_with_labels_and_cosine_without():
    from amct_engine.config.calibration_cfg import search_settings

    empty = parse_calibration_cfg("batch_num: 1\n").message
    assert search_settings(empty, labelled=True)["budget"] == {"max_top1_drop": 0.5}
    assert search_settings(empty, labelled=False)["budget"] == {"min_cosine": 0.99}
    msg = parse_calibration_cfg("search_config { min_cosine: 0.995 precisions: INT4 prune_ratios: 0.25 }\n").message
    settings = search_settings(msg, labelled=True)
    assert settings["budget"] == {"min_cosine": pytest.approx(0.995)} and settings["precisions"] == ["INT4"]
    assert settings["prune_ratios"] == [0.25] and settings["target_macs_ratio"] == 0.5


def test_a_calibration_cfg_nested_too_deep_is_a_config_error_at_its_line():
    """The calibration kind goes through the same syntax pass as the others (it once had a copy without
    the nesting guard: protobuf's recursion then raised past our error)."""
    from amct_engine.config.cfg_loader import parse_cfg_document
    from amct_engine.config.errors import ConfigError

    text = "batch_num: 1\n" + "".join(f"{'  ' * i}common_config {{\n" for i in range(2000))
    with pytest.raises(ConfigError) as raised:
        parse_cfg_document(text, "calibration", "deep.cfg")
    assert "nested more than" in str(raised.value) and raised.value.line == 34
