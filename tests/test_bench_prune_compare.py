"""bench/prune_compare.py's paired summary: each recipe against Torch-Pruning + ORT PTQ, seed by seed."""

from __future__ import annotations

import pytest

from bench.prune_compare import paired


def _rows(peer: float, ours: float, ratio: float = 0.5) -> list[dict]:
    pct = f"{round(ratio * 100)} %"
    return [
        {"name": f"Torch-Pruning {pct}", "family": "peer", "ratio": ratio, "accuracy": peer + 0.01},
        {"name": f"Torch-Pruning {pct} + ORT PTQ", "family": "peer", "ratio": ratio, "accuracy": peer},
        {"name": f"amct group-L2 {pct} + INT8", "family": "ours", "ratio": ratio, "accuracy": ours},
    ]


def test_paired_differences_are_taken_seed_by_seed_against_the_ptq_peer():
    # Seed 1's peer is 1 pt better than seed 0's: unpaired means would hide that ours wins on both.
    per_seed = {0: _rows(0.9000, 0.9010), 1: _rows(0.9100, 0.9105), 2: _rows(0.9050, 0.9040)}
    (summary,) = paired(per_seed)
    assert summary["name"] == "amct group-L2 50 % + INT8" and summary["seeds"] == 3
    assert summary["mean_pt"] == pytest.approx((0.10 + 0.05 - 0.10) / 3)
    assert summary["sd_pt"] == pytest.approx(0.1040833, rel=1e-5)
    # t(0.975, 2 degrees of freedom) = 4.3027
    half = 4.302653 * 0.1040833 / 3**0.5
    assert summary["ci95_pt"] == pytest.approx([summary["mean_pt"] - half, summary["mean_pt"] + half], rel=1e-5)
    assert (summary["won"], summary["tied"], summary["lost"]) == (2, 0, 1)


def test_each_ratio_is_paired_with_the_peer_at_that_ratio():
    per_seed = {0: _rows(0.90, 0.90, 0.3) + _rows(0.88, 0.87, 0.5), 1: _rows(0.91, 0.91, 0.3) + _rows(0.88, 0.88, 0.5)}
    by_ratio = {s["ratio"]: s for s in paired(per_seed)}
    assert by_ratio[0.3]["mean_pt"] == pytest.approx(0.0) and by_ratio[0.3]["tied"] == 2
    assert by_ratio[0.5]["mean_pt"] == pytest.approx(-0.5) and by_ratio[0.5]["lost"] == 1
