"""Data-parallel jobs: `world_size` ranks of one job on torch.distributed (docs/scaling.md, "Distributed jobs").

The job process (one per job, in its sandbox) is the launcher: it starts a c10d TCPStore and the ranks
with `torch.multiprocessing.start_processes` (mp.spawn), each a process of the same sandbox. They meet
through the store on the sandbox's own loopback (its network namespace has nothing else: no other job
and no host service can reach it, docs/security.md, "Distributed jobs"), and run the job's kind with a
DistributedDataParallel model: gloo on CPU, NCCL on CUDA, HCCL on NPU.

What each rank does (runners.train and Rank):
- every rank loads the same files and builds the same model (same seed, same example batch), and DDP
  broadcasts rank 0's parameters and buffers at construction, so they start equal;
- every rank draws the same shuffled global batch (`batch_size`) and trains on its slice of it, so the
  run steps as a single process with that batch would (DDP averages the gradients);
- the quantisers reduce their calibration across ranks (amct_engine/quant/ulq_act.py: IFMR results and
  the learnt clips are averaged), so every rank holds the same factors; the job checks that by comparing
  every rank's record (report.json `distributed`);
- a cancel is decided collectively at each step (an all-reduce of the cancel file's presence);
- rank 0 alone prints progress, writes checkpoints, exports, reports and writes result.json; the others
  write under `out/rank<r>/` and stop after training;
- resume: every rank reads the same `resume.pt`; a checkpoint records its world size, and one taken with
  another is not used (the data order would differ).

A rank that dies takes the job down: its peers fail in their next collective, the launcher kills any
that have not ended within moments (no rank waits in a collective past its peers' death) and exits as
the rank that failed first did; when one was killed by a signal, with 128 + N whichever rank the
launcher saw end first, which the worker treats as a killed engine (another attempt, from the last
checkpoint).

Several nodes (`nodes` > 1): each node's worker starts one job process for its `world_size / nodes` ranks
(worker/nodes.py); node 0's holds the store, on the host's network (the sandboxes of such a job share it:
an operator's opt-in, docs/security.md), and its worker publishes the address through the database.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

from job_host.protocol import CANCELLED_EXIT, ERROR_FILE, signal_name
from job_host.spec import JobSpec

BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Rank:
    """This process's place in the job: rank 0 of 1 for a plain job."""

    rank: int = 0
    world_size: int = 1

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def out_dir(self, workdir: Path) -> Path:
        """Where this rank writes: `out/` for rank 0 (its files are the job's), `out/rank<r>/` for the others."""
        return workdir / "out" if self.leader else workdir / "out" / f"rank{self.rank}"


SINGLE = Rank()


@dataclass(frozen=True)
class Node:
    """This job process's share of the ranks: node `index` of `count`, `local` ranks each, and where the
    ranks meet (the c10d store: on this node's loopback, or rank 0's node for the others)."""

    index: int
    count: int
    local: int
    host: str
    port: int  # 0: node 0 opens the store on a free port
    join_timeout_s: float

    @classmethod
    def of(cls, spec: JobSpec) -> Node:
        size, count = spec.params.world_size, spec.params.nodes
        meet = spec.rendezvous or {}
        return cls(
            spec.node_rank,
            count,
            size // count,
            meet.get("host", LOOPBACK),
            int(meet.get("port", 0)),
            spec.join_timeout_s,
        )


def launch(workdir: Path, spec: JobSpec, run_rank) -> int:
    """Run `run_rank(workdir, spec, rank) -> exit status` in this node's ranks; the job's exit status here.

    torch's own launcher (start_processes, the machinery of mp.spawn) with a c10d TCPStore: node 0's job
    process holds it (on the host's interfaces when other nodes must reach it, and then says its port in a
    `rendezvous` line for its worker to publish); the ranks connect to it. Spawned, not forked: the warm
    job process has used torch's thread pools, and forking after that is unsafe.
    """
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from job_host.protocol import emit

    size, node = spec.params.world_size, Node.of(spec)
    store = None
    if node.index == 0:
        store = dist.TCPStore(
            "0.0.0.0" if node.count > 1 else LOOPBACK,
            0,
            None,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=node.join_timeout_s),
        )
        node = replace(node, port=store.port)
        if node.count > 1:
            emit("rendezvous", port=store.port, nodes=node.count, world_size=size)
    context = mp.start_processes(
        _rank_main, args=(str(workdir), spec, node, size, run_rank), nprocs=node.local, join=False, start_method="spawn"
    )
    return wait_for_ranks(context, workdir)


