"""CPU per API read, this tree against a baseline tree, measured in the same run on the same PostgreSQL.

Latency at a fixed request rate (bench/service_load.py) says whether a server keeps up on this machine,
which on a shared 2-core machine depends mostly on what else runs. The CPU time the API process spends per
request does not: it is what bounds the requests/s one core can serve. For each tree, `python -m service
serve --no-worker` (one API process, its own throwaway database, API keys on) gets a model, a cfg, a dataset
and `--jobs` queued jobs through its own API. Then, in `--rounds` alternating windows of `--seconds` (both
servers up at once, so machine noise hits both alike), `--clients` concurrent clients send `GET
/v1/jobs/{id}` and `GET /v1/jobs?limit=50` in turn (closed loop); the server process's user + system CPU
over the window, from /proc, is divided by the requests it answered. `--conditional` adds windows of this
tree where half the reads send the ETag they got back as `If-None-Match` (304s).

    .venv/bin/python bench/api_cost.py --baseline /work/main [--rounds 3] [--seconds 10] [--clients 8]

Prints JSON: every window, the median CPU ms per request per server, and ours / baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.service_stack import (  # noqa: E402
    PG_ADMIN_URL,
    REDIS_URL,
    drop_redis_keys,
    free_port,
    job_body,
    postgres_database,
    tiny_inputs,
    wait_ready,
)
from job_host.sandbox import stop_group  # noqa: E402


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children that were waited for (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = sum(int(v) for v in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def _python_of(tree: Path) -> str:
    venv = tree / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _admin_key(tree: Path, database_url: str) -> str:
    """An admin key made with the tree's own code (its `amct admin create-key`)."""
    code = (
        "import sys; from service import auth; from core.db.session import session_factory; "
        "print(auth.create_key(session_factory(sys.argv[1]), 'default', ['admin'], name='bench')[1])"
    )
    out = subprocess.run(
        [_python_of(tree), "-c", code, database_url],
        cwd=tree,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(tree)),
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


async def _closed_loop(
    url: str, headers: dict, job_ids: list[str], clients: int, seconds: float, conditional: bool
) -> dict:
    counts = {"200": 0, "304": 0, "other": 0}
    etags: dict[str, str] = {}
    paths = [f"/v1/jobs/{j}" for j in job_ids] + ["/v1/jobs?limit=50"] * len(job_ids)
    deadline = time.monotonic() + seconds

    async def client(index: int) -> None:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
            i = index
            while time.monotonic() < deadline:
                path = paths[i % len(paths)]
                extra = {"If-None-Match": etags[path]} if conditional and i % 2 and path in etags else {}
                response = await http.get(path, headers=extra)
                key = str(response.status_code) if response.status_code in (200, 304) else "other"
                counts[key] += 1
                if "etag" in response.headers:
                    etags[path] = response.headers["etag"]
                i += clients

    await asyncio.gather(*(client(i) for i in range(clients)))
    return counts


@contextmanager
def api_server(tree: Path, jobs: int) -> Iterator[dict]:
    """The tree's API (one process, its own database) with `jobs` queued jobs; stopped on exit."""
    with postgres_database() as database_url, tempfile.TemporaryDirectory(prefix="amct-api-cost-") as tmp:
        port = free_port()
        env = dict(
            os.environ,
            PYTHONPATH=str(tree),
            DATABASE_URL=database_url,
            AMCT_DATA_DIR=tmp,
            AMCT_MAX_ACTIVE_JOBS=str(jobs + 10),
            AMCT_REAP_IN_API="false",
            BROKER_URL=REDIS_URL,
            AMCT_QUEUE_PREFIX=f"amct.apicost.{port}",
        )
        log = Path(tmp) / "serve.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [_python_of(tree), "-m", "service", "serve", "--no-worker", "--port", str(port)],
                cwd=tree,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc, log)
            headers = {"Authorization": f"Bearer {_admin_key(tree, database_url)}"}
            with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
                model_bytes, data_bytes = tiny_inputs()
                model = http.post(
                    "/v1/models",
                    files={"file": ("tiny.pt", model_bytes)},
                    data={"name": "tiny", "input_shape": "1,1,8,8"},
                ).json()["id"]
                cfg = http.post(
                    "/v1/configs",
                    files={
                        "file": (
                            "q.cfg",
                            b"retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }\n",
                        )
                    },
                    data={"kind": "retrain"},
                ).json()["id"]
                data = http.post("/v1/datasets", files={"file": ("d.npz", data_bytes)}).json()["id"]
                deadline = time.monotonic() + 300
                while http.get(f"/v1/models/{model}").json()["status"] != "ready":
                    if time.monotonic() > deadline:
                        raise RuntimeError("the model did not become ready")
                    time.sleep(0.2)
                ids = {"model_id": model, "config_id": cfg, "dataset_id": data}
                job_ids = [http.post("/v1/jobs", json=job_body(ids, seed=i)).json()["id"] for i in range(jobs)]
            yield {"tree": str(tree), "pid": proc.pid, "url": url, "headers": headers, "job_ids": job_ids}
        finally:
            stop_group(proc, 20)
            drop_redis_keys(env["AMCT_QUEUE_PREFIX"])  # the queued jobs' messages: nobody consumes them


def window(server: dict, clients: int, seconds: float, conditional: bool) -> dict:
    """One closed-loop window against a running server: requests and the server's CPU over it."""
    before = _cpu_s(server["pid"])
    counts = asyncio.run(
        _closed_loop(server["url"], server["headers"], server["job_ids"], clients, seconds, conditional)
    )
    used = _cpu_s(server["pid"]) - before
    answered = counts["200"] + counts["304"]
    return {"requests": counts, "server_cpu_s": used, "cpu_ms_per_request": 1000 * used / answered}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout of this repository")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each window")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3, help="alternating windows per server")
    parser.add_argument(
        "--conditional", action="store_true", help="also windows of ours sending If-None-Match on half the reads (304s)"
    )
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    rounds: dict[str, list] = {"baseline": [], "ours": []}
    # Both servers up at once, measured in alternating windows: machine noise hits both alike.
    with api_server(args.baseline.resolve(), args.jobs) as base, api_server(ROOT, args.jobs) as ours:
        for _ in range(args.rounds):
            rounds["baseline"].append(window(base, args.clients, args.seconds, False))
            rounds["ours"].append(window(ours, args.clients, args.seconds, False))
            if args.conditional:
                rounds.setdefault("ours_conditional", []).append(window(ours, args.clients, args.seconds, True))
    results = {
        "database": PG_ADMIN_URL.rsplit("@", 1)[-1],
        "rounds": rounds,
        "median_cpu_ms_per_request": {
            name: statistics.median(w["cpu_ms_per_request"] for w in ws) for name, ws in rounds.items()
        },
    }
    medians = results["median_cpu_ms_per_request"]
    results["ours_over_baseline"] = {name: medians[name] / medians["baseline"] for name in medians}
    results["load_average"] = {"before": load_before, "after": os.getloadavg()}
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
