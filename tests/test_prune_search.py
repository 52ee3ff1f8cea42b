"""Budgeted channel-prune search on the Fashion-MNIST CNN: the 50 %-MACs target, a cfg the prune API reads,
and the accuracy after retraining against uniform BCP."""

from __future__ import annotations

import copy

import pytest
import torch

from amct_engine.config.cfg_checks import check_cfg_for_api
from amct_engine.config.cfg_loader import load_cfg_document
from amct_engine.prune_retrain import create_prune_retrain_model
from amct_engine.prune_search import auto_channel_prune_search
from job_process.training import evaluate_accuracy, make_loader, train_epochs

pytestmark = pytest.mark.slow


def test_prune_search_meets_half_the_macs_with_a_prune_cfg(tmp_path, fashion_fp32, fashion_data):
    x_train, y_train, x_test, _ = fashion_data
    events = []
    result = auto_channel_prune_search(
        fashion_fp32,
        x_test[:8],
        [x_train[:256], x_train[256:512]],
        x_train[-2000:],
        y_train[-2000:],
        0.5,
        tmp_path / "prune.cfg",
        progress=lambda done, total: events.append((done, total)),
    )
    print(f"\nprune search: {result.ratios}, MACs {result.measured_macs_ratio:.3f}, no fine-tune: {result.measured}")
    # 2 prunable groups x 6 ratios measured alone, then the best-estimated choices measured whole.
    measured = 12 + len(result.choices)
    assert 1 <= len(result.choices) <= 8 and events[-1] == (measured, measured)
    # The cfg is the choice that measured least damaged whole, whatever the summed estimate said.
    best = min(result.choices, key=lambda c: c["damage"])
    assert best["ratios"] == result.ratios and result.measured["top1_drop"] == pytest.approx(best["damage"])
    assert result.measured_macs_ratio <= 0.5
    # The estimate the search steers by is what create_prune_retrain_model then builds.
    assert result.measured_macs_ratio == pytest.approx(result.estimated_macs_ratio, abs=1e-6)
    doc = load_cfg_document(result.cfg_file, "retrain")
    check_cfg_for_api(doc, "prune")
    ratios = {
        o.layer_name: o.prune_config.filter_pruner.balanced_l2_norm_filter_prune.prune_ratio
        for o in doc.message.override_layer_configs
    }
    assert ratios == pytest.approx(result.ratios) and set(ratios) <= {"conv1", "conv2"}
    # The choice applied group by group: the MACs fall with each group.
    macs = [s["macs_ratio"] for s in result.steps]
    assert macs == sorted(macs, reverse=True)
    # Each group's damage never falls as more of it is cut (a dip would be noise the choice chases).
    for group in ("conv1", "conv2"):
        damages = [d["damage"] for d in result.damages if d["group"] == [group]]
        assert len(damages) == 6 and damages == sorted(damages)


def test_prune_search_retrains_at_least_as_well_as_uniform_half_bcp(tmp_path, fashion_fp32, fashion_data):
    """Issue 20: at a 50 % MACs target, the searched cfg retrained one epoch reaches at least the top-1 of
    uniform 50 % BCP (every group at ratio 0.5) retrained the same way: same data order, lr and BatchNorm
    re-estimation (bench/prune_search.py's setting, on this suite's base model: its seed 0; seed 1's base is
    in docs/benchmarks.md, "Prune search vs uniform BCP")."""
    x_train, y_train, x_test, y_test = fashion_data
    calibration = [x_train[i : i + 128] for i in range(0, 512, 128)]
    result = auto_channel_prune_search(
        fashion_fp32, x_test[:8], calibration, x_train[-2000:], y_train[-2000:], 0.5, tmp_path / "search.cfg"
    )
    uniform = tmp_path / "uniform.cfg"
    uniform.write_text(
        "prune_config { filter_pruner { balanced_l2_norm_filter_prune "
        "{ prune_ratio: 0.5 ascend_optimized: false } } }\n"
    )
    accuracy = {}
    for name, cfg in (("search", result.cfg_file), ("uniform", uniform)):
        torch.manual_seed(1)
        model = create_prune_retrain_model(
            copy.deepcopy(fashion_fp32),
            x_test[:8],
            str(cfg),
            str(tmp_path / f"{name}_record.txt"),
            calibration_data=calibration,
        )
        train_epochs(model, make_loader(x_train[:20000], y_train[:20000], 128, seed=1), 1, 5e-4)
        accuracy[name] = evaluate_accuracy(model, x_test, y_test)
    print(
        f"\nafter one epoch: search {result.ratios} (MACs {result.measured_macs_ratio:.3f}) "
        f"{accuracy['search']:.4f}, uniform 50 % BCP {accuracy['uniform']:.4f}"
    )
    assert result.measured_macs_ratio <= 0.5
    assert accuracy["search"] >= accuracy["uniform"]
