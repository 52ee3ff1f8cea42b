"""The job process: run one compression job on files in its folder; `python -m job_process.main DIR`.

With `--warm` it is started before its job exists, warms up and waits for it on stdin (warm.py); with
`--fork-server FD` it warms up once and runs each job the worker sends in a forked child (zygote.py).

DIR/spec.json says what to run; its `kind` picks the runner from the job-kind table (kinds.py).
Progress goes to stdout as JSON lines (protocol.py); outputs go to DIR/out and are listed in
DIR/result.json, or the failure in DIR/error.json. The process holds no credentials: whoever
started it (launcher.py) reads its files and does all database and store writes.
"""

from __future__ import annotations

import json
import resource
import sys
import time
import traceback
import warnings
from pathlib import Path

from job_host.errors import describe
from job_host.protocol import (
    CANCELLED_EXIT,
    ERROR_FILE,
    FORK_SERVER_FLAG,
    READY_LINE,
    RESULT_FILE,
    STARTED_LINE,
    WARM_FLAG,
    emit,
)
from job_host.sandbox import limit_self
from job_host.spec import JobSpec
from job_process import distributed
from job_process.distributed import SINGLE, Rank
from job_process.job_data import baseline, prepare_data
from job_process.outcome import GateMissed, verify

# Share of overall progress each stage ends at; training fills the span between.
TRAIN_START, TRAIN_END = 0.1, 0.8


def _device(name: str):
    import torch

    if name == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable("device 'cuda' was requested but this worker sees no CUDA GPU")
        return torch.device("cuda")
    if name == "npu":
        try:
            import torch_npu  # noqa: F401
        except ImportError:
            raise DeviceUnavailable("device 'npu' needs torch_npu, which this worker does not have") from None
        return torch.device("npu")
    return torch.device("cpu")


class DeviceUnavailable(RuntimeError):
    pass


def _progress_fn(epochs: int):
    last = [0.0]

    def on_step(event: dict) -> None:
        total = event.get("total_steps") or 0
        share = event["step"] / total if total else 0.0
        now = time.monotonic()
        # At most ~10 lines a second: the worker records them, and a step can take a millisecond.
        if now - last[0] < 0.1 and event["step"] != total:
            return
        last[0] = now
        emit(
            "progress",
            progress=TRAIN_START + (TRAIN_END - TRAIN_START) * share,
            step=event["step"],
            total_steps=total,
            epoch=event.get("epoch", 0),
            loss=event.get("loss"),
        )

    return on_step


def run(workdir: Path, spec: JobSpec, rank: Rank = SINGLE) -> dict:
    """The job; `rank`: this process's place in a distributed job (job_process/distributed.py), whose ranks
    other than 0 leave after training (RankDone)."""
    from job_host.kinds import JOB_KINDS
    from job_process import runners
    from job_process.checkpoints import Checkpoints
    from job_process.objectives import build_loss

    entry = JOB_KINDS[spec.kind]
    run_kind = entry.load_runner()
    checkpoints = Checkpoints(workdir, spec.kind, spec.checkpoint_every_steps, rank)

    def phase(name: str, **extra) -> None:
        checkpoints.check_cancel()  # every stage boundary is a cheap place to stop
        emit("phase", phase=name, **extra)

    if entry.llm:  # text in, perplexity out: the runner measures and reports itself (job_process/llm_runner.py)
        return run_kind(workdir, spec, phase)

    phase("preparing", progress=0.02)
    device = _device(spec.device)
    data = prepare_data(spec)
    rank.out_dir(workdir).mkdir(parents=True, exist_ok=True)
    phase("baseline", progress=0.05)
    base = baseline(spec, workdir, data, rank)
    params = spec.params
    ctx = runners.JobContext(
        workdir=workdir,
        model_path=spec.model,
        cfg_path=spec.cfg,
        example=data.example,
        train_x=data.train_x,
        train_y=data.train_y,
        params=params,
        device=device,
        on_step=_progress_fn(params.epochs),
        phase=phase,
        checkpoints=checkpoints,
        io=base.io,
        labelled=data.has_labels and data.train_y is data.train_labels,
        loss_fn=build_loss(params, base.model, spec.outputs, data.has_labels, device),
        rank=rank,
    )
    model = run_kind(ctx)
    phase("verifying", progress=0.9)
    return verify(spec, workdir, ctx, data, base, model, checkpoints.resumed_from)


