"""POST/GET /v1/models: TorchScript uploads, or zipped Hugging Face folders of causal LMs (service/model_folder.py),
streamed to the store and validated in a sandboxed child process."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import tempfile
from contextlib import ExitStack
from pathlib import Path

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from core.db.models import Model
from core.settings import Settings
from job_host import sandbox, signature
from job_host.bubblewrap import SandboxUnavailable
from job_host.bubblewrap import require as require_sandbox
from job_host.errors import scrub
from job_host.signature import (
    EXAMPLE_BATCH,
    INPUTS_EXAMPLE,
    SHORTHAND_DTYPES,
    SignatureError,
    first_example_shape,
    from_input_shape,
    parse_inputs,
)
from service import model_checks, model_folder
from service.auth import ReadCaller, WriteCaller
from service.checks import BUSY_RESPONSE, checks_slot
from service.deps import SessionDep, SettingsDep, StoreDep
from service.problems import Problem
from service.routes.common import NAME_FIELD, UPLOAD_ERRORS, get_or_404, multipart, require_name
from service.schemas import CleanStr, ModelOut
from service.uploads import Upload, receive_upload
from service.zipcheck import check_torchscript

router = APIRouter(prefix="/v1/models", tags=["models"])
DTYPES = SHORTHAND_DTYPES
MAX_ELEMENTS = 10**8


def parse_input_shape(text: str | None) -> list[int]:
    if not text:
        raise Problem(
            422,
            "input_shape (e.g. 1,1,28,28) or inputs (a JSON list of {name, shape, dtype}) is required",
            field="input_shape",
        )
    try:
        shape = [int(d) for d in text.replace("x", ",").split(",")]
    except ValueError:
        raise Problem(
            422, f"input_shape {text!r} is not a comma-separated list of integers", field="input_shape"
        ) from None
    if not 1 <= len(shape) <= 8 or any(d < 1 for d in shape):
        raise Problem(422, f"input_shape {text!r} needs 1 to 8 dimensions, each >= 1", field="input_shape")
    elements = 1
    for d in shape:
        elements *= d
    if elements > MAX_ELEMENTS:
        raise Problem(
            422, f"input_shape {text!r} has {elements} elements; the limit is {MAX_ELEMENTS}", field="input_shape"
        )
    return shape


def parse_signature(fields: dict[str, str]) -> tuple[list[dict], list[int], int]:
    """(inputs, the first input's example shape, the example batch) from `inputs` or the shorthand."""
    if fields.get("inputs"):
        if fields.get("input_shape"):
            raise Problem(422, "give either inputs or input_shape, not both", field="input_shape")
        try:
            raw = json.loads(fields["inputs"])
        except ValueError as e:
            raise Problem(422, f"inputs is not valid JSON ({e}); e.g. {INPUTS_EXAMPLE}", field="inputs") from None
        try:
            inputs = parse_inputs(raw)
        except SignatureError as e:
            raise Problem(422, f"inputs: {e}; e.g. {INPUTS_EXAMPLE}", field=e.field) from None
        return inputs, first_example_shape(inputs), EXAMPLE_BATCH
    shape = parse_input_shape(fields.get("input_shape"))
    dtype = fields.get("input_dtype") or "float32"
    if dtype not in DTYPES:
        raise Problem(422, f"input_dtype must be one of {', '.join(DTYPES)}", field="input_dtype")
    return from_input_shape(shape, dtype), shape, shape[0]


def validate_in_child(upload: Upload, inputs: list[dict], batch: int, settings: Settings) -> dict:
    """Load + forward + capture in a sandboxed child; the API process never unpickles user code.

    The child sees the upload (read-only) and a fresh folder of its own, nothing else of the data dir;
    what it reports is scrubbed (job_host/errors.py) and its stderr never reaches the answer.
    """
    return _check_in_child(upload, "job_process.validate_model", [json.dumps(inputs), str(batch)], settings)


def validate_folder_in_child(upload: Upload, settings: Settings) -> dict:
    """A Hugging Face folder (zip) built with transformers' own architecture and run on a few tokens, in a
    sandboxed child (job_process/validate_llm.py), as validate_in_child checks a TorchScript file."""
    return _check_in_child(upload, "job_process.validate_llm", [], settings)


def _check_in_child(upload: Upload, module: str, args: list[str], settings: Settings) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="check-", dir=settings.tmp_dir))
    try:
        result = sandbox.run(
            module,
            [str(upload.file), *args],
            cwd=folder,
            timeout_s=settings.validate_timeout_s,
            memory_bytes=settings.validate_memory_bytes,
            read_only=[upload.file],
            cpu_seconds=int(settings.validate_timeout_s * (os.cpu_count() or 1)),
        )
    except subprocess.TimeoutExpired:
        return {
            "ok": False,
            "stage": "timeout",
            "error": f"validation took longer than {settings.validate_timeout_s:.0f} s",
        }
    except SandboxUnavailable as e:
        raise Problem(503, str(e), field="file") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report = _last_report(result.stdout)
    if result.returncode != 0 or report is None:
        reason = _exit_reason(result.returncode)
        return {"ok": False, "stage": "crash", "error": f"the validation process died ({reason})"}
    if not report.get("ok"):
        stage = str(report.get("stage"))
        # The engine's words may name the file by its path in the data folder: not the user's business.
        error = str(report.get("error", "")).replace(str(upload.path), "the model file")
        refusal = {"ok": False, "stage": stage if stage in _STAGE_VERB else "crash", "error": scrub(error)}
        if isinstance(report.get("file"), str):  # the folder's file at fault (job_process/validate_llm.py)
            refusal["file"] = scrub(report["file"], 255)
        return refusal
    return report


