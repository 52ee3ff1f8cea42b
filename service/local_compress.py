"""`amct compress` and `amct distill-config` without a server: the engine on this machine.

`compress` runs exactly what a worker runs, the job process (`python -m job_process.main`, started
by the same job_host/launcher.py; the runners of job_host/kinds.py, report.json from
job_process/report.py), with the same spec file and the same JSON progress lines. Here the CLI plays
the worker's part: it draws the progress lines and moves the outputs into --out. One engine path for
both, so a local run predicts a service run.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from core.settings import Settings
from job_host.arrays import sniff_format
from job_host.kinds import JOB_KINDS
from job_host.launcher import ChildProcess
from job_host.protocol import LOG_FILE
from job_host.signature import example_inputs
from job_host.spec import JobParams, JobSpec
from job_host.text_data import text_format
from service.cfg_summary import check_cfg_suits, summarise_cfg
from service.datasets import describe_dataset
from service.job_rules import JobRuleError, check_data
from service.zipcheck import check_torchscript


class LocalJobError(RuntimeError):
    def __init__(self, type_: str, detail: str) -> None:
        super().__init__(f"{type_}: {detail}")
        self.type, self.detail = type_, detail


def check_inputs(model: Path, cfg: Path, data: Path, kind: str, inputs: list[dict], params: JobParams) -> str | None:
    """What the API refuses at upload (POST /v1/models, /v1/configs, /v1/datasets) and at submit (POST /v1/jobs),
    refused here before the engine starts, with the same functions; LocalJobError names the file at fault.
    Returns the objective a retraining kind trains with (check_dataset)."""
    settings = Settings()  # the API's zip limits, as AMCT_* variables set them
    check_model(model, settings)
    check_cfg(cfg, kind)
    return check_dataset(data, kind, inputs, params, settings)


def check_model(model: Path, settings: Settings) -> None:
    """The file is a TorchScript archive (service/zipcheck.py, what the upload checks before its sandboxed
    load). Whether it loads and runs on the signature the job process finds out, as it always did."""
    from service.model_folder import inspect_upload
    from service.problems import Problem

    try:  # a zipped Hugging Face folder (llm_quant), checked as its upload is
        if inspect_upload(str(model), settings) is not None:
            return
    except Problem as e:
        raise LocalJobError("bad_model", e.detail) from None
    try:
        check_torchscript(str(model), settings.max_zip_entries, settings.max_unpacked_bytes, str(model))
    except ValueError as e:
        raise LocalJobError("bad_model", f"{e}; --model takes a TorchScript file (torch.jit.save)") from None


def check_cfg(cfg: Path, kind: str) -> None:
    """The cfg parses as the kind's cfg and suits the kind, as POST /v1/configs and POST /v1/jobs judge it: the
    engine's ConfigError names the file, line, column and field."""
    from amct_engine.config.errors import ConfigError

    cfg_kind = JOB_KINDS[kind].cfg_kind
    try:
        summary = summarise_cfg(cfg.read_bytes(), cfg_kind, str(cfg))
        check_cfg_suits(summary, cfg_kind, kind, "--cfg", "config_id")
    except ConfigError as e:
        raise LocalJobError("bad_cfg", str(e)) from None
    except JobRuleError as e:
        raise LocalJobError("bad_cfg", f"{e} (--kind {kind})") from None
    except OSError as e:
        raise LocalJobError("bad_cfg", f"cannot read {cfg}: {e}") from None


# The CLI's names for the request fields the job rules name.
_OPTIONS = {"dataset_id": "data", "model_id": "model", "config_id": "cfg"}


def check_dataset(data: Path, kind: str, inputs: list[dict], params: JobParams, settings: Settings) -> str | None:
    """What the API refuses at upload (service/datasets.py) and submit (service/job_rules.py). Returns
    the objective a retraining kind trains with, as POST /v1/jobs resolves it (None for the other kinds)."""
    try:
        _, description = describe_dataset(str(data), settings)
    except ValueError as e:  # DatasetError, or the zip check's
        raise LocalJobError("bad_dataset", f"{data}: {e}") from None
    except Exception as e:  # the user's file, in their terms
        raise LocalJobError("bad_dataset", f"cannot read {data}: {e}") from None
    try:
        # No output structure yet (the API records it at upload): the label-width check runs in the engine.
        return check_data(kind, params, description, inputs, None, (str(data), "the model"))
    except JobRuleError as e:
        option = _OPTIONS.get(e.field, e.field).replace("_", "-")
        raise LocalJobError("bad_dataset", f"{e} (--{option})") from None


def compress(
    model: Path,
    cfg: Path,
    data: Path,
    kind: str,
    out: Path,
    inputs: list[dict],
    input_shape: list[int],
    params: JobParams,
    device: str = "cpu",
    on_message: Callable[[dict], None] = lambda m: None,
) -> dict:
    """Run one job here; returns `{metrics, report, files: {artifact kind: path in out}}`.

    `inputs` is the model's signature (job_host/signature.py) and `input_shape` the first input's
    example shape, as the API records them for an upload; `params` hold the objective check_inputs
    resolved. Raises LocalJobError with the engine's error type and detail when the job fails.
    """
    try:
        fmt = sniff_format(str(data))
    except ValueError:  # not arrays: text for the LLM kinds, by its name (check_dataset read it as such)
        fmt = text_format(data.name) or "text"
    out.mkdir(parents=True, exist_ok=True)
    # Absolute: the child starts in the work folder, where a path relative to ours would point elsewhere.
    workdir = Path(tempfile.mkdtemp(prefix=".amct-work-", dir=out.resolve()))
    try:
        JobSpec(
            kind=kind,
            device=device,
            params=params,
            input_shape=input_shape,
            input_dtype=inputs[0]["dtype"],
            inputs=inputs,
            dataset_format=fmt,
            model=str(model.resolve()),
            cfg=str(cfg.resolve()),
            dataset=str(data.resolve()),
        ).write(workdir)
        # Leaving the block kills it if it still runs: Ctrl-C or a failing callback takes the engine down with us.
        with ChildProcess(workdir, read_only=[model, cfg, data]) as child:
            for message in child:
                on_message(message)
            returncode = child.wait()
        shutil.copyfile(workdir / LOG_FILE, out / "engine.log")
        if returncode == 0 and (result := child.result()) is not None:
            return _collect(result, out)
        error = child.error() or {
            "type": "crashed",
            "detail": f"the engine process exited with code {returncode}; see {out / 'engine.log'}",
        }
        raise LocalJobError(error["type"], error["detail"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _collect(result: dict, out: Path) -> dict:
    files = {}
    for artifact in result["artifacts"]:
        source = Path(artifact["path"])
        dest = out / source.name
        shutil.move(source, dest)
        files[artifact["kind"]] = dest
    files["log"] = out / "engine.log"
    return {"metrics": result["metrics"], "report": json.loads(files["report"].read_text()), "files": files}


def distill_config(model: Path, out: Path, inputs: list[dict], input_shape: list[int], cfg: Path | None = None) -> dict:
    """AMCT's create_distill_config on a TorchScript file, traced on example tensors of its signature
    (one per input, as the job process makes them): writes the JSON config, returns it."""
    from amct_engine import create_distill_config

    example = example_inputs(inputs, input_shape[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    create_distill_config(str(out), str(model), example, str(cfg) if cfg else None)
    return json.loads(out.read_text())
