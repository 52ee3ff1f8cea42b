"""What the `amct` commands share: consoles, the server and key options, errors as one line, dataset headers."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
import typer.core
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from amct_engine.export import deploy_target, formats
from amct_engine.export.deploy_target import deploy_target_names
from amct_engine.export.formats import DEPLOY_FORMATS
from core import settings
from core.job_states import SUCCEEDED
from core.settings import DEVICES
from job_host.arrays import array_headers, sniff_format
from job_host.kinds import DEFAULT_JOB_KIND, JOB_KINDS
from job_host.signature import INPUTS_EXAMPLE, SignatureError, first_example_shape, from_input_shape, parse_inputs
from service.local_servers import KEY_FILE, key_file_for, registry_path

console = Console()
err_console = Console(stderr=True)
DEFAULT_SERVER = "http://127.0.0.1:8000"
DEFAULT_DATA_DIR = Path("var")  # `make serve`'s --data-dir, relative to the repository

ServerOpt = Annotated[str, typer.Option("--server", envvar="AMCT_SERVER", help="the service's base URL")]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="AMCT_API_KEY",
        show_default=False,
        help="API key; default: the api-key file of the local `amct serve` at --server (from any folder)",
    ),
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar="AMCT_DATA_DIR",
        show_default=False,
        help="read the key from this local server's data folder instead",
    ),
]

# The model's signature: `amct compress`, `amct distill-config` and `amct jobs submit` (the upload's `inputs`).
InputsOpt = Annotated[
    str | None,
    typer.Option(
        help="the signature, JSON: [{name, shape, dtype}, …] in forward's order, axis names for dynamic dimensions, "
        'e.g. \'[{"name":"input_ids","shape":["batch",128],"dtype":"int64"}]\' (instead of '
        "--input-shape)"
    ),
]

# The training objective and quality-gate options `amct compress` and `amct jobs submit` share (JobCreate's fields).


def _flags_show_no_type(display_type_rich):
    """typer 0.29's rich help prints `<bool>` for a flag, as if it took a value; its plain help prints
    nothing there (click's own rule: a flag has no metavar). Give the rich help the plain help's rule."""

    def display(self, ctx):
        return None if self.is_flag and not self.count else display_type_rich(self, ctx)

    return display


typer.core.TyperOption.display_type_rich = _flags_show_no_type(typer.core.TyperOption.display_type_rich)


def choices(name: str, values: Iterable[str]) -> type[StrEnum]:
    """A StrEnum of a table's names, for a typer option's choices (typer takes an Enum, not a callable)."""
    return StrEnum(name, {value: value for value in values})


# Built when this module is imported, after job_host/kinds.py has loaded the kinds that
# AMCT_JOB_KIND_MODULES names: `--kind` offers every kind the job process can run.
Kind = choices("Kind", JOB_KINDS.names())
Device = choices("Device", DEVICES)
DeployFormat = choices("DeployFormat", DEPLOY_FORMATS.names())
DeployTarget = choices("DeployTarget", deploy_target_names())
# the choices' defaults, the tables' own
DEFAULT_KIND, DEFAULT_DEVICE = Kind(DEFAULT_JOB_KIND), Device(settings.DEFAULT_DEVICE)
DEFAULT_DEPLOY_FORMAT = DeployFormat(formats.DEFAULT_DEPLOY_FORMAT)
DEFAULT_DEPLOY_TARGET = DeployTarget(deploy_target.DEFAULT_DEPLOY_TARGET)


def fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)  # one line, whole paths: greppable
    return typer.Exit(code=code)


@dataclass(frozen=True)
class KeyChoice:
    key: str | None
    source: str  # where it came from, for the 401 message


def _read_key(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def resolve_api_key(api_key: str | None, data_dir: Path | None, server: str = DEFAULT_SERVER) -> KeyChoice:
    """--api-key / AMCT_API_KEY first; then the key file of a local embedded server: the one of --data-dir
    (AMCT_DATA_DIR), else the one `amct serve` recorded for this URL (service/local_servers.py), else
    `var/api-key` in this folder (`make serve` in a checkout)."""
    if api_key:
        return KeyChoice(api_key.strip(), "--api-key / AMCT_API_KEY")
    candidates = [data_dir / KEY_FILE] if data_dir is not None else [key_file_for(server), DEFAULT_DATA_DIR / KEY_FILE]
    for path in filter(None, candidates):
        if (key := _read_key(path)) is not None:
            return KeyChoice(key, f"the key file {path.resolve()}")
    return KeyChoice(None, "no key: none given and no key file found")


def _explain(error, key: KeyChoice) -> str:
    if error.status == 401:
        return (
            f"{error} (sent {key.source}). Give a key with --api-key, or the AMCT_API_KEY variable, or let the "
            f"CLI read the local server's key file (<data dir>/{KEY_FILE}: found through --data-dir / "
            f"AMCT_DATA_DIR, or {registry_path()}, which `amct serve` writes)"
        )
    return str(error)


@contextmanager
def service_client(server: str, api_key: str | None, data_dir: Path | None):
    """An AmctClient whose failures end the command with one line: no traceback for a server that is not
    there, the ways to give a key for a 401, the problem's detail otherwise."""
    from service.client import AmctClient, ApiError, ServiceSlow, ServiceUnreachable

    key = resolve_api_key(api_key, data_dir, server)
    with AmctClient(server, key.key) as client:
        try:
            yield client
        except ServiceSlow as e:
            waited = f" within {e.waited_s:g} s" if e.waited_s else ""
            raise fail(
                f"the service at {server} took the request but did not answer{waited}: it is up but busy; "
                "`amct jobs list` shows whether it went through before you send it again"
            ) from None
        except ServiceUnreachable as e:
            raise fail(
                f"cannot reach the service at {server} ({e.reason}): is `amct serve` running there? "
                "(--server or AMCT_SERVER names another)"
            ) from None
        except ApiError as e:
            raise fail(_explain(e, key)) from None


def check_job_settings(kind: str, settings) -> None:
    """The rules POST /v1/jobs applies to a job's settings (service/job_rules.py), before anything runs or uploads;
    whether several nodes are allowed is the server's to say."""
    from service.job_rules import JobRuleError, check_settings

    try:
        check_settings(kind, settings, multinode=True)
    except JobRuleError as e:
        raise fail(f"--{e.field.replace('_', '-')}: {e}") from None


def inputs_header(dataset: Path) -> tuple[list[int], str]:
    """Shape and numpy dtype name of `inputs`, from the file's header, without reading the array itself
    (the header reader the API describes uploads with, so both accept the same dtypes)."""
    headers = {h.name: h for h in array_headers(str(dataset), sniff_format(str(dataset)))}
    header = headers["inputs"]
    return list(header.shape), np.dtype(header.dtype).name


def guess_input_shape(dataset: Path) -> list[int]:
    """`[1, *sample_shape]` from the header of `inputs`."""
    return [1, *inputs_header(dataset)[0][1:]]


def check_not_raw_images(dataset: Path, accept_uint8: bool) -> None:
    """uint8 inputs (images as stored, 0..255) reach a float model unscaled: it then trains on and is
    measured on values 255 times what it was trained on. Refused unless the model scales its input itself."""
    if accept_uint8:
        return
    try:
        dtype = inputs_header(dataset)[1]
    except (KeyError, ValueError, OSError, zipfile.BadZipFile):
        return  # unreadable: the upload's own check names the problem
    if dtype == "uint8":
        raise fail(
            f"{dataset}: `inputs` are uint8 (raw 0..255 pixels); the job feeds them to the model as "
            "float32 0..255, unscaled. Store them as the model expects (e.g. inputs.astype('float32') / 255), "
            "or pass --accept-uint8 if the model scales its input itself"
        )


def parse_shape(text: str | None, dataset: Path | None) -> str:
    """The model's input shape as the API spells it (`1,1,28,28`): given, or read off the dataset."""
    if text:
        return text
    if dataset is None:
        raise fail("--input-shape is needed (e.g. 1,1,28,28)")
    try:
        return ",".join(map(str, guess_input_shape(dataset)))
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as e:
        raise fail(
            f"cannot read the input shape from {dataset} ({e}); pass --input-shape, or --inputs for a model "
            "with named inputs"
        ) from None


def parse_inputs_option(text: str) -> list[dict]:
    """`--inputs` checked as the API checks an upload's `inputs` (job_host/signature.py): one line naming
    what is wrong, exit status 1."""
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise fail(f"--inputs is not valid JSON ({e}); e.g. {INPUTS_EXAMPLE}") from None
    try:
        return parse_inputs(raw)
    except SignatureError as e:
        raise fail(f"--inputs: {e}; e.g. {INPUTS_EXAMPLE}") from None


def model_signature(inputs: str | None, input_shape: str | None, dataset: Path | None) -> tuple[list[dict], list[int]]:
    """The signature of a model run here and its first input's example shape, as the API records them for an
    upload: from --inputs (batch 2, the upload check's), else the one-input --input-shape shorthand (float32;
    by default `[1, *sample shape]` of the dataset's `inputs`)."""
    if inputs:
        if input_shape:
            raise fail("give --inputs or --input-shape, not both")
        signature = parse_inputs_option(inputs)
        return signature, first_example_shape(signature)
    text = parse_shape(input_shape, dataset)
    try:
        shape = [int(d) for d in text.replace("x", ",").split(",")]
    except ValueError:
        raise fail(f"--input-shape {text!r} is not a comma-separated list of integers (e.g. 1,1,28,28)") from None
    return from_input_shape(shape, "float32"), shape


@contextmanager
def progress_view(description: str = "starting") -> Iterator[tuple[Progress, object]]:
    """A progress bar and the function that feeds it one job message.

    The engine's JSON lines (job_host/protocol.py) and the service's events share one shape
    (`phase`, `progress` with step/total_steps/loss, `log`; events add `state`), so `amct compress`
    and `amct jobs watch` draw the same bar.
    """
    with Progress(
        TextColumn("{task.description:<15}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=err_console,
    ) as bar:
        task = bar.add_task(description, total=1.0, info="")

        def show(m: dict) -> None:
            if m["type"] == "phase":
                bar.update(task, description=m["phase"], completed=m.get("progress") or None)
            elif m["type"] == "progress":
                loss = f" loss {m['loss']:.4f}" if m.get("loss") is not None else ""
                step = f"step {m['step']}/{m.get('total_steps')}" if m.get("step") is not None else ""
                bar.update(task, completed=m.get("progress"), info=step + loss)
            elif m["type"] == "state":
                bar.update(task, description=m["status"], completed=1.0 if m["status"] == SUCCEEDED else None)
            elif m["type"] == "log":
                bar.console.print(f"[yellow]{m.get('level', 'info')}:[/] {escape(str(m.get('message', '')))}")

        yield bar, show
