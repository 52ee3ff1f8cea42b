"""Find the engine's public functions, whichever module of amct_engine ships them.

Distillation and prune / compressed retraining are still landing in the engine: a job kind
whose functions are missing fails with a clear `unsupported` error instead of an ImportError.
"""

from __future__ import annotations

import importlib

# Job kind -> the amct functions its runner calls.
KIND_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "quant_retrain": ("create_quant_retrain_config", "create_quant_retrain_model", "save_quant_retrain_model"),
    "compressed_retrain": ("create_compressed_retrain_model", "save_compressed_retrain_model"),
    "prune_retrain": ("create_prune_retrain_model", "save_prune_retrain_model"),
    "distill": ("create_distill_config", "create_distill_model", "distill", "save_distill_model"),
}
_MODULES = ("amct_engine", "amct_engine.quant_retrain", "amct_engine.prune_retrain",
            "amct_engine.compressed_retrain", "amct_engine.distillation")


class EngineUnavailable(RuntimeError):
    pass


def resolve(name: str):
    for module_name in _MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        fn = getattr(module, name, None)
        if callable(fn):
            return fn
    raise EngineUnavailable(f"this build of amct_engine has no {name} yet")


def missing_functions(kind: str) -> list[str]:
    """The functions `kind` needs that the engine lacks (empty when the kind can run)."""
    missing = []
    for name in KIND_FUNCTIONS[kind]:
        try:
            resolve(name)
        except EngineUnavailable:
            missing.append(name)
    return missing
