"""`amct jobs submit | list | watch | cancel | download`: the service's client side, over service/client.py.

Jobs are listed by short ids (their first 8 characters, more where two listed jobs share those), and
every command takes any unique start of an id of 4 characters or more, as git takes a commit's: the
CLI matches it against the project's jobs (GET /v1/jobs, newest first). A whole id is sent as it is.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Column, Table

from core.job_states import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED
from job_host.kinds import JOB_KINDS
from job_host.spec import JobParams
from service.cli_common import (
    DEFAULT_DEVICE,
    DEFAULT_KIND,
    DEFAULT_SERVER,
    ApiKeyOpt,
    DataDirOpt,
    Device,
    InputsOpt,
    Kind,
    ServerOpt,
    check_job_settings,
    check_not_raw_images,
    console,
    err_console,
    fail,
    parse_inputs_option,
    parse_shape,
    progress_view,
    service_client,
)
from service.cli_job_options import job_options
from service.client import ApiError
from service.model_folder import LLM_INPUTS
from service.report_view import summary_table

jobs_app = typer.Typer(help="Submit, follow and fetch jobs on a running service.", no_args_is_help=True)
STATUS_STYLE = {QUEUED: "yellow", RUNNING: "cyan", SUCCEEDED: "green", FAILED: "red", CANCELLED: "magenta"}
SHORT_ID, MIN_PREFIX = 8, 4
JobIdArg = Annotated[str, typer.Argument(metavar="JOB", help="a job id, or a unique start of one (4+ characters)")]


def _status(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]"


def _elapsed(job: dict) -> str:
    if not job.get("started_at"):
        return "–"
    start = datetime.fromisoformat(job["started_at"])
    end = datetime.fromisoformat(job["finished_at"]) if job.get("finished_at") else datetime.now(UTC)
    seconds = (end - start).total_seconds()
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def short_ids(ids: list[str]) -> dict[str, str]:
    """Each id's first SHORT_ID characters, or as many more as keep the listed ids apart."""
    length = SHORT_ID
    while len({i[:length] for i in ids}) < len(set(ids)):
        length += 1
    return {i: i[:length] for i in ids}


def resolve_job(client, text: str) -> dict:
    """The job a whole id or a unique start of one names (a one-line error otherwise)."""
    text = text.strip().lower()
    if len(text) == 36:  # a whole id: the API's 404 speaks for itself
        return client.get(text)
    if len(text) < MIN_PREFIX:
        raise fail(f"job id {text!r} is too short: give at least {MIN_PREFIX} characters of it")
    matches, cursor = [], None
    while True:  # newest first, a page at a time; stops at a second match
        page = client.list(limit=200, cursor=cursor)
        matches += [job for job in page["items"] if job["id"].startswith(text)]
        cursor = page["next_cursor"]
        if len(matches) > 1 or cursor is None:
            break
    if not matches:
        raise fail(f"no job of this project has an id starting with {text!r} (`amct jobs list` shows them)")
    if len(matches) > 1:
        raise fail(
            f"{text!r} starts the ids of several jobs ({matches[0]['id']}, {matches[1]['id']}, …): give more characters"
        )
    return matches[0]


