"""Crash recovery, N times per scenario: SIGKILL mid-training, the job resumes from its checkpoint and succeeds.

Each trial submits a 2-epoch INT8 QAT job (SmallFashionCnn, 400 Fashion-MNIST images, batch 16) and
kills something once the checkpoint of epoch 1 is stored (tests/service/crash_scenario.py):

- `worker`: the whole process group of a real `celery worker` (PostgreSQL + a private redis-server);
  a fresh worker is started; the reaper finds the expired lease (lease 3 s, reaper every 1 s);
- `engine`: only the engine child under a live Celery worker (PostgreSQL + Redis); the worker puts the
  job back as another attempt and runs it at once;
- `embedded`: the worker process of a real `amct serve` (SQLite, filesystem queue); the server kills
  what is left of its group, releases its leases, reaps and starts a new worker.

Per scenario it prints how many trials succeeded, resumed from the checkpoint stored before the kill,
ran no training step twice, and left no job queued (requeued -> claimed within 30 s), with recovery
time (kill -> the new attempt's `resumed` event) and kill -> succeeded. PostgreSQL is a throwaway
database (``AMCT_BENCH_PG_URL``; SQLite when unreachable).

    .venv/bin/python bench/recovery.py [--trials 10] [--scenarios worker,engine,embedded]

``make bench`` runs it as its ``recovery`` section (``section``: 3 trials per scenario), rendered by bench/report.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `service` and `tests` importable
    sys.path.insert(0, str(ROOT))

PG_ADMIN_URL = os.environ.get("AMCT_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def make_assets(folder: Path) -> None:
    """The test suite's assets: a TorchScript CNN trained 1 epoch on 3,000 images, 400 unseen images."""
    import numpy as np
    import torch

    from examples.fashion_mnist import load_fashion_mnist
    from examples.models import SmallFashionCnn
    from job_process.training import make_loader, train_epochs

    x, y = load_fashion_mnist("train", limit=3400)
    torch.manual_seed(0)
    model = SmallFashionCnn()
    train_epochs(model, make_loader(x[:3000], y[:3000], 64, seed=0), 1, 2e-3)
    torch.jit.script(model.eval()).save(str(folder / "cnn.pt"))
    np.savez(folder / "small.npz", inputs=x[3000:3400].numpy(), labels=y[3000:3400].numpy())


@contextmanager
def database():
    """A throwaway PostgreSQL database, or None (SQLite under the data folder) when PG is unreachable."""
    try:
        import psycopg

        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except Exception as e:  # no server, no driver: the embedded default is still a real database
        print(f"PostgreSQL unreachable ({e}); using SQLite", file=sys.stderr)
        yield None
        return
    name = f"amct_bench_recovery_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        from core.db.session import engine_for

        engine_for.cache_clear()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


SCENARIOS = ("worker", "engine", "embedded")
COUNTS = ("succeeded", "resumed", "none_run_twice", "none_left_queued")


def tally(trials: list) -> dict:
    """The per-scenario counts `main` prints; a trial that raised counts as failed on every line."""
    from tests.service.crash_scenario import trial_summary

    counts = dict.fromkeys(COUNTS, 0)
    for trial in trials:
        if trial is None:
            continue
        summary = trial_summary(trial)
        counts["succeeded"] += summary["succeeded"] and bool(trial.artifacts) and all(trial.artifacts.values())
        counts["resumed"] += summary["resumed"]
        counts["none_run_twice"] += not summary["ran_twice"]
        counts["none_left_queued"] += not summary["left_queued"]
    done = [t for t in trials if t is not None]
    return {
        "trials": len(trials),
        **counts,
        "orphans": sum(len(t.orphans) for t in done),
        "recover_s": [t.recover_s for t in done],
        "finish_s": [t.finish_s for t in done],
    }


def _trials(n: int, name: str, one) -> list:
    results = []
    for i in range(n):
        try:
            trial = one(i)
        except Exception as e:  # a trial that hangs or breaks counts as failed, the rest go on
            print(f"{name} trial {i + 1}: FAILED ({type(e).__name__}: {e})", flush=True)
            results.append(None)
            continue
        results.append(trial)
        print(
            f"{name} trial {i + 1}: {trial.job['status']} on attempt {trial.job['attempt']}, killed after epoch "
            f"{trial.killed_after['epoch']} (step {trial.killed_after['step']}), resumed from "
            f"{_position(trial.resumed)}, recovered in {trial.recover_s:.1f} s, finished "
            f"{trial.finish_s:.1f} s after the kill",
            flush=True,
        )
    return results


