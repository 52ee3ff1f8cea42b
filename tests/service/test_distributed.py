"""Data-parallel jobs (job_process/distributed.py): `world_size` ranks of one job on torch.distributed (gloo).

- through a real Celery worker on PostgreSQL + Redis: a quant_retrain job on 2 ranks holds the same
  quantisation factors and record on both, and its deploy model's held-out top-1 is within 0.3 pt of the
  same job in one process with the same global batch (2,000 held-out images: 0.05 pt each);
- a rank SIGKILLed mid-training: the other rank does not wait in its all-reduce, the job goes back to the
  queue at once (not after the lease) and the next attempt resumes from the checkpoint on 2 ranks;
- two Celery workers on this machine as two nodes: one claims the job, the other joins it, a rank each;
- what is refused at submit, and a checkpoint taken on another world size is not resumed from.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

from job_process.distributed import Rank, shard
from tests.service.crash_scenario import engine_processes, get_job, job_events
from tests.service.support import (
    QUANT_CFG,
    Api,
    Worker,
    api_with_ready_model,
    make_settings,
    open_api,
    wait_terminal,
    wait_until,
    worker_stack,
)
from worker.runner import JobRunner


def test_the_ranks_slices_of_a_batch_cover_it_once():
    inputs, targets = (torch.arange(10), torch.arange(10) + 100), {"t": torch.arange(10) * 2}
    slices = [(shard(inputs, Rank(r, 3)), shard(targets, Rank(r, 3))) for r in range(3)]
    assert sorted(torch.cat([x[0] for x, _ in slices]).tolist()) == list(range(10))
    assert all(torch.equal(x[1], x[0] + 100) and torch.equal(y["t"], x[0] * 2) for x, y in slices)
    assert shard(torch.arange(1), Rank(1, 2)).tolist() == [0]  # a batch smaller than the world: no empty rank


# -- through the real worker --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory, pg_url, redis_url, assets):
    from examples.fashion_mnist import load_fashion_mnist

    folder = tmp_path_factory.mktemp("ddp")
    x, y = load_fashion_mnist("test", limit=4000)  # images the base model never saw
    np.savez(folder / "test4000.npz", inputs=x.numpy(), labels=y.numpy())
    with worker_stack(folder, pg_url, redis_url) as (api, worker):
        ids = {
            "model_id": api.upload_model(assets / "cnn.pt").json()["id"],
            "config_id": api.upload_config(QUANT_CFG).json()["id"],
            "dataset_id": api.upload_dataset((folder / "test4000.npz").read_bytes()).json()["id"],
        }
        yield api, ids


def _report(api: Api, job_id: str) -> dict:
    items = api.client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]
    return api.client.get(next(a for a in items if a["kind"] == "report")["content_url"]).json()


@pytest.mark.slow
def test_a_two_rank_job_matches_one_process_and_its_ranks_hold_the_same_factors(stack):
    api, ids = stack
    body = dict(kind="quant_retrain", epochs=1, batch_size=64, lr=5e-4, eval_fraction=0.5, seed=0, **ids)
    single = api.submit(**body).json()["id"]
    ranks = api.submit(**body, world_size=2)
    assert ranks.status_code == 202, ranks.text
    assert ranks.json()["params"]["world_size"] == 2
    jobs = {
        name: wait_terminal(api, job_id, timeout=600)
        for name, job_id in (("single", single), ("ddp", ranks.json()["id"]))
    }
    for job in jobs.values():
        assert job["status"] == "succeeded", job["error"]
    reports = {name: _report(api, job["id"]) for name, job in jobs.items()}
    distributed = reports["ddp"]["distributed"]
    assert distributed["world_size"] == 2 and distributed["backend"] == "gloo"
    assert [r["rank"] for r in distributed["ranks"]] == [0, 1]
    assert distributed["identical_across_ranks"], distributed["ranks"]
    assert len({(r["factors_sha256"], r["record_sha256"]) for r in distributed["ranks"]}) == 1
    assert distributed["ranks"][0]["record_sha256"] is not None
    assert "distributed" not in reports["single"]
    assert reports["ddp"]["eval"] == reports["single"]["eval"] == {"split": "held_out", "samples": 2000}
    top1 = {name: r["accuracy"]["deploy"] for name, r in reports.items()}
    print(f"deploy top-1 on 2,000 held-out images: {top1}")  # shown with -s: the figure docs/scaling.md quotes
    # Not bit-equal: BatchNorm normalises each rank's half of the batch (docs/scaling.md). Issue 21 allows
    # 0.3 pt, counted in images (as floats, 0.8335 - 0.8305 came out above 0.003).
    samples = reports["ddp"]["eval"]["samples"]
    assert abs(round((top1["ddp"] - top1["single"]) * samples)) <= round(0.003 * samples), top1
    # One rank speaks for the job: one progress series, steps of the global batch (2,000 / 64 = 32 steps).
    steps = [e["total_steps"] for e in job_events(api, jobs["ddp"]["id"]) if e["type"] == "progress"]
    assert steps and set(steps) == {32}


# -- killing a rank -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner_env(tmp_path_factory, assets):
    """An API on SQLite; jobs run by a JobRunner in this process; checkpoints at epoch ends."""
    settings = make_settings(tmp_path_factory.mktemp("ddp-kill"), heartbeat_s=0.5, checkpoint_every_steps=0)
    with api_with_ready_model(settings, assets) as env:
        yield env


def _ranks(job_id: str) -> list[int]:
    """The rank processes of the job: the spawned children of its job process."""
    launchers = {pid for pid in engine_processes(job_id) if b"bwrap" not in _cmdline(pid).split(b"\0")[0]}
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and b"spawn_main" in _cmdline(int(entry)) and _parent(int(entry)) in launchers:
            children.append(int(entry))
    return sorted(children)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@pytest.mark.slow
def test_a_killed_rank_sends_the_job_back_to_the_queue_and_it_resumes_on_two_ranks(runner_env):
    api, ids = runner_env
    job_id = api.submit(kind="quant_retrain", epochs=2, batch_size=16, lr=5e-4, world_size=2, **ids).json()["id"]
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(result=JobRunner(api.settings, owner="t").run(job_id)))
    thread.start()
    checkpoint = wait_until(
        lambda: next((e for e in job_events(api, job_id) if e["type"] == "checkpoint"), None),
        300,
        interval=0.05,
        what="the checkpoint of epoch 1",
    )
    ranks = wait_until(lambda: (r := _ranks(job_id)) and len(r) == 2 and r, 10, interval=0.05, what="two ranks")
    os.kill(ranks[-1], signal.SIGKILL)
    killed = time.monotonic()
    requeued = wait_until(
        lambda: next((e for e in job_events(api, job_id) if e.get("edge") == "requeued"), None),
        60,
        interval=0.05,
        what="the job requeued",
    )
    assert time.monotonic() - killed < 30 < api.settings.lease_s  # rank 0 did not hang in its all-reduce
    assert "killed by SIGKILL" in requeued["reason"]
    thread.join(600)
    job = get_job(api, job_id)
    assert outcome["result"] == "succeeded" and job["status"] == "succeeded", job["error"]
    assert job["attempt"] == 2
    assert job["metrics"]["resumed_from"]["step"] >= checkpoint["step"]
    report = _report(api, job_id)
    assert report["distributed"]["identical_across_ranks"] and report["distributed"]["world_size"] == 2


# -- two nodes ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, pg_url, redis_url, assets):
    """Two Celery workers on this machine standing for two nodes, on a server that allows multi-node jobs."""
    folder = tmp_path_factory.mktemp("nodes")
    settings = make_settings(
        folder,
        database_url=pg_url,
        broker_url=redis_url,
        multinode=True,
        node_address="127.0.0.1",
        warm_start=False,
        node_join_timeout_s=300,
    )
    with open_api(settings) as client:
        api = Api(client, settings)
        workers = [Worker(settings, folder / f"worker{i}.log") for i in range(2)]
        try:
            ids = {
                "model_id": api.upload_model(assets / "cnn.pt").json()["id"],
                "config_id": api.upload_config(QUANT_CFG).json()["id"],
                "dataset_id": api.upload_dataset((assets / "small.npz").read_bytes()).json()["id"],
            }
            yield api, ids, workers
        finally:
            for worker in workers:
                worker.stop()


@pytest.mark.slow
def test_a_job_on_two_nodes_runs_one_rank_on_each_of_two_workers(two_nodes):
    api, ids, workers = two_nodes
    job_id = api.submit(kind="quant_retrain", epochs=1, batch_size=32, lr=5e-4, world_size=2, nodes=2, **ids).json()[
        "id"
    ]
    job = wait_terminal(api, job_id, timeout=600)
    assert job["status"] == "succeeded", (job["error"], [w.text()[-3000:] for w in workers])
    distributed = _report(api, job_id)["distributed"]
    assert distributed["world_size"] == 2 and distributed["identical_across_ranks"], distributed
    logs = [w.text() for w in workers]
    leader = [i for i, text in enumerate(logs) if f"job {job_id}: claimed" in text]
    follower = [i for i, text in enumerate(logs) if f"job {job_id}: joined attempt 1 as node 1" in text]
    assert len(leader) == len(follower) == 1 and leader != follower
    joined = logs[follower[0]].split(f"job {job_id}: joined", 1)[1]  # what the follower's worker said after joining
    assert f"job {job_id}: node 1 exited with 0" in joined, joined[-4000:]
    rendezvous = [e for e in job_events(api, job_id) if e["type"] == "rendezvous"]
    assert len(rendezvous) == 1 and rendezvous[0]["nodes"] == 2


# -- refusals ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"kind": "distill", "world_size": 2}, "world_size"),
        ({"world_size": 3, "nodes": 2}, "nodes"),
        ({"world_size": 4, "nodes": 2}, "nodes"),
        ({"world_size": 65}, "world_size"),
    ],
)
def test_what_a_distributed_job_may_not_ask_is_422_naming_the_field(runner_env, overrides, field):
    api, ids = runner_env
    response = api.submit(**{"kind": "quant_retrain", **ids, **overrides})
    assert response.status_code == 422, response.text
    assert response.json()["field"].split(".")[-1] == field


def test_a_checkpoint_from_another_world_size_is_not_resumed_from(tmp_path, capsys):
    from job_process.checkpoints import Checkpoints

    model, optimizer = torch.nn.Linear(2, 2), None
    optimizer = torch.optim.Adam(model.parameters())
    torch.save(
        {
            "format": 1,
            "kind": "quant_retrain",
            "epoch": 1,
            "step": 4,
            "steps_per_epoch": 4,
            "world_size": 1,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
        },
        tmp_path / "resume.pt",
    )

    class Loader:
        shuffle = None

        def __len__(self):
            return 4

    assert Checkpoints(tmp_path, "quant_retrain", 0, Rank(0, 2)).restore_training(model, optimizer, Loader()) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "taken with 1 ranks, not 2" in lines[-1]["message"]
