"""AMCT-compatible model compression engine: ``import amct_engine as amct``.

Same API names, `.cfg` files and JSON configs as Huawei CANN's AMCT (PyTorch classic API).
"""

from amct_engine.config.errors import ConfigError
from amct_engine.distillation import (
    DistillSampleBase,
    ModelSingleTensorInput,
    create_distill_config,
    create_distill_model,
    distill,
    save_distill_model,
)
from amct_engine.graph.capture import GraphCaptureError
from amct_engine.prune.report import PruneReport
from amct_engine.prune_retrain import (
    create_compressed_retrain_model,
    create_prune_retrain_model,
    restore_compressed_retrain_model,
    restore_prune_retrain_model,
    save_compressed_retrain_model,
    save_prune_retrain_model,
)
from amct_engine.quant_retrain import (
    create_quant_retrain_config,
    create_quant_retrain_model,
    restore_quant_retrain_model,
    save_quant_retrain_model,
)

__all__ = [
    "PruneReport",
    "create_compressed_retrain_model",
    "create_prune_retrain_model",
    "restore_compressed_retrain_model",
    "restore_prune_retrain_model",
    "save_compressed_retrain_model",
    "save_prune_retrain_model",
    "ConfigError",
    "DistillSampleBase",
    "ModelSingleTensorInput",
    "create_distill_model",
    "distill",
    "save_distill_model",
    "GraphCaptureError",
    "create_distill_config",
    "create_quant_retrain_config",
    "create_quant_retrain_model",
    "restore_quant_retrain_model",
    "save_quant_retrain_model",
]