def run(trials: int, workdir: Path, scenarios=SCENARIOS) -> dict[str, dict]:
    """Run the trials of each scenario; returns the tallies that `main` prints."""
    from tests.service.crash_scenario import (
        FAST_RECOVERY,
        FAST_RECOVERY_ENV,
        EmbeddedServer,
        RedisServer,
        kill_and_resume,
        kill_embedded_worker_and_resume,
        kill_engine_and_resume,
    )
    from tests.service.support import QUANT_CFG, Api, make_settings, open_api

    make_assets(workdir)
    results: dict[str, dict] = {}
    if {"worker", "engine"} & set(scenarios):
        redis_server = RedisServer(workdir / "redis")
        try:
            with database() as database_url:
                settings = make_settings(
                    workdir / "data", database_url=database_url, broker_url=redis_server.url, **FAST_RECOVERY
                )
                with open_api(settings) as client:
                    api = Api(client, settings)
                    ids = {
                        "model_id": api.upload_model(workdir / "cnn.pt").json()["id"],
                        "config_id": api.upload_config(QUANT_CFG).json()["id"],
                        "dataset_id": api.upload_dataset((workdir / "small.npz").read_bytes()).json()["id"],
                    }
                    if "worker" in scenarios:
                        results["worker"] = tally(
                            _trials(
                                trials,
                                "worker",
                                lambda i: kill_and_resume(
                                    api, ids, workdir / f"worker-{i + 1}", epochs=2, batch_size=16
                                ),
                            )
                        )
                    if "engine" in scenarios:
                        results["engine"] = tally(
                            _trials(
                                trials,
                                "engine",
                                lambda i: kill_engine_and_resume(api, ids, workdir / f"engine-{i + 1}"),
                            )
                        )
        finally:
            redis_server.kill()
    if "embedded" in scenarios:
        with EmbeddedServer(workdir / "embedded", **FAST_RECOVERY_ENV) as server:
            ids = server.upload(workdir)
            results["embedded"] = tally(
                _trials(trials, "embedded", lambda i: kill_embedded_worker_and_resume(server, ids))
            )
    return results


def postgres_reachable() -> bool:
    try:
        import psycopg

        psycopg.connect(PG_ADMIN_URL, connect_timeout=3).close()
    except Exception:  # no server, no driver: `database` falls back to SQLite
        return False
    return True


def section(trials: int) -> dict:
    """The ``recovery`` section of ``make bench`` (bench/run_all.py; 3 trials per scenario there, 1 with
    ``--quick``, 10 by default on its own), rendered by bench/report.py: the tallies, the database, the load."""
    load = os.getloadavg()
    db = "PostgreSQL" if postgres_reachable() else "SQLite (PostgreSQL unreachable)"
    with tempfile.TemporaryDirectory(prefix="amct-bench-recovery-") as tmp:
        scenarios = run(trials, Path(tmp))
    return {"trials": trials, "database": db, "scenarios": scenarios, "load_avg": [load, os.getloadavg()]}


def _position(event: dict | None) -> str:
    return "nothing (started over)" if event is None else f"epoch {event['epoch']} step {event['step']}"


def _stats(samples: list[float]) -> str:
    if not samples:
        return "n/a"
    return f"min {min(samples):.1f} / median {statistics.median(samples):.1f} / max {max(samples):.1f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated: " + ", ".join(SCENARIOS))
    args = parser.parse_args(argv)
    from examples.fashion_mnist import fashion_mnist_available

    if not fashion_mnist_available():
        print("recovery: Fashion-MNIST is missing: apt-get install dataset-fashion-mnist", file=sys.stderr)
        return 2
    scenarios = [s for s in args.scenarios.split(",") if s]
    with tempfile.TemporaryDirectory(prefix="amct-bench-recovery-") as tmp:
        results = run(args.trials, Path(tmp), scenarios)
    ok = True
    print(
        f"\n{'scenario':<10} {'trials':>6} {'succeeded':>9} {'resumed':>7} {'none run twice':>14} "
        f"{'none left queued':>16} {'orphans':>7}  recover (kill -> resumed) / kill -> succeeded"
    )
    for name, r in results.items():
        print(
            f"{name:<10} {r['trials']:>6} {r['succeeded']:>9} {r['resumed']:>7} {r['none_run_twice']:>14} "
            f"{r['none_left_queued']:>16} {r['orphans']:>7}  {_stats(r['recover_s'])} / {_stats(r['finish_s'])}"
        )
        ok = ok and all(r[c] == r["trials"] for c in COUNTS) and r["orphans"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