def _last_report(stdout: str) -> dict | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    try:
        report = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def _exit_reason(returncode: int) -> str:
    if returncode == -signal.SIGKILL:
        return "killed: out of memory or CPU time"
    if returncode < 0:
        return f"signal {signal.Signals(-returncode).name}" if -returncode in signal.valid_signals() else "a signal"
    return f"exit code {returncode}"


@router.post(
    "",
    status_code=201,
    response_model=ModelOut,
    responses={
        **UPLOAD_ERRORS,
        **BUSY_RESPONSE,
        202: {"description": "with `Prefer: respond-async`: stored, `validating`; follow its Location"},
    },
    openapi_extra=multipart(
        [],
        {
            **NAME_FIELD,
            "inputs": {
                "type": "string",
                "examples": [INPUTS_EXAMPLE],
                "description": "the signature: a JSON list of {name, shape, dtype}; a dimension is "
                "an integer or an axis name (dynamic, e.g. batch, seq); dtype one of "
                + ", ".join(signature.DTYPES)
                + "; the first dimension is the batch",
            },
            "input_shape": {
                "type": "string",
                "examples": ["1,1,28,28"],
                "description": "one-input shorthand for inputs: comma-separated, batch first",
            },
            "input_dtype": {
                "type": "string",
                "enum": list(DTYPES),
                "default": "float32",
                "description": "the dtype of the input_shape shorthand",
            },
        },
        "TorchScript (torch.jit.save), or a zipped Hugging Face folder of a causal LM (llm_quant)",
    ),
)
async def upload_model(
    request: Request,
    response: Response,
    session: SessionDep,
    store: StoreDep,
    settings: SettingsDep,
    caller: WriteCaller,
) -> Model:
    """Multipart: `file` (TorchScript), `name`, and `inputs` (the signature, JSON) or `input_shape`
    (e.g. `1,1,28,28`) with optional `input_dtype`. The model runs once on example tensors made from the
    signature in a sandboxed child; its output structure is recorded as `outputs`.

    With `Prefer: respond-async` the answer comes as soon as the file is stored: 202, the model `validating`,
    then `ready` or `invalid` (its `status_detail` saying why) once the check is done (service/model_checks.py).
    """
    # Owned by the background check when there is one: it ends them (the slot, the uploaded file) itself.
    slot = ExitStack()
    slot.enter_context(checks_slot(settings, "model"))
    upload: Upload | None = None
    try:
        upload = await receive_upload(request, "file", settings.max_model_bytes, settings.tmp_dir)
        name = require_name(upload.fields, upload.filename)
        folder = await run_in_threadpool(model_folder.inspect_upload, str(upload.file), settings)
        if folder is not None:  # a Hugging Face folder: its signature is a causal LM's, whatever the form says
            inputs, shape, fmt = model_folder.LLM_INPUTS, model_folder.LLM_EXAMPLE_SHAPE, model_folder.FORMAT
            check = functools.partial(validate_folder_in_child, upload, settings)
        else:
            inputs, shape, batch = parse_signature(upload.fields)
            fmt = "torchscript"
            try:
                check_torchscript(
                    str(upload.path), settings.max_zip_entries, settings.max_unpacked_bytes, "the model file"
                )
            except ValueError as e:
                raise Problem(
                    422,
                    f"{e}; upload a TorchScript file (torch.jit.save), or a zipped Hugging Face folder "
                    "(config.json + safetensors, or a GGUF file)",
                    field="file",
                ) from None
            check = functools.partial(validate_in_child, upload, inputs, batch, settings)
        if model_checks.wants_async(request):
            _require_sandbox()  # none: the 503 now, not a model that can never be checked
            blob = await run_in_threadpool(store.put_file, upload.file, upload.sha256)
            model = _model_row(caller.project, name, shape, inputs, blob, status="validating", format=fmt)
            session.add(model)
            session.commit()
            slot.callback(upload.discard)  # the file goes with the slot, when the check has ended
            model_checks.start(request.app, model.id, check, _columns, slot.pop_all())
            upload = None
            response.status_code = 202
            response.headers["Location"] = f"/v1/models/{model.id}"
            return model
        report = await run_in_threadpool(check)
        if not report["ok"]:
            named = {"file": report["file"]} if report.get("file") else {}
            raise Problem(422, _refusal(report), field="file", stage=report["stage"], **named)
        blob = await run_in_threadpool(store.put_file, upload.file, upload.sha256)
    finally:
        if upload is not None:
            upload.discard()
        slot.close()
    model = _model_row(caller.project, name, shape, inputs, blob, status="ready", format=fmt, **_checked(report))
    session.add(model)
    session.commit()
    return model


