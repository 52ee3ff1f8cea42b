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
from job_host.objective_names import DISTILL_OUTPUTS, default_objective
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
    if entry.llm:
        gates = [name for name in ("max_accuracy_drop", "min_output_cosine") if getattr(params, name) is not None]
        if gates:
            raise JobRuleError(
                f"{kind} jobs report perplexity, not accuracy or output cosine: {gates[0]} does not apply", gates[0]
            )
    elif params.seq_len != JobParams.model_fields["seq_len"].default:
        raise JobRuleError(f"seq_len sets the rows of text of the LLM kinds; a {kind} job takes arrays", "seq_len")
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
    if JOB_KINDS[kind].llm or "text" in description:
        _check_text_data(kind, description, inputs, names)
        return None
    if JOB_KINDS[kind].needs_labels and not description["has_labels"]:
        raise JobRuleError(f"{kind} jobs train on the dataset's labels, which {names[0]} lacks", "dataset_id")
    if JOB_KINDS[kind].trains:
        objective = params.objective or default_objective(description["has_labels"])
    try:
        check_against_model(description, inputs, outputs, objective or "")
    except DatasetError as e:
        raise JobRuleError(f"{names[0]} does not suit {names[1]}: {e}", "dataset_id", **array_of(e)) from None
    if params.distill_alpha < 1 and objective is not None:
        if objective != DISTILL_OUTPUTS:
            raise JobRuleError(
                f"distill_alpha weighs the distillation loss of objective distill_outputs against cross_entropy; "
                f"this job trains with {objective}",
                "distill_alpha",
            )
        if not description["has_labels"]:
            raise JobRuleError(
                f"distill_alpha {params.distill_alpha:g} gives {1 - params.distill_alpha:g} of the loss to "
                "cross_entropy on the dataset's labels, which it lacks; leave distill_alpha at 1",
                "distill_alpha",
            )
    if params.max_accuracy_drop is not None and not description["has_labels"]:
        raise JobRuleError(
            "max_accuracy_drop compares top-1 on the dataset's labels, which it lacks; use min_output_cosine",
            "max_accuracy_drop",
        )
    return objective


def check_model_format(kind: str, fmt: str, what: str) -> None:
    """A Hugging Face folder (service/model_folder.py) goes to the LLM kinds only: the others trace a TorchScript
    model's graph."""
    if fmt == "hf_folder" and not JOB_KINDS[kind].llm:
        able = ", ".join(k.name for k in JOB_KINDS.values() if k.llm)
        raise JobRuleError(f"{what} is a Hugging Face folder, which {kind} jobs cannot take ({able} can)", "model_id")


def _check_text_data(kind: str, description: dict, inputs: list[dict], names: tuple[str, str]) -> None:
    """An LLM kind takes text (job_host/text_data.py) and a model whose one input is token ids; the others
    take arrays."""
    if not JOB_KINDS[kind].llm:
        raise JobRuleError(
            f"{names[0]} is text; {kind} jobs take arrays (.npz, .safetensors); text suits llm_quant", "dataset_id"
        )
    if "text" not in description:
        raise JobRuleError(
            f'{names[0]} holds arrays; {kind} jobs take text (.txt, or .jsonl with a "text" field per line), '
            "tokenised in the job with the model's tokenizer",
            "dataset_id",
        )
    if len(inputs) != 1 or inputs[0]["dtype"] != "int64":
        raise JobRuleError(
            f"{names[1]} takes {len(inputs)} input(s) of {', '.join(i['dtype'] for i in inputs)}; a {kind} job "
            "needs a causal LM whose one input is int64 token ids (input_ids)",
            "model_id",
        )


def array_of(error: DatasetError) -> dict[str, Any]:
    return {"array": error.array} if error.array else {}
