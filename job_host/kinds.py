"""The job-kind table: every kind of job the service, the CLI, the dashboard and the job process know.

Torch-free on purpose: the API and the CLI read it (OpenAPI enum, `--kind` choices, `GET /v1/meta`,
the cfg checks at upload and submit) without importing torch; each entry names its runner as
``"package.module:function"``, imported by the job process on first use.

A runner takes a `job_process.runners.JobContext` (the job's files, split data, device, progress and
checkpoint hooks), trains, exports through the engine's `save_*` function and puts the files it wrote
in `ctx.files` (at least `deploy`); it returns the trained model (job_process/main.py checks its
accuracy and builds report.json).

Adding a kind (docs/architecture.md, "Add a job kind"): one `register_job_kind(JobKind(...))` call
in a module the processes import. The built-in kinds are registered below. A kind from elsewhere
(a plugin, a test) lives in a module named in the environment variable `AMCT_JOB_KIND_MODULES`
(comma-separated module names): this module imports each at the end of its own import, in every
process (API, worker, CLI and the sandboxed job process, whose environment passes the variable on),
so all of them see the same table. A module that is imported directly registers its kinds as well.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from amct_engine.registry import Registry, load_object

# The AMCT cfg grammars a job can take (docs/spec/engine.md §2.1, §2.2, §2.5; "llm": the JSON config dict of
# amct.quantize, docs/spec/llm.md §2).
CFG_KINDS = ("retrain", "distill", "calibration", "llm")
CfgKind = Literal["retrain", "distill", "calibration", "llm"]
# The engine API families a retrain cfg is checked against at upload (amct_engine.config.cfg_checks).
ENGINE_APIS = ("quant", "prune", "compressed")
MODULES_ENV = "AMCT_JOB_KIND_MODULES"


@dataclass(frozen=True)
class JobKind:
    name: str  # the `kind` of a job, as the API, the CLI and the job spec spell it
    cfg_kind: CfgKind  # the cfg a job of this kind takes
    engine_api: str | None  # the ENGINE_APIS family a retrain cfg must suit; None: parsing it is enough
    # Trains with an `objective`: cross_entropy on the dataset's labels, or distill_outputs without them
    trains: bool
    description: str  # one line for `GET /v1/meta`, the dashboard and `--help`
    runner: str  # "package.module:function" taking a JobContext (job_process/runners.py)
    # Runs data-parallel with `world_size` > 1 (its training goes through runners.train: job_process/distributed.py)
    distributed: bool = False
    # Cannot run without the dataset's `labels` (refused at submit without them); none of ours: each
    # training kind distils the FP32 model's outputs when a dataset has no labels
    needs_labels: bool = False
    # A large-language-model kind: it takes a Hugging Face folder (zip) or a TorchScript trace of a causal LM and
    # a text dataset; its runner is called as `runner(workdir, spec, phase)` and returns the job's result itself
    # (job_process/llm_runner.py), as it measures perplexity rather than the array kinds' accuracy and agreement
    llm: bool = False

    def __post_init__(self) -> None:
        if self.cfg_kind not in CFG_KINDS:
            raise ValueError(f"job kind {self.name!r}: cfg_kind must be one of {CFG_KINDS}, not {self.cfg_kind!r}")
        if self.engine_api is not None and self.engine_api not in ENGINE_APIS:
            raise ValueError(
                f"job kind {self.name!r}: engine_api must be one of {ENGINE_APIS} or None, not {self.engine_api!r}"
            )
        if self.engine_api is not None and self.cfg_kind != "retrain":
            raise ValueError(f"job kind {self.name!r}: only a retrain cfg is checked against an engine API")

    @property
    def prunes(self) -> bool:
        """Its engine API prunes channels (prune or compressed retrain): `bn_recalibration_batches` applies."""
        return self.engine_api in ("prune", "compressed")

    def load_runner(self) -> Callable:
        return load_object(self.runner)


JOB_KINDS: Registry[JobKind] = Registry("job kind")
DEFAULT_JOB_KIND = "compressed_retrain"  # what the CLI and the dashboard offer first


def register_job_kind(kind: JobKind, *, replace: bool = False) -> JobKind:
    return JOB_KINDS.register(kind.name, kind, replace=replace)


def kinds_for_cfg(cfg_kind: str) -> list[JobKind]:
    """The job kinds that take a cfg of `cfg_kind` (what a cfg upload is checked for)."""
    return [k for k in JOB_KINDS.values() if k.cfg_kind == cfg_kind]


register_job_kind(
    JobKind(
        "compressed_retrain",
        "retrain",
        "compressed",
        True,
        "prune channels and quantise in one retraining (create/save_compressed_retrain_model)",
        "job_process.runners:compressed_retrain",
        distributed=True,
    )
)
register_job_kind(
    JobKind(
        "quant_retrain",
        "retrain",
        "quant",
        True,
        "quantisation-aware training (create_quant_retrain_config/model, save_quant_retrain_model)",
        "job_process.runners:quant_retrain",
        distributed=True,
    )
)
register_job_kind(
    JobKind(
        "prune_retrain",
        "retrain",
        "prune",
        True,
        "structured channel pruning with retraining (create/save_prune_retrain_model)",
        "job_process.runners:prune_retrain",
        distributed=True,
    )
)
register_job_kind(
    JobKind(
        "distill",
        "distill",
        None,
        False,
        "block-wise distillation of a quantised student from the original model, no labels needed "
        "(create_distill_config/model, distill, save_distill_model)",
        "job_process.runners:distill",
    )
)


register_job_kind(
    JobKind(
        "ptq",
        "calibration",
        None,
        False,
        "post-training quantisation, no training: calibration batches from the dataset "
        "(create_quant_config, quantize_model, save_model)",
        "job_process.search_runners:ptq",
    )
)
register_job_kind(
    JobKind(
        "sensitivity",
        "calibration",
        None,
        False,
        "PTQ plus a per-layer sensitivity table: each layer at INT8 / INT4 or pruned alone, damage on held-out data",
        "job_process.search_runners:sensitivity",
    )
)
register_job_kind(
    JobKind(
        "auto_mixed_precision",
        "calibration",
        None,
        False,
        "per-layer INT4 / INT8 / INT16 / float under an accuracy budget, checked on the deploy model; "
        "writes the chosen .cfg",
        "job_process.search_runners:auto_mixed_precision",
    )
)
register_job_kind(
    JobKind(
        "prune_search",
        "calibration",
        None,
        True,
        "per-group BCP prune ratios that reach search_config.target_macs_ratio of the MACs (least summed damage), "
        "then prune retraining; writes the chosen .cfg",
        "job_process.search_runners:prune_search",
    )
)


register_job_kind(
    JobKind(
        "llm_quant",
        "llm",
        None,
        False,
        "LLM weight quantisation (amct.quantize, a calibration forward on the text, amct.convert, amct.export_onnx "
        "to MatMulNBits / W8A8): perplexity, bytes and prefill speed against FP32",
        "job_process.llm_runner:llm_quant",
        llm=True,
    )
)


def _import_extra_kinds() -> None:
    for module in filter(None, (m.strip() for m in os.environ.get(MODULES_ENV, "").split(","))):
        importlib.import_module(module)


_import_extra_kinds()
