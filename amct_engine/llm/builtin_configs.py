"""AMCT's built-in LLM configs, under AMCT's names (docs/spec/llm.md §2.2).

``amct.quantize`` never changes the dict it is given, so these can be passed as they are or
copied and edited (``copy.deepcopy``). The INT4 ones are AMCT's per-channel
symmetric configs; ``INT4_*_GROUP32`` are our additions for the group-32 asymmetric setting the
benchmark compares (torchao's and ORT's int4 default shape).
"""

from __future__ import annotations

from typing import Any

INT4_AWQ_WEIGHT_QUANT_CFG: dict[str, Any] = {
    "batch_num": 1,
    "quant_cfg": {"weights": {"type": "int4", "symmetric": True, "strategy": "channel"}},
    "algorithm": {"awq": {"grids_num": 20}},
    "skip_layers": {"lm_head"},
}
INT4_GPTQ_WEIGHT_QUANT_CFG: dict[str, Any] = {
    "batch_num": 1,
    "quant_cfg": {"weights": {"type": "int4", "symmetric": True, "strategy": "channel"}},
    "algorithm": {"gptq"},
    "skip_layers": {"lm_head"},
}
INT8_SMOOTHQUANT_CFG: dict[str, Any] = {
    "batch_num": 1,
    "quant_cfg": {
        "weights": {"type": "int8", "symmetric": True, "strategy": "channel"},
        "inputs": {"type": "int8", "symmetric": True, "strategy": "tensor"},
    },
    "algorithm": {"smoothquant": {"smooth_strength": 0.5}},
    "skip_layers": {"lm_head"},
}
INT8_MINMAX_WEIGHT_QUANT_CFG: dict[str, Any] = {
    "batch_num": 1,
    "quant_cfg": {"weights": {"type": "int8", "symmetric": True, "strategy": "channel"}},
    "algorithm": {"minmax"},
}
_GROUP32 = {"type": "int4", "symmetric": False, "strategy": "group", "group_size": 32}
INT4_AWQ_GROUP32_WEIGHT_QUANT_CFG: dict[str, Any] = {
    "batch_num": 1,
    "quant_cfg": {"weights": dict(_GROUP32)},
    "algorithm": {"awq": {"grids_num": 20}},
    "skip_layers": {"lm_head"},
}
INT4_GPTQ_GROUP32_WEIGHT_QUANT_CFG: dict[str, Any] = {
    "batch_num": 1,
    "quant_cfg": {"weights": dict(_GROUP32)},
    "algorithm": {"gptq"},
    "skip_layers": {"lm_head"},
}
