"""A job's spec, typed once: what the API stores, what the worker and `amct compress` write to spec.json, and
what the job process reads (docs/architecture.md, "The job spec").

`JobParams` are a job's settings with their bounds and defaults, the one place either is written: the API's
request body (service/schemas.py `JobCreate`) extends it, the `jobs.params` column holds its dump, and the
job process reads it back with every default filled in. `JobSpec` is spec.json: the params and what the
job runs on (kind, device, the model's signature and outputs, the files). Torch-free: the API imports it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError, core_schema

from amct_engine.export.deploy_target import DEFAULT_DEPLOY_TARGET, deploy_target_names
from amct_engine.export.formats import DEFAULT_DEPLOY_FORMAT, DEPLOY_FORMATS
from job_host.objective_names import DISTILL_LOSSES, OBJECTIVES
from job_host.protocol import SPEC_FILE
from job_host.signature import from_input_shape


@dataclass(frozen=True)
class OneOf:
    """`Annotated[str, OneOf(table.names)]`: a string that must name an entry of a table, and whose
    OpenAPI `enum` lists the entries the table holds when the document is rendered.

    `check=False` documents the values without refusing others: a response may carry a job of a kind
    that has been unregistered since (a removed plugin) and must still be listed, not fail.
    """

    names: Callable[[], Iterable[str]]
    check: bool = True

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        if not self.check:
            return handler(source)
        # Any input reaches _validate, so a number gets the list of names too, as a Literal would answer.
        return core_schema.no_info_plain_validator_function(self._validate, json_schema_input_schema=handler(source))

    def _validate(self, value: object) -> str:
        names = tuple(self.names())
        if not isinstance(value, str) or value not in names:
            # Worded as pydantic words a Literal's error: 'a', 'b' or 'c'.
            quoted = [repr(n) for n in names] or ["nothing"]
            expected = " or ".join(filter(None, [", ".join(quoted[:-1]), quoted[-1]]))
            raise PydanticCustomError("enum", "Input should be {expected}", {"expected": expected})
        return value

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> Any:
        json_schema = handler(schema)
        json_schema["enum"] = list(self.names())
        return json_schema


def validation_message(error: Any) -> str:
    """A pydantic error's message without the prefix pydantic puts on a validator's own words ("Value error, …"):
    what the API's 422 and the CLI say."""
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return message


DeployFormat = Annotated[str, OneOf(DEPLOY_FORMATS.names)]
DeployTarget = Annotated[str, OneOf(deploy_target_names)]
# (tuples of the names: a Literal over them, as pydantic reads it; mypy cannot see a tuple's values)
Objective = Literal[OBJECTIVES]  # type: ignore[valid-type]
DistillLoss = Literal[DISTILL_LOSSES]  # type: ignore[valid-type]

# Settings stored only when they are not at their default, so a job's params show what was asked for (the
# node count goes with the ranks: stored whenever there are several).
_STORED_WHEN_SET = {
    "bn_recalibration_batches": ("bn_recalibration_batches", 0),
    "world_size": ("world_size", 1),
    "nodes": ("world_size", 1),
    "seq_len": ("seq_len", 256),
    "distill_alpha": ("distill_alpha", 1.0),
}
# Settings of the objective, stored only for the kinds that train (objective not None).
_OBJECTIVE_SETTINGS = ("objective", "distill_loss", "temperature", "distill_alpha")


