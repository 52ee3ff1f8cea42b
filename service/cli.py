"""`amct serve` / `python -m service serve`: the API plus an embedded worker, with no server to install.

With no DATABASE_URL, BROKER_URL or ARTIFACT_STORE, everything lives under --data-dir: SQLite,
kombu's filesystem transport and the local store. Set them and the same command serves from
PostgreSQL, Redis and S3 (then run workers with `python -m service worker` on each node).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from service.settings import DEVICES, Settings

log = logging.getLogger("amct.serve")


def worker_command(settings: Settings, devices: list[str], beat: bool, concurrency: int = 1) -> list[str]:
    queues = ",".join(settings.queue_for(d) for d in devices)
    cmd = [sys.executable, "-m", "celery", "-A", "worker.main", "worker", "-Q", queues,
           "--concurrency", str(concurrency), "--loglevel", "INFO", "-O", "fair",
           "--without-gossip", "--without-mingle"]
    if beat:  # the reaper's schedule; one beat per deployment
        cmd += ["-B", "-s", str((settings.data_dir / "celerybeat-schedule").resolve())]
    return cmd


def start_worker(settings: Settings, devices: list[str], beat: bool) -> subprocess.Popen:
    env = dict(os.environ, AMCT_DATA_DIR=str(settings.data_dir.resolve()),
               PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                         os.environ.get("PYTHONPATH")])))
    return subprocess.Popen(worker_command(settings, devices, beat), env=env)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from service.app import create_app
    from service.db import migrate

    os.environ["AMCT_DATA_DIR"] = str(Path(args.data_dir).resolve())
    settings = Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # Migrate before the worker starts, so neither races the other on an empty database.
    migrate.upgrade(settings.resolved_database_url)
    worker = None if args.no_worker else start_worker(settings, list(DEVICES), beat=True)
    try:
        uvicorn.run(create_app(settings, run_migrations=False), host=args.host, port=args.port,
                    log_level="info")
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
    return 0


def run_worker(args: argparse.Namespace) -> int:
    settings = Settings()
    devices = args.devices.split(",")
    os.execv(sys.executable, worker_command(settings, devices, beat=args.beat, concurrency=args.concurrency))


def run_migrate(_args: argparse.Namespace) -> int:
    from service.db import migrate

    migrate.upgrade(Settings().resolved_database_url)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="amct", description="AMCT compression service")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve", help="API + embedded worker (SQLite, no broker server) unless configured")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--data-dir", default=os.environ.get("AMCT_DATA_DIR", "var"))
    p.add_argument("--no-worker", action="store_true", help="run the API only")
    p.set_defaults(fn=serve)
    w = sub.add_parser("worker", help="a Celery worker for the given device queues")
    w.add_argument("--devices", default="cpu", help="comma-separated: cpu,cuda,npu")
    w.add_argument("--concurrency", type=int, default=1, help="one per accelerator")
    w.add_argument("--beat", action="store_true", help="also run the reaper schedule (one per deployment)")
    w.set_defaults(fn=run_worker)
    m = sub.add_parser("migrate", help="upgrade the database to the newest schema")
    m.set_defaults(fn=run_migrate)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    return args.fn(args)
