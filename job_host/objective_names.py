"""The training objectives a retrain job may ask for (torch-free: the API's schema reads them).

What each computes is job_process/objectives.py; docs/service.md, "Training objectives".
"""

from __future__ import annotations

CROSS_ENTROPY, DISTILL_OUTPUTS = "cross_entropy", "distill_outputs"
# the objectives trained against target arrays (named after the outputs, or `targets`) instead of labels
TARGET_OBJECTIVES = ("mse", "l1")
OBJECTIVES = (CROSS_ENTROPY, *TARGET_OBJECTIVES, DISTILL_OUTPUTS)
DISTILL_LOSSES = ("auto", "kl", "mse", "cosine")


def default_objective(has_labels: bool) -> str:
    return CROSS_ENTROPY if has_labels else DISTILL_OUTPUTS