class JobParams(BaseModel):
    """A job's settings (docs/service.md, `POST /v1/jobs`)."""

    # strict: JSON true is not the integer 1, nor "2" the integer 2 (a typo must be a 422, not a guess)
    model_config = ConfigDict(extra="forbid", strict=True)

    epochs: int = Field(1, ge=1, le=1000)
    batch_size: int = Field(64, ge=1, le=65536)
    lr: float = Field(1e-3, gt=0, le=10)
    eval_fraction: float = Field(0.1, ge=0, lt=1, description="held-out share of the dataset for the report")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    deploy_format: DeployFormat = Field(
        DEFAULT_DEPLOY_FORMAT, description="deploy model layout (GET /v1/meta lists each format with what it is for)"
    )
    deploy_target: DeployTarget = Field(
        DEFAULT_DEPLOY_TARGET,
        description="CPU the onnx deploy model is written for: int8 weights for VNNI x86 and ARM (x86_amx: "
        "big convs on onnxruntime's AMX kernels), 7-bit int8 conv codes for x86 without VNNI (x86_avx2: its fast "
        "kernels sum them exactly), 7-bit Linear weights as well (x86_avx2_reduce_range: faster transformers, "
        "not exact to the PyTorch model), the record's codes as uint8 + 128 on its slower exact kernels "
        "(x86_avx2_u8u8); "
        "auto: the worker's CPU (report.json's `deploy.deploy_target` says which)",
    )
    objective: Objective | None = Field(
        None,
        description="what a retrain kind trains for: cross_entropy (against `labels`), mse / l1 (against "
        "target arrays named after the outputs, or `targets`), distill_outputs (match the "
        "original FP32 model's outputs on the same batch, no labels needed). Default: "
        "cross_entropy when the dataset has labels, else distill_outputs",
    )
    distill_loss: DistillLoss = Field(
        "auto",
        description="distill_outputs per output: kl (temperature-softened class distributions), mse, "
        "cosine; auto: kl for a classifier's logits (a dataset with labels), mse otherwise",
    )
    temperature: float = Field(4.0, gt=0, le=100, description="the kl temperature of distill_outputs")
    distill_alpha: float = Field(
        1.0,
        ge=0,
        le=1,
        description="distill_outputs with labels: the weight of the distillation loss, 1 - distill_alpha that of "
        "cross_entropy on `labels`; knowledge distillation's KD + CE mix, on the first output (0.5 with "
        "temperature 2: docs/service.md's transformer walkthrough). Needs a dataset with labels when below 1. "
        "Default 1: distillation alone",
    )
    bn_recalibration_batches: int = Field(
        0,
        ge=0,
        le=1000,
        description="the kinds that prune (compressed_retrain, prune_retrain): re-estimate every "
        "BatchNorm's statistics on this many training batches right after the channels "
        "go, before training (no labels needed; the engine's calibration_data). These "
        'batches also feed a data-driven importance criterion (importance: "taylor" '
        "in the cfg). Default 0: off",
    )
    max_accuracy_drop: float | None = Field(
        None,
        ge=0,
        le=1,
        description="quality gate: fail the job (error.type quality_gate, artifacts kept) when "
        "the deploy model's held-out top-1 is more than this below the FP32 model's "
        "(needs labels). Default: off",
    )
    min_output_cosine: float | None = Field(
        None,
        ge=-1,
        le=1,
        description="quality gate: fail the job when the mean cosine of the deploy model's "
        "outputs to the FP32 model's, on the held-out split, is below this (the "
        "lowest output). Default: off",
    )
    world_size: int = Field(
        1,
        ge=1,
        le=64,
        description="data-parallel ranks (torch.distributed: gloo on cpu, nccl on cuda, hccl on "
        "npu), each training on its slice of every `batch_size` batch; the retrain "
        "kinds only. 1: one process",
    )
    nodes: int = Field(1, ge=1, le=16, description="machines the ranks run on; world_size must be a multiple of it")
    seq_len: int = Field(
        256,
        ge=8,
        le=8192,
        description="the LLM kinds (llm_quant): tokens per row of text; calibration forwards take batch_size rows "
        "each, perplexity and prefill speed are measured on rows of this length",
    )

    def stored(self) -> dict[str, Any]:
        """What the `jobs.params` column and `GET /v1/jobs/{id}` hold: the settings that apply, as asked for."""
        data = self.model_dump(include=set(JobParams.model_fields))
        for name, (decider, default) in _STORED_WHEN_SET.items():
            if getattr(self, decider) == default:
                data.pop(name, None)
        if data.get("objective") is None:
            for name in _OBJECTIVE_SETTINGS:
                data.pop(name, None)
        return {k: v for k, v in data.items() if v is not None}


class JobSpec(BaseModel):
    """spec.json: everything a job process needs, its paths as the process sees them."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    device: str = "cpu"
    params: JobParams = Field(default_factory=lambda: JobParams())
    input_shape: list[int]
    input_dtype: str = "float32"
    inputs: list[dict[str, Any]] | None = None  # None: a model uploaded before signatures (its input_shape)
    outputs: dict[str, Any] | None = None
    dataset_format: str
    checkpoint_every_steps: int | None = None
    # The job's address-space limit in bytes (a CPU job's; the worker's job_memory_limit), None: none
    memory_bytes: int | None = None
    model: str
    cfg: str
    dataset: str
    # a node of a job across several machines (worker/nodes.py)
    node_rank: int = 0
    join_timeout_s: float = 600.0
    rendezvous: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _signature(self) -> JobSpec:
        if self.inputs is None:
            self.inputs = from_input_shape(self.input_shape, self.input_dtype)
        return self

    def write(self, folder: Path) -> None:
        (folder / SPEC_FILE).write_text(self.model_dump_json())

    @classmethod
    def read(cls, folder: Path) -> JobSpec:
        return cls.model_validate(json.loads((folder / SPEC_FILE).read_text()))
