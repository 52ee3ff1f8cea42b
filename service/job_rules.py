"""The rules a job must pass before it runs, on values alone: what POST /v1/jobs and `amct compress` /
`amct jobs submit` refuse alike, each naming the field at fault.

`check_settings` judges the settings against the kind (and the server's multi-node switch); `check_data`
judges the dataset (its description, service/datasets.py) against the model's signature and outputs and
returns the objective a training kind trains with. The API maps a `JobRuleError` to a 422 problem, the
CLI to one line; the checks on database rows (the model is ready, the cfg suits the kind) are
service/job_submission.py's.
"""

from __future__ import annotations

from typing import Any

from job_host.kinds import JOB_KINDS
from job_host.objective_names import default_objective
from job_host.spec import JobParams
from service.datasets import DatasetError, check_against_model


class JobRuleError(ValueError):
    """A job the rules refuse: `field` is the request field at fault, `extra` more problem+json members."""

    def __init__(self, message: str, field: str, **extra: Any) -> None:
        super().__init__(message)
        self.field, self.extra = field, extra


def check_settings(kind: str, params: JobParams, multinode: bool) -> None:
    """The settings suit the kind: BatchNorm recalibration for the kinds that prune; data-parallel ranks for the
    kinds that train so, on several nodes only where the operator enabled it (docs/scaling.md)."""
    entry = JOB_KINDS[kind]
    if params.bn_recalibration_batches and not entry.prunes:
        raise JobRuleError(
            f"bn_recalibration_batches recalibrates a pruned model's BatchNorms; a {kind} job does not prune "
            "(compressed_retrain and prune_retrain do)",
            "bn_recalibration_batches",
        )
    if params.world_size > 1 and not entry.distributed:
        able = ", ".join(k.name for k in JOB_KINDS.values() if k.distributed)
        raise JobRuleError(f"{kind} jobs run in one process; world_size > 1 suits {able}", "world_size")
    if params.world_size % params.nodes:
        raise JobRuleError(f"world_size {params.world_size} is not a multiple of nodes {params.nodes}", "nodes")
    if params.nodes > 1 and not multinode:
        raise JobRuleError(
            "this server runs every job on one node (jobs across several nodes share the host network in their "
            "sandboxes: AMCT_MULTINODE, docs/security.md)",
            "nodes",
        )


def check_data(
    kind: str, params: JobParams, description: dict, inputs: list[dict], outputs: dict | None, names: tuple[str, str]
) -> str | None:
    """The dataset (`description`) suits the model (`inputs`, `outputs`) and the settings; `names` are the two as
    messages call them. Returns the objective a training kind trains with (the asked one, or the default its
    labels give), None for the others."""
    objective = None
    if JOB_KINDS[kind].needs_labels and not description["has_labels"]:
        raise JobRuleError(f"{kind} jobs train on the dataset's labels, which {names[0]} lacks", "dataset_id")
    if JOB_KINDS[kind].trains:
        objective = params.objective or default_objective(description["has_labels"])
    try:
        check_against_model(description, inputs, outputs, objective or "")
    except DatasetError as e:
        raise JobRuleError(f"{names[0]} does not suit {names[1]}: {e}", "dataset_id", **array_of(e)) from None
    if params.max_accuracy_drop is not None and not description["has_labels"]:
        raise JobRuleError(
            "max_accuracy_drop compares top-1 on the dataset's labels, which it lacks; use min_output_cosine",
            "max_accuracy_drop",
        )
    return objective


def array_of(error: DatasetError) -> dict[str, Any]:
    return {"array": error.array} if error.array else {}