# How long the ranks still running get, after one ended badly, to end on their own (a peer's death reaches
# them through their next collective, which fails within moments) before they are killed.
PEERS_GRACE_S = 10.0
# Signals a process raises on itself (gloo aborts a rank whose peer left in the middle of a collective):
# every other signal that ends a rank came from outside (the OOM killer, kill, the time limit).
SELF_RAISED = {
    signal.SIGABRT,
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGFPE,
    signal.SIGILL,
    signal.SIGTRAP,
    signal.SIGSYS,
}


def wait_for_ranks(context, workdir: Path) -> int:
    """The job's exit status once its ranks (a start_processes context) have ended: 0 when all succeeded.

    Not torch's `context.join()`: it reports the first failure it sees, and when a rank is killed (the OOM
    killer, an operator's kill -9) its peers fail moments later in their next collective, on a closed
    connection, and write error.json about it (or gloo aborts them); whichever exit is seen first, the job
    would fail on an error that is only the consequence. Here the peers get PEERS_GRACE_S to end on their
    own; if a rank was killed from outside before this launcher stopped anything, that death is the job's
    (128 + N: another attempt) and the error.json of the peers it brought down is set aside (their
    tracebacks are in the log). Else a rank's own failure (an exit status, its error.json) before a peer's
    abort.
    """
    from multiprocessing.connection import wait

    processes = context.processes
    running = {p.sentinel: p for p in processes}
    first_failed = None
    while running and first_failed is None:
        for sentinel in wait(list(running)):
            process = running.pop(sentinel)
            process.join()
            if process.exitcode and first_failed is None:
                first_failed = processes.index(process)
    if first_failed is None:
        return 0
    wait(list(running), timeout=PEERS_GRACE_S)
    own_ends = [p.exitcode for p in processes]  # None: still running, killed now
    for process in processes:
        if process.is_alive():
            process.kill()
        process.join()
    order = [first_failed] + [i for i in range(len(processes)) if i != first_failed]
    ended = [(i, code) for i in order if (code := own_ends[i])]
    signalled = [(i, -code) for i, code in ended if code < 0]
    if outside := [(i, number) for i, number in signalled if number not in SELF_RAISED]:
        index, number = outside[0]
        print(f"rank {index} was killed by {signal_name(number)}", file=sys.stderr, flush=True)
        (workdir / ERROR_FILE).unlink(missing_ok=True)
        return 128 + number
    if CANCELLED_EXIT in own_ends:
        return CANCELLED_EXIT
    # A rank's own failure (its error.json says why) before a peer's abort on the connection it closed.
    statuses = [code for _, code in ended if code > 0] + [128 + number for _, number in signalled]
    return statuses[0]


