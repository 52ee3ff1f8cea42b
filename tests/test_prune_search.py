"""Budgeted channel-prune search on the Fashion-MNIST CNN: the 50 %-MACs target and a cfg the prune API reads."""

from __future__ import annotations

import pytest

from amct_engine.config.cfg_checks import check_cfg_for_api
from amct_engine.config.cfg_loader import load_cfg_document
from amct_engine.prune_search import auto_channel_prune_search

pytestmark = pytest.mark.slow


def test_prune_search_meets_half_the_macs_with_a_prune_cfg(tmp_path, fashion_fp32, fashion_data):
    x_train, y_train, x_test, _ = fashion_data
    events = []
    result = auto_channel_prune_search(fashion_fp32, x_test[:8], [x_train[:256], x_train[256:512]],
                                       x_train[-2000:], y_train[-2000:], 0.5, tmp_path / "prune.cfg",
                                       progress=lambda done, total: events.append((done, total)))
    print(f"\nprune search: {result.ratios}, MACs {result.measured_macs_ratio:.3f}, "
          f"no fine-tune: {result.measured}")
    assert events[-1] == (12, 12)  # 2 prunable groups x 6 ratios
    assert result.measured_macs_ratio <= 0.5
    # The estimate the search steers by is what create_prune_retrain_model then builds.
    assert result.measured_macs_ratio == pytest.approx(result.estimated_macs_ratio, abs=1e-6)
    doc = load_cfg_document(result.cfg_file, "retrain")
    check_cfg_for_api(doc, "prune")
    ratios = {o.layer_name: o.prune_config.filter_pruner.balanced_l2_norm_filter_prune.prune_ratio
              for o in doc.message.override_layer_configs}
    assert ratios == pytest.approx(result.ratios) and set(ratios) <= {"conv1", "conv2"}
    # Greedy steps only ever raise one group's ratio, and the MACs fall with each.
    macs = [s["macs_ratio"] for s in result.steps]
    assert macs == sorted(macs, reverse=True)
