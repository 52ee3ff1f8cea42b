"""Crash recovery, N times: SIGKILL the worker mid-training, start a new one, the job resumes and succeeds.

Each trial (tests/service/crash_scenario.kill_and_resume, the scenario of
tests/service/test_recovery.py) submits a 3-epoch INT8 QAT job (SmallFashionCnn, 400 Fashion-MNIST
images), kills the whole process group of the real `celery worker` running it once the checkpoint
of epoch 1 is stored, and starts a fresh worker. The reaper finds the expired lease (lease 3 s,
reaper every 1 s), re-queues the job, and the new attempt resumes from the checkpoint. A trial
passes when the job ends `succeeded` on attempt 2, resumed at the killed epoch (not 0), with every
artifact's bytes matching its sha256 and no engine process left behind.

Recovery time = kill -> the new attempt's `resumed` event (worker start, lease expiry, reaper,
claim, the engine's start-up); finish = kill -> `succeeded`. PostgreSQL (a throwaway database,
``AMCT_BENCH_PG_URL``; SQLite when unreachable) and a private redis-server on a free port.

    .venv/bin/python bench/recovery.py [--trials 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import uuid
from collections import Counter
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
        from service.db.session import engine_for

        engine_for.cache_clear()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def trial_passed(trial) -> bool:
    resumed, killed = trial.resumed, trial.killed_after
    return (trial.job["status"] == "succeeded" and trial.job["attempt"] == 2 and resumed is not None
            and killed["epoch"] >= 1 and (resumed["epoch"], resumed["step"]) == (killed["epoch"], killed["step"])
            and bool(trial.artifacts) and all(trial.artifacts.values()) and not trial.orphans)


def run(trials: int, workdir: Path) -> dict:
    """Run the trials; returns the counts and timings that `main` prints."""
    from tests.service.crash_scenario import FAST_RECOVERY, RedisServer, kill_and_resume
    from tests.service.support import QUANT_CFG, Api, make_settings, open_api

    make_assets(workdir)
    redis_server = RedisServer(workdir / "redis")
    results = []
    try:
        with database() as database_url:
            settings = make_settings(workdir / "data", database_url=database_url, broker_url=redis_server.url,
                                     **FAST_RECOVERY)
            with open_api(settings) as client:
                api = Api(client, settings)
                ids = {"model_id": api.upload_model(workdir / "cnn.pt").json()["id"],
                       "config_id": api.upload_config(QUANT_CFG).json()["id"],
                       "dataset_id": api.upload_dataset((workdir / "small.npz").read_bytes()).json()["id"]}
                for i in range(trials):
                    try:
                        trial = kill_and_resume(api, ids, workdir / f"trial-{i + 1}")
                    except Exception as e:  # a trial that hangs or breaks counts as failed, the rest go on
                        print(f"trial {i + 1}: FAILED ({type(e).__name__}: {e})", flush=True)
                        results.append(None)
                        continue
                    ok = trial_passed(trial)
                    results.append(trial if ok else None)
                    print(f"trial {i + 1}: {'ok' if ok else 'FAILED'}  killed after epoch "
                          f"{trial.killed_after['epoch']} (step {trial.killed_after['step']}), resumed from "
                          f"{_position(trial.resumed)}, recovered in {trial.recover_s:.1f} s, succeeded "
                          f"{trial.finish_s:.1f} s after the kill", flush=True)
    finally:
        redis_server.kill()
    passed = [t for t in results if t is not None]
    return {"trials": trials, "passed": len(passed),
            "resumed_from_epoch": Counter(t.resumed["epoch"] for t in passed),
            "recover_s": [t.recover_s for t in passed], "finish_s": [t.finish_s for t in passed]}


def _position(event: dict | None) -> str:
    return "nothing (started over)" if event is None else f"epoch {event['epoch']} step {event['step']}"


def _stats(samples: list[float]) -> str:
    if not samples:
        return "n/a"
    return f"min {min(samples):.1f} / median {statistics.median(samples):.1f} / max {max(samples):.1f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args(argv)
    from examples.fashion_mnist import fashion_mnist_available

    if not fashion_mnist_available():
        print("recovery: Fashion-MNIST is missing: apt-get install dataset-fashion-mnist", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="amct-bench-recovery-") as tmp:
        result = run(args.trials, Path(tmp))
    epochs = ", ".join(f"epoch {e} ({n}x)" for e, n in sorted(result["resumed_from_epoch"].items())) or "-"
    print(f"{result['passed']}/{result['trials']} succeeded, resumed from {epochs}")
    print(f"time to recover (kill -> resumed): {_stats(result['recover_s'])}")
    print(f"kill -> succeeded: {_stats(result['finish_s'])}")
    return 0 if result["passed"] == result["trials"] else 1


if __name__ == "__main__":
    sys.exit(main())
