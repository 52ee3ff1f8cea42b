"""The training objectives a retrain job may ask for (torch-free: the API's schema reads them).

What each computes is job_process/objectives.py; docs/service.md, "Training objectives".
"""

from __future__ import annotations

OBJECTIVES = ("cross_entropy", "mse", "l1", "distill_outputs")
DISTILL_LOSSES = ("auto", "kl", "mse", "cosine")


def default_objective(has_labels: bool) -> str:
    return "cross_entropy" if has_labels else "distill_outputs"