def _rank_main(local_rank: int, workdir: str, spec: JobSpec, node: Node, size: int, run_rank) -> None:
    import torch
    import torch.distributed as dist

    rank = node.index * node.local + local_rank
    if rank != 0:
        os.dup2(2, 1)  # only rank 0 speaks the protocol: the others' lines go to the log
    # Gloo finds its address through the hostname by default; a sandbox has loopback only, and across nodes
    # the operator names the interface (GLOO_SOCKET_IFNAME reaches the sandbox).
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    device = spec.device
    torch.set_num_threads(max(1, torch.get_num_threads() // node.local))
    # One device per rank (untested here: the development machine has no GPU or NPU). The job's device is
    # named without an index ("cuda"), so the model goes to the current device, set here.
    if device == "cuda":
        torch.cuda.set_device(rank % max(1, torch.cuda.device_count()))
    elif device == "npu":
        import torch_npu  # noqa: F401 - registers the npu device and the hccl backend

        torch.npu.set_device(rank % max(1, torch.npu.device_count()))
    host = LOOPBACK if node.index == 0 else node.host
    # The store's timeout bounds the wait for the other nodes' ranks (their worker may still be busy).
    try:
        store = dist.TCPStore(host, node.port, None, is_master=False, timeout=timedelta(seconds=node.join_timeout_s))
        dist.init_process_group(BACKENDS.get(device, "gloo"), store=store, rank=rank, world_size=size)
        code = run_rank(Path(workdir), spec, Rank(rank, size))
    except Exception:  # not meeting the others: run_rank turns the job's own errors into an exit status
        traceback.print_exc()  # to the log (torch's wrapper would keep it in a pickle for its join)
        code = 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if code:
        sys.exit(code)


def first_error(workdir: Path, text: str) -> None:
    """A non-leading rank's failure: error.json unless another rank wrote one first."""
    try:
        fd = os.open(workdir / ERROR_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(text)


# -- inside a rank ------------------------------------------------------------------------------------------


def shard(value, rank: Rank):
    """This rank's slice of a global batch (tensors, tuples of them, dicts, None): samples rank, rank + W, …

    A batch smaller than the world repeats a sample rather than give a rank nothing to train on."""
    import torch

    from job_process.training import samples, take

    if not rank.distributed or value is None:
        return value
    n = samples(value) if not isinstance(value, dict) else len(next(iter(value.values())))
    index = torch.arange(rank.rank, n, rank.world_size)
    if len(index) == 0:
        index = torch.tensor([rank.rank % n])
    return take(value, index)


def any_rank(flag: bool, rank: Rank) -> bool:
    """True on every rank when it is true on one (an all-reduce): a decision all ranks act on together."""
    if not rank.distributed:
        return flag
    import torch
    import torch.distributed as dist

    value = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def gather(value, rank: Rank) -> list:
    """Every rank's `value` (any picklable object), in rank order, on every rank."""
    if not rank.distributed:
        return [value]
    import torch.distributed as dist

    values: list = [None] * rank.world_size
    dist.all_gather_object(values, value)
    return values


def wrap(model, rank: Rank, device=None):
    """The model DDP trains (rank 0's parameters and buffers broadcast to all); the model itself when alone."""
    if not rank.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    # device_ids=None: the model sits on one device, this rank's current one (_rank_main). Quantisers keep
    # parameters that some steps do not use (a frozen clip_min): find_unused_parameters.
    return DistributedDataParallel(model, device_ids=None, find_unused_parameters=True)


class RankDone(Exception):
    """A non-leading rank finished its part (training); rank 0 exports and reports."""


def sync_buffers(model, rank: Rank) -> None:
    """One set of buffers on every rank. DDP broadcasts rank 0's before each training forward, but that forward
    then updates each rank's BatchNorm statistics with its own slice: after the last step they differ, and the
    record's weight factors fold them in. The running means and variances are averaged, so they have seen
    the whole global batch as a single process's would (the mean exactly, the variance less the spread
    between the slices' means); every other buffer (the quantisers', equal already; batch counts) is rank 0's."""
    if not rank.distributed:
        return
    import torch.distributed as dist
    from torch.nn.modules.batchnorm import _BatchNorm

    averaged = {
        id(b)
        for m in model.modules()
        if isinstance(m, _BatchNorm) and m.track_running_stats
        for b in (m.running_mean, m.running_var)
    }
    for buffer in model.buffers():
        if id(buffer) in averaged:
            dist.all_reduce(buffer.data)
            buffer.data /= rank.world_size
        else:
            dist.broadcast(buffer.data, 0)


# The quantisers' state that the record and the deploy model are made of (docs/spec/engine.md §4.1, §4.2).
FACTORS = ("acts_scale", "acts_offset", "acts_clip_max", "acts_clip_min", "wts_scales", "wts_offsets")


def compare_ranks(rank: Rank, model, record: Path, device) -> dict:
    """After training: every rank's quantisation factors and record file, hashed and compared (they must be
    equal: the quantisers reduce across ranks). Then the group is closed, rank 0 goes on alone to export and
    report (no collective may wait for ranks that left), and the others stop (RankDone)."""
    import hashlib

    import torch.distributed as dist

    factors = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if name.rsplit(".", 1)[-1] in FACTORS:
            factors.update(name.encode())
            factors.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    mine = {
        "rank": rank.rank,
        "factors_sha256": factors.hexdigest(),
        "record_sha256": hashlib.sha256(record.read_bytes()).hexdigest() if record.is_file() else None,
    }
    everyone = gather(mine, rank)
    dist.destroy_process_group()
    if not rank.leader:
        raise RankDone()
    same = all(
        (r["factors_sha256"], r["record_sha256"]) == (mine["factors_sha256"], mine["record_sha256"]) for r in everyone
    )
    return {
        "world_size": rank.world_size,
        "backend": BACKENDS.get(device.type, "gloo"),
        "ranks": everyone,
        "identical_across_ranks": same,
    }
