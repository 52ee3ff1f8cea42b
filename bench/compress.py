"""Our compressed-retrain rows of the engine table: BCP filter pruning or 4:2 sparsity, each + INT8 QAT.

Every row starts from the shared FP32 base of bench/fashion.py and gets the same extra epochs on the
same batches as the FP32 row and the Torch-Pruning peers (bench/peers.py, listed next to ours):

- ``amct BCP 30 % / 50 % + INT8``: ``create_compressed_retrain_model`` (balanced L2-norm filter pruning,
  ascend_optimized off: 16/32-channel convs would not shrink otherwise) then QAT; deploy = INT8 ONNX;
- ``amct M4N2 + INT8``: 4-of-2 selective sparsity then QAT (the zeros stay in the dense INT8 file: the
  gain needs a sparse kernel, which onnxruntime on CPU does not have).

Each row also reports parameters and non-zero conv/linear weights after compression.

Run on its own: ``python bench/engine_table.py [--quick] --only compress``.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from amct_engine.prune.selective import bake_selective_masks  # noqa: E402
from amct_engine.prune_retrain import create_compressed_retrain_model, save_compressed_retrain_model  # noqa: E402
from bench import peers  # noqa: E402
from bench.fashion import DYNAMIC_AXES, timed_training, weight_counts  # noqa: E402
from job_process.training import evaluate_accuracy  # noqa: E402

QUANT_CFG = """
retrain_data_quant_config { ulq_quantize { } }
retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }
"""
FILTER_CFG = ("prune_config { filter_pruner { balanced_l2_norm_filter_prune "
              "{ prune_ratio: %s ascend_optimized: false } } }")
M4N2_CFG = "prune_config { n_out_of_m_pruner { l1_selective_prune { n_out_of_m_type: M4N2 update_freq: 0 } } }"
Row = dict[str, Any]


def amct_compressed(setup, name: str, cfg_text: str) -> Row:
    """create_compressed_retrain_model → train → eval forward (fills the record) → save (INT8 deploy ONNX)."""
    workdir = setup.folder(name)
    cfg, record = workdir / "compressed.cfg", workdir / "record.txt"
    cfg.write_text(cfg_text + QUANT_CFG)
    torch.manual_seed(setup.seed + 1)
    start = time.perf_counter()
    model = create_compressed_retrain_model(setup.base_copy(), setup.example, str(cfg), str(record))
    prepare_s = time.perf_counter() - start
    training = timed_training(model, setup.loader(), setup.epochs, setup.lr)
    accuracy = evaluate_accuracy(model, setup.x_test, setup.y_test)  # the eval forward fills the record
    start = time.perf_counter()
    paths = save_compressed_retrain_model(model, str(record), str(workdir / "amct"), setup.example, ["x"],
                                          ["logits"], DYNAMIC_AXES)
    convert_s = time.perf_counter() - start
    baked = copy.deepcopy(model).eval()
    bake_selective_masks(baked)
    return {"torch_accuracy": accuracy, "prepare_s": prepare_s, "convert_s": convert_s, "onnx": paths["deploy"],
            **weight_counts(baked), "params": model.amct_prune_report.params_after,
            "deploy_kind": "amct deploy ONNX", **training}


def methods(setup) -> list[tuple[str, str, Callable[[], Row]]]:
    return [
        ("amct BCP 30 % + INT8", "ours", lambda: amct_compressed(setup, "amct BCP 30", FILTER_CFG % 0.3)),
        ("amct BCP 50 % + INT8", "ours", lambda: amct_compressed(setup, "amct BCP 50", FILTER_CFG % 0.5)),
        ("amct M4N2 + INT8", "ours", lambda: amct_compressed(setup, "amct M4N2", M4N2_CFG)),
        *peers.prune_methods(setup),
    ]
