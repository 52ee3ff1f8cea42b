"""AMCT-compatible model compression engine: ``import amct_engine as amct``.

Same API names, `.cfg` files and JSON configs as Huawei CANN's AMCT (PyTorch classic API).

The names below load on first use (PEP 562): ``import amct_engine.config.cfg_loader`` or
``amct_engine.registry`` does not import torch, so the API process can parse a `.cfg` and read
the engine's tables without it.
"""

from __future__ import annotations

from amct_engine.registry import lazy_exports

# Public name -> the module that defines it.
_EXPORTS = {
    "ConfigError": "amct_engine.config.errors",
    "DistillSampleBase": "amct_engine.distillation",
    "ModelSingleTensorInput": "amct_engine.distillation",
    "create_distill_config": "amct_engine.distillation",
    "create_distill_model": "amct_engine.distillation",
    "distill": "amct_engine.distillation",
    "save_distill_model": "amct_engine.distillation",
    "GraphCaptureError": "amct_engine.graph.capture",
    "quantize": "amct_engine.llm.api",
    "convert": "amct_engine.llm.api",
    "export_onnx": "amct_engine.llm.onnx_export",
    "INT4_AWQ_WEIGHT_QUANT_CFG": "amct_engine.llm.builtin_configs",
    "INT4_GPTQ_WEIGHT_QUANT_CFG": "amct_engine.llm.builtin_configs",
    "INT8_SMOOTHQUANT_CFG": "amct_engine.llm.builtin_configs",
    "INT8_MINMAX_WEIGHT_QUANT_CFG": "amct_engine.llm.builtin_configs",
    "INT4_AWQ_GROUP32_WEIGHT_QUANT_CFG": "amct_engine.llm.builtin_configs",
    "INT4_GPTQ_GROUP32_WEIGHT_QUANT_CFG": "amct_engine.llm.builtin_configs",
    "PruneReport": "amct_engine.prune.report",
    "create_compressed_retrain_model": "amct_engine.prune_retrain",
    "create_prune_retrain_model": "amct_engine.prune_retrain",
    "restore_compressed_retrain_model": "amct_engine.prune_retrain",
    "restore_prune_retrain_model": "amct_engine.prune_retrain",
    "save_compressed_retrain_model": "amct_engine.prune_retrain",
    "save_prune_retrain_model": "amct_engine.prune_retrain",
    "create_quant_config": "amct_engine.ptq",
    "quantize_model": "amct_engine.ptq",
    "save_model": "amct_engine.ptq",
    "create_quant_retrain_config": "amct_engine.quant_retrain",
    "create_quant_retrain_model": "amct_engine.quant_retrain",
    "restore_quant_retrain_model": "amct_engine.quant_retrain",
    "save_quant_retrain_model": "amct_engine.quant_retrain",
}
__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
