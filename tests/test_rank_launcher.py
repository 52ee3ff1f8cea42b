"""The launcher of a distributed job's ranks (job_process/distributed.py `wait_for_ranks`): what the job's exit
status says when a rank dies, with real ranks on gloo (docs/scaling.md, "Distributed jobs")."""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from job_host.protocol import CANCELLED_EXIT, ERROR_FILE
from job_process import distributed


def _rank(rank: int, workdir: str, port: int, ending: str, victim: int) -> None:
    """Meet the other rank, then: the victim ends as `ending` says, and every rank all-reduces until a
    collective fails, writing error.json as a job's rank does (the first one written stays)."""
    import torch

    store = dist.TCPStore("127.0.0.1", port, None, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    dist.barrier()
    if rank == victim:
        if ending == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        distributed.first_error(Path(workdir), json.dumps({"type": "engine_error", "detail": f"rank {rank}"}))
        dist.destroy_process_group()  # as _rank_main does
        sys.exit(CANCELLED_EXIT if ending == "cancelled" else 1)
    try:
        while True:
            dist.all_reduce(torch.ones(1))
    except Exception:
        distributed.first_error(Path(workdir), json.dumps({"type": "engine_error", "detail": "a closed connection"}))
        sys.exit(1)


def _launch(tmp_path: Path, ending: str, victim: int) -> int:
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    context = mp.start_processes(
        _rank, args=(str(tmp_path), store.port, ending, victim), nprocs=2, join=False, start_method="spawn"
    )
    return distributed.wait_for_ranks(context, tmp_path)


@pytest.mark.parametrize("victim", [0, 1])
def test_a_rank_killed_by_a_signal_is_the_jobs_end_not_its_peers_closed_connection(tmp_path, victim):
    # Its peer fails in its all-reduce and writes error.json; the job must still read as killed, so the worker
    # gives it another attempt instead of failing it on the consequence.
    assert _launch(tmp_path, "killed", victim) == 128 + signal.SIGKILL
    assert not (tmp_path / ERROR_FILE).exists()


def test_a_rank_that_fails_fails_the_job_with_its_own_error(tmp_path):
    # Its peer may be aborted by gloo (SIGABRT) in the collective it left: that is not a kill from outside.
    assert _launch(tmp_path, "failed", 1) == 1
    assert json.loads((tmp_path / ERROR_FILE).read_text())["detail"] == "rank 1"


def test_a_cancel_seen_by_one_rank_is_the_jobs_end(tmp_path):
    assert _launch(tmp_path, "cancelled", 1) == CANCELLED_EXIT