def _relay_engine_warnings() -> None:
    """The engine's warnings (a cfg naming layers the model lacks, …) become job log events."""
    show = warnings.showwarning

    def relay(message, category, filename, lineno, file=None, line=None):
        if "amct_engine" in str(filename):
            emit("log", level="warning", message=f"{category.__name__}: {message}")
        show(message, category, filename, lineno, file, line)

    warnings.showwarning = relay


def _wait_warm() -> bool:
    """Started ahead of its job (job_process/warm.py): warm up, say so, wait for the job; False: none came."""
    from job_process import warm

    started = time.monotonic()
    sys.stdout.write(STARTED_LINE + "\n")  # bwrap has set up the sandbox: the folder may be renamed now
    sys.stdout.flush()
    warm.warm_up()
    ready = time.monotonic()
    sys.stdout.write(READY_LINE + "\n")
    sys.stdout.flush()
    if not warm.wait_for_start():
        return False
    emit(
        "log",
        level="info",
        message=f"warm engine process: warmed up in {ready - started:.1f} s, then waited "
        f"{time.monotonic() - ready:.1f} s for this job",
    )
    return True


def main(argv: list[str]) -> int:
    limit_self()
    workdir = Path(argv[0]).resolve()
    if FORK_SERVER_FLAG in argv[1:]:
        from job_process import warm, zygote

        return zygote.serve(int(argv[argv.index(FORK_SERVER_FLAG) + 1]), warm.warm_up, run_job)
    if WARM_FLAG in argv[1:] and not _wait_warm():
        return 0  # the worker stopped before it had a job for us
    return run_job(workdir)


def run_job(workdir: Path) -> int:
    """Run the job whose spec is in `workdir` (a fresh process, a warm one, or a child of the fork server)."""
    _relay_engine_warnings()
    spec = JobSpec.read(workdir)
    _limit_memory(spec)
    if spec.params.world_size > 1:
        return distributed.launch(workdir, spec, run_rank)
    return run_rank(workdir, spec, SINGLE)


OUT_OF_MEMORY = ("can't allocate memory", "bad_alloc", "not enough memory")  # torch's and C++'s words


def _limit_memory(spec: JobSpec) -> None:
    """The job's address-space limit (docs/service.md, "Limits"), set here rather than at the sandbox's start: a
    fork server's child is forked from a process that serves jobs with other limits. CPU jobs only: a GPU
    driver reserves address space far beyond the memory it uses."""
    if spec.memory_bytes and spec.device == "cpu":
        resource.setrlimit(resource.RLIMIT_AS, (spec.memory_bytes, spec.memory_bytes))


def _out_of_memory(e: BaseException) -> bool:
    """An allocation refused by the limit: Python's MemoryError, or torch's allocator or C++ saying so."""
    return isinstance(e, MemoryError) or any(s in str(e) for s in OUT_OF_MEMORY)


def run_rank(workdir: Path, spec: JobSpec, rank: Rank) -> int:
    """Run the job as `rank` and say how it ended: result.json / error.json (rank 0; another rank's failure
    only when none was written before it) and the exit status."""
    from job_process.checkpoints import Cancelled
    from job_process.quality_gate import QualityGateFailed

    def error(body: dict) -> None:
        if rank.leader:
            (workdir / ERROR_FILE).write_text(json.dumps(body))
        else:
            distributed.first_error(workdir, json.dumps(body))

    try:
        result = run(workdir, spec, rank)
    except distributed.RankDone:
        return 0
    except Cancelled:
        emit("log", level="info", message="the engine stopped on a cancel request")
        return CANCELLED_EXIT
    except GateMissed as e:
        # Failed, but everything it made is kept for inspection: result.json lists it as for a success.
        (workdir / RESULT_FILE).write_text(json.dumps(e.result))
        error({"type": "quality_gate", "detail": str(e)})
        return 1
    except QualityGateFailed as e:
        error({"type": "quality_gate", "detail": str(e)})
        return 1
    except Exception as e:
        traceback.print_exc()
        if spec.memory_bytes and _out_of_memory(e):
            limit = f"{spec.memory_bytes / 2**30:.1f} GiB"
            error(
                {
                    "type": "memory_limit",
                    "detail": f"the job needed more memory than its limit, {limit} of "
                    "address space (the server's AMCT_JOB_MEMORY_BYTES)",
                }
            )
            return 1
        error_type = "unsupported" if isinstance(e, DeviceUnavailable) else "engine_error"
        # The traceback went to child.log; the answer gets the type and a scrubbed line (errors.py).
        error({"type": error_type, "detail": describe(e, "the job")})
        return 1
    (workdir / RESULT_FILE).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