@jobs_app.command()
@job_options()
def submit(
    model: Annotated[
        Path, typer.Option(exists=True, dir_okay=False, help="TorchScript file (llm_quant: or a zipped HF folder)")
    ],
    cfg: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="AMCT .cfg (llm_quant: its JSON config)")],
    data: Annotated[
        Path, typer.Option(exists=True, dir_okay=False, help=".npz or .safetensors (llm_quant: .txt or .jsonl)")
    ],
    params: JobParams,
    kind: Annotated[Kind, typer.Option()] = DEFAULT_KIND,
    input_shape: Annotated[str | None, typer.Option(help="e.g. 1,1,28,28; default: from the dataset")] = None,
    inputs: InputsOpt = None,
    device: Annotated[Device, typer.Option()] = DEFAULT_DEVICE,
    idempotency_key: Annotated[str | None, typer.Option(help="default: a fresh one per run")] = None,
    accept_uint8: Annotated[
        bool,
        typer.Option("--accept-uint8", help="send uint8 inputs as they are (for a model that scales its input itself)"),
    ] = False,
    watch_job: Annotated[bool, typer.Option("--watch", help="follow the job until it ends")] = False,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Upload the model, cfg and dataset, submit a job; prints the job id (alone on stdout)."""
    if inputs and input_shape:
        raise fail("give --inputs or --input-shape, not both")
    signature = parse_inputs_option(inputs) if inputs else None  # checked as the API checks it, before any upload
    llm = JOB_KINDS[kind.value].llm  # text data; a causal LM's signature unless --inputs says otherwise
    if llm and not signature and not input_shape:
        signature = LLM_INPUTS
    shape = None if signature else parse_shape(input_shape, data)
    check_job_settings(kind.value, params)
    if not inputs and not llm:
        check_not_raw_images(data, accept_uint8)
    with service_client(server, api_key, data_dir) as client:
        with err_console.status("uploading the model (the server loads and checks it)…"):
            model_row = client.upload_model(model, shape, inputs=signature)
        cfg_row = client.upload_config(cfg, JOB_KINDS[kind.value].cfg_kind)
        data_row = client.upload_dataset(data)
        job = client.submit(
            kind.value,
            model_row["id"],
            cfg_row["id"],
            data_row["id"],
            idempotency_key=idempotency_key or str(uuid.uuid4()),
            device=device.value,
            **params.model_dump(exclude_defaults=True),
        )
        err_console.print(f"submitted {kind.value} job {job['id']} ({_status(job['status'])})")
        print(job["id"])
        if watch_job:
            _follow(client, job)


@jobs_app.command("list")
def list_jobs(
    status: Annotated[list[str] | None, typer.Option(help="repeatable: queued, running, …")] = None,
    kind: Annotated[list[str] | None, typer.Option(help="repeatable")] = None,
    limit: int = 20,
    as_json: Annotated[bool, typer.Option("--json", help="the API's JSON (whole ids), for scripts")] = False,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """The newest jobs, as a table (or JSON)."""
    with service_client(server, api_key, data_dir) as client:
        page = client.list(status=status, kind=kind, limit=limit)
    if as_json:
        print(json.dumps(page["items"], indent=2))
        return
    if not page["items"]:
        console.print("no jobs")
        return
    console.print(jobs_table(page["items"]))


def _created(job: dict) -> str:
    """Local time of day for today's jobs, the date for older ones (as `ls -l` shortens)."""
    created = datetime.fromisoformat(job["created_at"]).astimezone()
    return created.strftime("%H:%M" if created.date() == datetime.now().astimezone().date() else "%m-%d")


def jobs_table(jobs: list[dict]) -> Table:
    """Fits 80 columns with every kind and phase whole: short ids, the time of day or date of creation."""
    short = short_ids([job["id"] for job in jobs])
    table = Table(
        Column("id", no_wrap=True),
        Column("status", no_wrap=True),
        Column("kind", no_wrap=True),
        Column("done", justify="right", no_wrap=True),
        "phase",
        Column("elapsed", justify="right"),
        Column("created", no_wrap=True),
        box=None,
        pad_edge=False,
        header_style="bold",
    )
    for job in jobs:
        phase = job["phase"] if job["status"] == "running" else (job.get("error") or {}).get("type", "")
        table.add_row(
            short[job["id"]],
            _status(job["status"]),
            job["kind"],
            f"{job['progress']:.0%}",
            phase or "",
            _elapsed(job),
            _created(job),
        )
    return table


def _follow(client, job: dict) -> None:
    """A progress bar over the job's events; the summary table at the end; exit 1 unless it succeeded."""
    with progress_view(job["status"]) as (_bar, show):
        for event in client.events(job["id"]):
            show(event)
    _print_outcome(client, client.get(job["id"]))