def _require_sandbox() -> None:
    try:
        require_sandbox()
    except SandboxUnavailable as e:
        raise Problem(503, str(e), field="file") from None


def _model_row(project: str, name: str, shape: list[int], inputs: list[dict], blob, **values) -> Model:
    return Model(
        project_id=project,
        name=name,
        input_shape=shape,
        input_dtype=inputs[0]["dtype"],
        inputs=inputs,
        sha256=blob.sha256,
        size_bytes=blob.size_bytes,
        uri=blob.uri,
        **values,
    )


def _checked(report: dict) -> dict:
    """The Model columns a passed check fills in."""
    return {
        "outputs": report["outputs"],
        "layers": {**report["layers"], "parameters": report["parameters"], "output_shapes": report["output_shapes"]},
    }


def _columns(report: dict) -> dict:
    """The Model columns a check's report sets: ready with what it found, or invalid with why."""
    if report["ok"]:
        return {"status": "ready", **_checked(report)}
    return {"status": "invalid", "status_detail": _refusal(report)}


def _refusal(report: dict) -> str:
    """What a failed check says (the 422's detail, or an asynchronous check's `status_detail`)."""
    return f"the model does not {_STAGE_VERB.get(report['stage'], 'validate')}: {report['error']}"


_STAGE_VERB = {
    "folder": "load as a Hugging Face model folder",
    "load": "load as TorchScript",
    "forward": "run on example inputs of its signature",
    "outputs": "return tensors",
    "capture": "capture as a graph",
    "timeout": "validate in time",
    "crash": "validate",
}


@router.get("/{model_id}", response_model=ModelOut)
def get_model(model_id: CleanStr, session: SessionDep, caller: ReadCaller) -> Model:
    return get_or_404(session, Model, model_id, caller.project, "model")
