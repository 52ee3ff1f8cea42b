"""`amct jobs submit | list | watch | cancel | download`: the service's client side, over service/client.py."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Column, Table

from job_process.kinds import JOB_KINDS
from service.cli_common import (
    DEFAULT_DEPLOY_FORMAT,
    DEFAULT_DEVICE,
    DEFAULT_KIND,
    DEFAULT_SERVER,
    ApiKeyOpt,
    DataDirOpt,
    DeployFormat,
    Device,
    Kind,
    ServerOpt,
    console,
    err_console,
    fail,
    make_client,
    parse_shape,
    progress_view,
)
from service.client import TERMINAL, ApiError
from service.report_view import summary_table

jobs_app = typer.Typer(help="Submit, follow and fetch jobs on a running service.", no_args_is_help=True)
STATUS_STYLE = {"queued": "yellow", "running": "cyan", "succeeded": "green", "failed": "red", "cancelled": "magenta"}


def _status(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]"


def _elapsed(job: dict) -> str:
    if not job.get("started_at"):
        return "–"
    start = datetime.fromisoformat(job["started_at"])
    end = datetime.fromisoformat(job["finished_at"]) if job.get("finished_at") else datetime.now(UTC)
    seconds = (end - start).total_seconds()
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


@jobs_app.command()
def submit(model: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="TorchScript file")],
           cfg: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="AMCT .cfg")],
           data: Annotated[Path, typer.Option(exists=True, dir_okay=False, help=".npz or .safetensors")],
           kind: Annotated[Kind, typer.Option()] = DEFAULT_KIND,
           input_shape: Annotated[str | None, typer.Option(help="e.g. 1,1,28,28; default: from the dataset")] = None,
           epochs: int = 1, batch_size: int = 64, lr: float = 1e-3, eval_fraction: float = 0.1, seed: int = 0,
           device: Annotated[Device, typer.Option()] = DEFAULT_DEVICE,
           deploy_format: Annotated[DeployFormat, typer.Option()] = DEFAULT_DEPLOY_FORMAT,
           idempotency_key: Annotated[str | None, typer.Option(help="default: a fresh one per run")] = None,
           watch_job: Annotated[bool, typer.Option("--watch", help="follow the job until it ends")] = False,
           server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None,
           data_dir: DataDirOpt = Path("var")) -> None:
    """Upload the model, cfg and dataset, submit a job; prints the job id (alone on stdout)."""
    shape = parse_shape(input_shape, data)
    with make_client(server, api_key, data_dir) as client:
        try:
            with err_console.status("uploading the model (the server loads and checks it)…"):
                model_row = client.upload_model(model, shape)
            cfg_row = client.upload_config(cfg, JOB_KINDS[kind.value].cfg_kind)
            data_row = client.upload_dataset(data)
            job = client.submit(kind.value, model_row["id"], cfg_row["id"], data_row["id"],
                                idempotency_key=idempotency_key or str(uuid.uuid4()), epochs=epochs,
                                batch_size=batch_size, lr=lr, eval_fraction=eval_fraction, seed=seed,
                                device=device.value, deploy_format=deploy_format.value)
        except ApiError as e:
            raise fail(str(e)) from None
        err_console.print(f"submitted {kind.value} job {job['id']} ({_status(job['status'])})")
        print(job["id"])
        if watch_job:
            _follow(client, job["id"])


@jobs_app.command("list")
def list_jobs(status: Annotated[list[str] | None, typer.Option(help="repeatable: queued, running, …")] = None,
              kind: Annotated[list[str] | None, typer.Option(help="repeatable")] = None,
              limit: int = 20,
              as_json: Annotated[bool, typer.Option("--json", help="the API's JSON, for scripts")] = False,
              server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None,
              data_dir: DataDirOpt = Path("var")) -> None:
    """The newest jobs, as a table (or JSON)."""
    with make_client(server, api_key, data_dir) as client:
        try:
            page = client.list(status=status, kind=kind, limit=limit)
        except ApiError as e:
            raise fail(str(e)) from None
    if as_json:
        print(json.dumps(page["items"], indent=2))
        return
    # The whole id, on one line: it is what `watch`, `cancel` and `download` take.
    table = Table(Column("id", no_wrap=True, min_width=36), "status", "kind", "device", "progress", "elapsed",
                  "created")
    for job in page["items"]:
        phase = f" ({job['phase']})" if job["phase"] and job["status"] == "running" else ""
        table.add_row(job["id"], _status(job["status"]) + phase, job["kind"], job["device"],
                      f"{job['progress']:.0%}", _elapsed(job), job["created_at"][:19].replace("T", " "))
    console.print(table if page["items"] else "no jobs")


def _follow(client, job_id: str) -> None:
    """A progress bar over the job's events; the summary table at the end; exit 1 unless it succeeded."""
    with progress_view("queued") as (_bar, show):
        try:
            for event in client.events(job_id):
                show(event)
            job = client.get(job_id)
        except ApiError as e:
            raise fail(str(e)) from None
    _print_outcome(client, job)


def _print_outcome(client, job: dict) -> None:
    err_console.print(f"job {job['id']} {_status(job['status'])} in {_elapsed(job)}")
    if job["status"] == "succeeded":
        report = client.report(job["id"])
        if report:
            console.print(summary_table(report))
        return
    if job.get("error"):
        err_console.print(f"[red]{job['error']['type']}[/]: {escape(job['error'].get('detail') or '')}")
    raise typer.Exit(code=1)


@jobs_app.command()
def watch(job_id: str, server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None,
          data_dir: DataDirOpt = Path("var")) -> None:
    """Follow a job live until it ends; exit status 0 only if it succeeded."""
    with make_client(server, api_key, data_dir) as client:
        _follow(client, job_id)


@jobs_app.command()
def cancel(job_id: str, server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None,
           data_dir: DataDirOpt = Path("var")) -> None:
    """Cancel a queued job at once, or ask a running job's worker to stop it."""
    with make_client(server, api_key, data_dir) as client:
        try:
            job = client.cancel(job_id)
        except ApiError as e:
            raise fail(str(e)) from None
    pending = " (the worker stops it within a heartbeat)" if job["status"] not in TERMINAL else ""
    console.print(f"job {job_id}: {_status(job['status'])}{pending}")


@jobs_app.command()
def download(job_id: str,
             kind: Annotated[list[str] | None, typer.Option(help="artifact kind, repeatable: deploy, report, …; "
                                                                 "default: all")] = None,
             out: Annotated[Path, typer.Option(help="folder to write into")] = Path("."),
             server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None,
             data_dir: DataDirOpt = Path("var")) -> None:
    """Download a job's artifacts (ONNX models, record, report, log) into a folder."""
    with make_client(server, api_key, data_dir) as client:
        try:
            paths = client.download_artifacts(job_id, out, kind)
        except ApiError as e:
            raise fail(str(e)) from None
    table = Table("file", "bytes")
    for path in paths:
        table.add_row(str(path), f"{path.stat().st_size:,}")
    console.print(table)