def _print_outcome(client, job: dict) -> None:
    """Exit status 0 only for a job that succeeded without an error: the job's own verdict, whatever
    decides it on the server (a failed quality check fails the job there, and so exits 1 here)."""
    err_console.print(f"job {job['id']} {_status(job['status'])} in {_elapsed(job)}")
    if job["status"] == SUCCEEDED and not job.get("error"):
        report = client.report(job["id"])
        if report:
            console.print(summary_table(report))
        return
    if job.get("error"):
        if job["error"]["type"] == "quality_gate" and (report := client.report(job["id"])):
            console.print(summary_table(report))  # the figures that missed the gate (its files are kept)
        err_console.print(f"[red]{escape(job['error']['type'])}[/]: {escape(job['error'].get('detail') or '')}")
    raise typer.Exit(code=1)


@jobs_app.command()
def watch(
    job_id: JobIdArg, server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Follow a job live until it ends; exit status 0 only if it succeeded."""
    with service_client(server, api_key, data_dir) as client:
        _follow(client, resolve_job(client, job_id))


_CANCEL_OUTCOMES = {
    "pending": " (its worker stops it at the next training step or stage, within a heartbeat)",
    "too_late": " (the cancel came too late: the job had ended)",
}


@jobs_app.command()
def cancel(
    job_id: JobIdArg, server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Cancel a queued job at once, or ask a running job's worker to stop it."""
    with service_client(server, api_key, data_dir) as client:
        job = client.cancel(resolve_job(client, job_id)["id"])
    console.print(f"job {job['id']}: {_status(job['status'])}{_CANCEL_OUTCOMES.get(job.get('cancel_outcome'), '')}")


def _why_missing(job: dict, kinds: list[str], error: ApiError) -> str:
    """A job without the artifact asked for: say where the job stands, not only that the file is absent."""
    wanted = ", ".join(kinds)
    if job["status"] in ("queued", "running"):
        phase = f", {job['phase']}" if job.get("phase") else ""
        return (
            f"job {job['id']} is still {job['status']} ({job['progress']:.0%}{phase}): its {wanted} artifact "
            f"comes when it succeeds; `amct jobs watch {job['id'][:SHORT_ID]}` follows it"
        )
    if job["status"] == "failed" and (job.get("error") or {}).get("type") == "quality_gate":
        return (
            f"job {job['id']} failed its quality gate and kept its outputs, but none is {wanted}; "
            f"`amct jobs download {job['id'][:SHORT_ID]}` fetches them all"
        )
    if job["status"] in (FAILED, CANCELLED):
        cause = f" ({job['error']['type']})" if job.get("error") else ""
        return (
            f"job {job['id']} {job['status']}{cause}, so it has no {wanted} artifact; `amct jobs watch "
            f"{job['id'][:SHORT_ID]}` says why, `--kind log` fetches its engine log"
        )
    return error.problem.get("detail") or str(error)


@jobs_app.command()
def download(
    job_id: JobIdArg,
    kind: Annotated[
        list[str] | None, typer.Option(help="artifact kind, repeatable: deploy, report, …; default: all")
    ] = None,
    out: Annotated[Path, typer.Option(help="folder to write into")] = Path("."),
    force: Annotated[bool, typer.Option("--force", help="replace files that exist in --out")] = False,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Download a job's artifacts (ONNX models, record, report, log) into a folder."""
    with service_client(server, api_key, data_dir) as client:
        job = resolve_job(client, job_id)
        try:
            paths = client.download_artifacts(job["id"], out, kind, overwrite=force)
        except FileExistsError as e:
            raise fail(f"{e}: pass --force to replace them, or --out another folder") from None
        except ApiError as e:
            if e.status == 404 and e.field == "kind":
                raise fail(_why_missing(client.get(job["id"]), kind or [], e)) from None
            raise
    table = Table("file", "bytes")
    for path in paths:
        table.add_row(str(path), f"{path.stat().st_size:,}")
    console.print(table)
