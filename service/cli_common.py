"""What the `amct` commands share: consoles, the server and key options, the input shape of a dataset."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from amct_engine.export.formats import DEPLOY_FORMATS
from job_process.kinds import DEFAULT_JOB_KIND, JOB_KINDS
from service.settings import DEVICES

console = Console()
err_console = Console(stderr=True)
DEFAULT_SERVER = "http://127.0.0.1:8000"
KEY_FILE = "api-key"  # written by the embedded server's first start (service/auth.py)

ServerOpt = Annotated[str, typer.Option("--server", envvar="AMCT_SERVER", help="the service's base URL")]
ApiKeyOpt = Annotated[str | None, typer.Option(
    "--api-key", envvar="AMCT_API_KEY", show_default=False,
    help="API key; default: AMCT_API_KEY, else <data-dir>/api-key of a local embedded server")]
DataDirOpt = Annotated[Path, typer.Option("--data-dir", envvar="AMCT_DATA_DIR",
                                          help="where a local `amct serve` keeps its files (for its api-key)")]


def choices(name: str, values: Iterable[str]) -> type[StrEnum]:
    """A StrEnum of a table's names, for a typer option's choices (typer takes an Enum, not a callable)."""
    return StrEnum(name, {value: value for value in values})


# Built when this module is imported, after job_process/kinds.py has loaded the kinds that
# AMCT_JOB_KIND_MODULES names: `--kind` offers every kind the job process can run.
Kind = choices("Kind", JOB_KINDS.names())
Device = choices("Device", DEVICES)
DeployFormat = choices("DeployFormat", DEPLOY_FORMATS.names())
DEFAULT_KIND, DEFAULT_DEVICE, DEFAULT_DEPLOY_FORMAT = Kind(DEFAULT_JOB_KIND), Device("cpu"), DeployFormat("onnx")


def fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)  # one line, whole paths: greppable
    return typer.Exit(code=code)


def resolve_api_key(api_key: str | None, data_dir: Path) -> str | None:
    """--api-key / AMCT_API_KEY first, then the key file the embedded server left for local clients."""
    if api_key:
        return api_key.strip()
    path = data_dir / KEY_FILE
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def make_client(server: str, api_key: str | None, data_dir: Path):
    from service.client import AmctClient

    return AmctClient(server, resolve_api_key(api_key, data_dir))


def guess_input_shape(dataset: Path) -> list[int]:
    """`[1, *sample_shape]` from the header of `inputs`, without reading the array itself."""
    with open(dataset, "rb") as f:
        head = f.read(8)
    if head.startswith(b"PK"):  # .npz: a zip of .npy files, each with a small header
        with zipfile.ZipFile(dataset) as archive, archive.open("inputs.npy") as member:
            version = np.lib.format.read_magic(member)
            shape = (np.lib.format.read_array_header_1_0(member) if version == (1, 0)
                     else np.lib.format.read_array_header_2_0(member))[0]
    else:  # safetensors: 8-byte length, then a JSON header naming each tensor's shape
        with open(dataset, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            shape = json.loads(f.read(size))["inputs"]["shape"]
    return [1, *shape[1:]]


def parse_shape(text: str | None, dataset: Path | None) -> str:
    """The model's input shape as the API spells it (`1,1,28,28`): given, or read off the dataset."""
    if text:
        return text
    if dataset is None:
        raise fail("--input-shape is needed (e.g. 1,1,28,28)")
    try:
        return ",".join(map(str, guess_input_shape(dataset)))
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as e:
        raise fail(f"cannot read the input shape from {dataset} ({e}); pass --input-shape") from None


@contextmanager
def progress_view(description: str = "starting") -> Iterator[tuple[Progress, object]]:
    """A progress bar and the function that feeds it one job message.

    The engine's JSON lines (job_process/protocol.py) and the service's events share one shape
    (`phase`, `progress` with step/total_steps/loss, `log`; events add `state`), so `amct compress`
    and `amct jobs watch` draw the same bar.
    """
    with Progress(TextColumn("{task.description:<15}"), BarColumn(), TaskProgressColumn(),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err_console) as bar:
        task = bar.add_task(description, total=1.0, info="")

        def show(m: dict) -> None:
            if m["type"] == "phase":
                bar.update(task, description=m["phase"], completed=m.get("progress") or None)
            elif m["type"] == "progress":
                loss = f" loss {m['loss']:.4f}" if m.get("loss") is not None else ""
                step = f"step {m['step']}/{m.get('total_steps')}" if m.get("step") is not None else ""
                bar.update(task, completed=m.get("progress"), info=step + loss)
            elif m["type"] == "state":
                bar.update(task, description=m["status"], completed=1.0 if m["status"] == "succeeded" else None)
            elif m["type"] == "log":
                bar.console.print(f"[yellow]{m.get('level', 'info')}:[/] {escape(str(m.get('message', '')))}")

        yield bar, show
