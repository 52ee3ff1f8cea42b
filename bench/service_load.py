"""Service latency: submit -> running on an idle worker, and GET /v1/jobs/{id} under load.

Starts `python -m service serve` on a free port (embedded: SQLite + filesystem queue) unless
--url names a running server; DATABASE_URL / BROKER_URL in the environment switch the started
server to PostgreSQL / Redis. The load comes from separate processes, never the server's own.

    .venv/bin/python bench/service_load.py [--url URL] [--jobs 3] [--seconds 10] [--clients 4]

Prints one JSON object with the numbers.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CFG = b"retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(data_dir: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "service", "serve", "--port", str(port), "--data-dir", data_dir],
                            cwd=ROOT, env=env, stdout=open(Path(data_dir) / "serve.log", "wb"),  # noqa: SIM115
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not become ready")


def upload_inputs(client: httpx.Client, workdir: Path) -> dict:
    """An untrained SmallFashionCnn and random data: latency does not depend on what is learnt."""
    import torch

    from amct_engine.data.training import SmallFashionCnn

    torch.manual_seed(0)
    torch.jit.script(SmallFashionCnn().eval()).save(str(workdir / "cnn.pt"))
    buf = io.BytesIO()
    rng = np.random.default_rng(0)
    np.savez(buf, inputs=rng.standard_normal((2048, 1, 28, 28), dtype=np.float32), labels=rng.integers(0, 10, 2048))
    with open(workdir / "cnn.pt", "rb") as f:
        model = client.post("/v1/models", files={"file": ("cnn.pt", f)},
                            data={"name": "cnn", "input_shape": "1,1,28,28"})
    config = client.post("/v1/configs", files={"file": ("q.cfg", CFG)}, data={"kind": "retrain"})
    dataset = client.post("/v1/datasets", files={"file": ("d.npz", buf.getvalue())})
    for r in (model, config, dataset):
        r.raise_for_status()
    return {"model_id": model.json()["id"], "config_id": config.json()["id"], "dataset_id": dataset.json()["id"]}


def _wait(client: httpx.Client, job_id: str, statuses: set[str], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in statuses:
            return job
        time.sleep(0.005)
    raise TimeoutError(f"job {job_id} not in {statuses}")


def submit_to_running(client: httpx.Client, ids: dict, jobs: int, idle_s: float) -> list[float]:
    """Client-observed seconds from POST /v1/jobs to status running; each job is then cancelled.

    `idle_s` between jobs lets the worker recycle its process after the cancelled job: the number
    is for an idle worker, not one still cleaning up.
    """
    latencies = []
    for i in range(jobs):
        time.sleep(idle_s)
        start = time.perf_counter()
        job = client.post("/v1/jobs", json={"kind": "quant_retrain", **ids, "epochs": 50, "seed": i}).json()
        _wait(client, job["id"], {"running", "failed", "succeeded"})
        latencies.append(time.perf_counter() - start)
        client.post(f"/v1/jobs/{job['id']}/cancel")
        _wait(client, job["id"], {"cancelled", "failed", "succeeded"})
    return latencies


def _load_worker(url: str, job_ids: list[str], seconds: float, threads: int, out: mp.Queue) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def loop(k: int) -> list[float]:
        samples = []
        with httpx.Client(base_url=url, timeout=10) as client:
            deadline = time.monotonic() + seconds
            i = k
            while time.monotonic() < deadline:
                start = time.perf_counter()
                client.get(f"/v1/jobs/{job_ids[i % len(job_ids)]}").raise_for_status()
                samples.append((time.perf_counter() - start) * 1000)
                i += 1
        return samples

    with ThreadPoolExecutor(threads) as pool:
        out.put([s for part in pool.map(loop, range(threads)) for s in part])


def get_job_load(url: str, job_ids: list[str], seconds: float, clients: int) -> dict:
    out: mp.Queue = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=_load_worker, args=(url, job_ids, seconds, clients, out))
    proc.start()
    samples = out.get(timeout=seconds + 60)
    proc.join()
    q = statistics.quantiles(samples, n=100)
    return {"requests": len(samples), "clients": clients, "seconds": seconds,
            "throughput_rps": len(samples) / seconds, "p50_ms": q[49], "p99_ms": q[98], "max_ms": max(samples)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start an embedded one)")
    parser.add_argument("--jobs", type=int, default=3, help="submit->running samples")
    parser.add_argument("--seconds", type=float, default=10.0, help="GET load duration")
    parser.add_argument("--clients", type=int, default=4, help="concurrent GET clients (threads)")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds the worker idles before each submit")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="amct-bench-") as tmp:
        proc, url = (None, args.url) if args.url else start_server(tmp)
        try:
            with httpx.Client(base_url=url, timeout=60) as client:
                ids = upload_inputs(client, Path(tmp))
                latencies = submit_to_running(client, ids, args.jobs, args.idle)
                job_ids = [j["id"] for j in client.get("/v1/jobs", params={"limit": 50}).json()["items"]]
            load = get_job_load(url, job_ids, args.seconds, args.clients)
        finally:
            if proc is not None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
    database = os.environ.get("DATABASE_URL", "sqlite (embedded)").split("@")[-1]
    print(json.dumps({"server": args.url or "started: python -m service serve", "database": database,
                      "broker": os.environ.get("BROKER_URL", "filesystem (embedded)"),
                      "submit_to_running_s": {"samples": [round(x, 3) for x in latencies],
                                              "median": statistics.median(latencies)},
                      "get_job": load}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
