"""`amct`: the service (`serve`, `worker`, `migrate`), the engine on this machine (`compress`,
`distill-config`), a client of a running service (`jobs …`) and its keys (`admin …`).

`amct serve` with no DATABASE_URL, BROKER_URL or ARTIFACT_STORE keeps everything under --data-dir:
SQLite, kombu's filesystem transport and the local store. Set them and the same command serves
from PostgreSQL, Redis and S3 (then run workers with `amct worker` on each node).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from core.settings import DEVICES, Settings
from job_host.kinds import JOB_KINDS
from job_host.spec import JobParams
from service import local_servers
from service.cli_common import (
    DEFAULT_DATA_DIR,
    DEFAULT_DEVICE,
    DEFAULT_KIND,
    Device,
    InputsOpt,
    Kind,
    check_job_settings,
    check_not_raw_images,
    console,
    fail,
    model_signature,
    progress_view,
)
from service.cli_job_options import job_options
from service.cli_jobs import jobs_app

log = logging.getLogger("amct.serve")
app = typer.Typer(
    name="amct",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="AMCT compression: the service, the engine on this machine, and a client of the service.",
)
app.add_typer(jobs_app, name="jobs")
try:  # the API-key admin commands (service/admin_cli.py)
    from service.admin_cli import admin_app
except ImportError:  # pragma: no cover - only while that module is absent
    admin_app = None
if admin_app is not None:
    app.add_typer(admin_app, name="admin")


# -- the service ---------------------------------------------------------------------------------------


def worker_command(settings: Settings, devices: list[str], beat: bool, concurrency: int = 1) -> list[str]:
    queues = ",".join(settings.queue_for(d) for d in devices)
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "worker.main",
        "worker",
        "-Q",
        queues,
        "--concurrency",
        str(concurrency),
        "--loglevel",
        "INFO",
        "-O",
        "fair",
        "--without-gossip",
        "--without-mingle",
    ]
    if beat:  # the reaper's schedule; one beat per deployment
        cmd += ["-B", "-s", str((settings.data_dir / "celerybeat-schedule").resolve())]
    return cmd


def local_devices() -> list[str]:
    """The devices this machine has, for the embedded worker: cpu, and cuda / npu when their device files
    exist (without importing torch: the server never does). A worker that claimed a device the machine
    lacks would take its jobs only to fail them; unserved, they are refused at submit (core/workers.py)."""
    found = ["cpu"]
    if Path("/dev/nvidia0").exists() or Path("/dev/nvidiactl").exists():
        found.append("cuda")
    if any(Path("/dev").glob("davinci[0-9]*")):
        found.append("npu")
    return [d for d in DEVICES if d in found]


def _devices(text: str) -> list[str]:
    """`cpu,npu` -> ["cpu", "npu"]; an unknown name is a usage error naming it, not a queue nobody serves."""
    devices = [d.strip() for d in text.split(",") if d.strip()]
    unknown = [d for d in devices if d not in DEVICES]
    if unknown or not devices:
        raise typer.BadParameter(f"unknown device {', '.join(unknown) or text!r}; choose from {', '.join(DEVICES)}")
    return devices


def start_worker(settings: Settings, devices: list[str], beat: bool):
    """The embedded worker, watched and restarted by a thread of this process (service/embedded_worker.py)."""
    from service.embedded_worker import EmbeddedWorker

    env = dict(
        os.environ,
        AMCT_DATA_DIR=str(settings.data_dir.resolve()),
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")])
        ),
    )
    return EmbeddedWorker(settings, worker_command(settings, devices, beat), env).start()


@app.command()
def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    data_dir: Annotated[
        Path, typer.Option(envvar="AMCT_DATA_DIR", help="SQLite, queue, artifacts and the local api-key live here")
    ] = DEFAULT_DATA_DIR,
    no_worker: Annotated[bool, typer.Option("--no-worker", help="run the API only")] = False,
    worker_devices: Annotated[
        str | None,
        typer.Option(
            help="comma-separated devices the embedded worker claims (default: cpu, and cuda / npu when "
            "their device files exist)"
        ),
    ] = None,
) -> None:
    """API + dashboard (/ui) + embedded worker (SQLite, no broker server) unless configured otherwise."""
    import uvicorn

    from core.db import migrate
    from service.app import ApiServer, create_app

    logging.basicConfig(level=logging.INFO)
    os.environ["AMCT_DATA_DIR"] = str(data_dir.resolve())
    settings = Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # So `amct jobs …` finds this server's api-key from any folder (service/local_servers.py).
    local_servers.remember(f"http://{host}:{port}", settings.data_dir)
    # Migrate before the worker starts, so neither races the other on an empty database.
    migrate.upgrade(settings.resolved_database_url)
    devices = _devices(worker_devices) if worker_devices else local_devices()
    worker = None if no_worker else start_worker(settings, devices, beat=True)
    # uvicorn shuts down on SIGTERM, then re-raises it to the handler it found: with the default one the
    # process would die there, before the `finally` below stops the worker. Exit normally instead.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # uvicorn.run's server, plus hanging up the job event streams when it stops (service/app.py).
    server = ApiServer(
        uvicorn.Config(create_app(settings, run_migrations=False), host=host, port=port, log_level="info")
    )
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it stopped on; a stop, as in uvicorn.run
        pass
    finally:
        if worker is not None:
            # A second Ctrl-C while the worker stops kills it, instead of a KeyboardInterrupt traceback.
            signal.signal(signal.SIGINT, lambda *_: worker.kill())
            worker.stop(grace_s=30)
    if not server.started:
        sys.exit(3)  # uvicorn's start-up failure status, as uvicorn.run exits when it never served


@app.command()
def api(
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: Annotated[int, typer.Option(min=1, help="API processes on the port, about one per core")] = 2,
    log_level: str = "info",
) -> None:
    """The API alone, as several processes (production: DATABASE_URL, BROKER_URL, ARTIFACT_STORE)."""
    from service import api_processes

    logging.basicConfig(level=logging.INFO)
    api_processes.run(host, port, workers, log_level)


@app.command()
def worker(
    devices: Annotated[str, typer.Option(help="comma-separated: cpu,cuda,npu")] = "cpu",
    concurrency: Annotated[int, typer.Option(help="one per accelerator")] = 1,
    beat: Annotated[bool, typer.Option("--beat", help="also run the reaper schedule (one per deployment)")] = False,
) -> None:
    """A Celery worker for the given device queues."""
    logging.basicConfig(level=logging.INFO)
    settings = Settings()
    os.execv(sys.executable, worker_command(settings, _devices(devices), beat=beat, concurrency=concurrency))


@app.command()
def migrate() -> None:
    """Upgrade the database to the newest schema."""
    from core.db import migrate as db_migrate

    logging.basicConfig(level=logging.INFO)
    db_migrate.upgrade(Settings().resolved_database_url)


# -- the engine on this machine ---------------------------------------------------------------------------


@app.command()
@job_options(exclude=("world_size", "nodes"))
def compress(
    model: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="TorchScript file")],
    cfg: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="AMCT .cfg")],
    data: Annotated[
        Path, typer.Option(exists=True, dir_okay=False, help=".npz or .safetensors with `inputs` (and `labels`)")
    ],
    out: Annotated[Path, typer.Option(help="folder for the ONNX models, record, report.json")],
    params: JobParams,
    kind: Annotated[Kind, typer.Option()] = DEFAULT_KIND,
    input_shape: Annotated[str | None, typer.Option(help="e.g. 1,1,28,28; default: from the data")] = None,
    inputs: InputsOpt = None,
    device: Annotated[Device, typer.Option()] = DEFAULT_DEVICE,
    accept_uint8: Annotated[
        bool,
        typer.Option("--accept-uint8", help="use uint8 inputs as they are (for a model that scales its input itself)"),
    ] = False,
) -> None:
    """Compress a model here, no server: the engine a worker runs, with a progress bar and a summary table."""
    from job_host.bubblewrap import SandboxUnavailable
    from service.local_compress import LocalJobError, check_inputs
    from service.local_compress import compress as run_local

    llm = JOB_KINDS[kind.value].llm  # text data; a causal LM's signature unless --inputs says otherwise
    if llm and not inputs and not input_shape:
        from service.model_folder import LLM_EXAMPLE_SHAPE, LLM_INPUTS

        signature, shape = LLM_INPUTS, LLM_EXAMPLE_SHAPE
    else:
        signature, shape = model_signature(inputs, input_shape, data)
    check_job_settings(kind.value, params)
    if not inputs and not llm:  # a signature names its arrays and their dtypes; the shorthand's may be raw pixels
        check_not_raw_images(data, accept_uint8)
    try:  # what the API would refuse at upload and submit (model, cfg, dataset), refused before the engine starts
        params.objective = check_inputs(model, cfg, data, kind.value, signature, params)
    except LocalJobError as e:
        raise fail(f"{e.type}: {e.detail}") from None
    with progress_view() as (bar, show):
        try:
            result = run_local(
                model, cfg, data, kind.value, out, signature, shape, params, device.value, on_message=show
            )
        except LocalJobError as e:
            raise fail(f"{e.type}: {e.detail}") from None
        except SandboxUnavailable as e:  # the engine runs the model in bubblewrap here too (docs/security.md)
            raise fail(str(e)) from None
        bar.update(bar.task_ids[0], completed=1.0, description="done")
    _print_result(result, f"{kind.value}: {model.name} → {out}")


def _print_result(result: dict, title: str) -> None:
    from service.report_view import layer_tables, summary_table

    console.print(summary_table(result["report"], title=title))
    for table in layer_tables(result["report"]):
        console.print(table)
    files = Table("artifact", "file", "bytes")
    for artifact, path in sorted(result["files"].items()):
        files.add_row(artifact, str(path), f"{path.stat().st_size:,}")
    console.print(files)


@app.command("distill-config")
def distill_config(
    model: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="TorchScript file")],
    out: Annotated[Path, typer.Option(help="the JSON distill config to write")],
    cfg: Annotated[Path | None, typer.Option(exists=True, dir_okay=False, help="AMCT distill .cfg (optional)")] = None,
    input_shape: Annotated[str | None, typer.Option(help="e.g. 1,1,28,28")] = None,
    inputs: InputsOpt = None,
    data: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="read the input shape from this dataset")
    ] = None,
) -> None:
    """AMCT's create_distill_config: find the distillable layers and groups, write the JSON config."""
    from amct_engine.config.errors import ConfigError
    from service.local_compress import distill_config as make_config

    signature, shape = model_signature(inputs, input_shape, data)
    try:
        config = make_config(model, out, signature, shape, cfg)
    except ConfigError as e:
        raise fail(str(e)) from None
    console.print(f"wrote {out}: {len(config['distill_group'])} distill groups")
    # Numbered from 1, as the job's progress and checkpoint events number them.
    groups = Table("group", "layers")
    for i, group in enumerate(config["distill_group"], start=1):
        groups.add_row(str(i), " → ".join(group))
    console.print(groups)
    layers = Table("layer", "activations", "weights")
    for name, spec in config.items():
        if isinstance(spec, dict) and spec.get("quant_enable"):
            data_cfg, weight_cfg = spec.get("distill_data_config", {}), spec.get("distill_weight_config", {})
            layers.add_row(
                name,
                f"{data_cfg.get('algo', '')} {data_cfg.get('dst_type', '')}",
                f"{weight_cfg.get('algo', '')} {weight_cfg.get('dst_type', '')}",
            )
    console.print(layers)


def main(argv: list[str] | None = None) -> int:
    """The `amct` entry point (and `python -m service`); returns the exit status."""
    from pydantic import ValidationError

    try:
        app(args=argv, prog_name="amct")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except ValidationError as e:  # the server's settings, from AMCT_* variables (core/settings.py): one line
        print(f"error: {_settings_error(e)}", file=sys.stderr)
        return 1
    return 0


def _settings_error(error) -> str:
    from job_host.spec import validation_message

    first = error.errors()[0]
    where = f"AMCT_{str(first['loc'][0]).upper()}: " if first["loc"] else ""
    return f"{where}{validation_message(first)} (settings: docs/service.md)"
