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
import sys
import time
import traceback
import warnings
from pathlib import Path

from job_process import distributed
from job_process.distributed import SINGLE, Rank
from job_process.errors import describe
from job_process.objective_names import CROSS_ENTROPY, DISTILL_OUTPUTS, TARGET_OBJECTIVES
from job_process.protocol import CANCELLED_EXIT, ERROR_FILE, RESULT_FILE, emit
from job_process.sandbox import limit_self
from job_process.spec import JobSpec
from job_process.warm import WARM_FLAG
from job_process.zygote import FORK_SERVER_FLAG

# Share of overall progress each stage ends at; training fills the span between.
TRAIN_START, TRAIN_END = 0.1, 0.8
MEDIA_TYPES = {
    ".json": "application/json",
    ".txt": "text/plain",
    ".cfg": "text/plain",
    ".onnx": "application/octet-stream",
    ".pt": "application/octet-stream",
    ".log": "text/plain",
}


def _split(x, y, fraction: float, seed: int, targets=None):
    """A seeded held-out split: the report's numbers come from samples the job never trained on.

    `x` is a tuple of input tensors, `y` labels and `targets` a dict of targets or None (training.take):
    train x, train y, eval x, eval y, train targets."""
    import torch

    from job_process.training import samples, take

    n = samples(x)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_eval = int(round(n * fraction))
    if n - n_eval < 1:
        n_eval = n - 1
    ev, tr = order[:n_eval], order[n_eval:]
    return take(x, tr), take(y, tr), take(x, ev), take(y, ev), take(targets, tr)


def _tensors(spec: JobSpec, arrays: dict):
    """The inputs (a tuple in signature order), labels and targets of the dataset as tensors.

    Inputs take their signature's dtype: floats are cast (an integer image stays unscaled, as
    uploaded), integer inputs (token ids, masks) keep their values and are never normalised.
    """
    import numpy as np
    import torch

    from job_process.signature import input_arrays, target_arrays

    signature = spec.inputs
    sources = input_arrays(signature, arrays)
    x = tuple(
        torch.from_numpy(np.ascontiguousarray(arrays[sources[s["name"]]])).to(getattr(torch, s["dtype"]))
        for s in signature
    )
    labels = torch.from_numpy(arrays["labels"].astype(np.int64)) if "labels" in arrays else None
    targets = {
        out: torch.from_numpy(np.ascontiguousarray(arrays[name])).float()
        for out, name in target_arrays(spec.outputs, arrays).items()
    }
    return x, labels, targets


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
    import torch

    from amct_engine.export.save import export_onnx
    from job_process import report, runners, size_report
    from job_process.arrays import load_arrays
    from job_process.checkpoints import Checkpoints
    from job_process.kinds import JOB_KINDS
    from job_process.objectives import build_loss, leaf_choices
    from job_process.quality_gate import failures as gate_failures
    from job_process.quality_gate import loss_trend
    from job_process.signature import io_names, output_structure
    from job_process.training import evaluate_accuracy, samples, take

    run_kind = JOB_KINDS[spec.kind].load_runner()
    checkpoints = Checkpoints(workdir, spec.kind, spec.checkpoint_every_steps, rank)

    def phase(name: str, **extra) -> None:
        checkpoints.check_cancel()  # every stage boundary is a cheap place to stop
        emit("phase", phase=name, **extra)

    phase("preparing", progress=0.02)
    params = spec.params
    torch.manual_seed(params.seed)
    device = _device(spec.device)
    arrays = load_arrays(spec.dataset, spec.dataset_format)
    x, labels, targets = _tensors(spec, arrays)
    del arrays
    objective = params.objective or CROSS_ENTROPY
    # The same seeded permutation splits the targets (mse / l1) alongside.
    split_data = _split(x, labels, params.eval_fraction, params.seed, targets or None)
    train_x, train_labels, eval_x, eval_labels, train_targets = split_data
    train_y = train_targets if objective in TARGET_OBJECTIVES else train_labels
    split = "held_out"
    if samples(eval_x) == 0:
        first = slice(0, 1000)
        eval_x, eval_labels, split = take(train_x, first), take(train_labels, first), "train"
    batch = spec.input_shape[0]
    example = take(train_x, slice(0, max(1, min(batch, samples(train_x)))))
    rank.out_dir(workdir).mkdir(parents=True, exist_ok=True)

    phase("baseline", progress=0.05)
    original = torch.jit.load(spec.model, map_location="cpu").eval()
    if spec.outputs is None:  # `amct compress` (no upload check recorded them) or a pre-signature model
        spec.outputs = output_structure(original, spec.inputs, batch)
    io = io_names(spec.inputs, spec.outputs, batch)
    fp32_onnx = str(workdir / "out" / "fp32.onnx")
    if rank.leader:
        export_onnx(original, fp32_onnx, example, **io)
    original_parameters = sum(p.numel() for p in original.parameters())

    ctx = runners.JobContext(
        workdir=workdir,
        model_path=spec.model,
        cfg_path=spec.cfg,
        example=example,
        train_x=train_x,
        train_y=train_y,
        params=params,
        device=device,
        on_step=_progress_fn(params.epochs),
        phase=phase,
        checkpoints=checkpoints,
        io=io,
        labelled=labels is not None and train_y is train_labels,
        loss_fn=build_loss(params, original, spec.outputs, labels is not None, device),
        rank=rank,
    )
    model = run_kind(ctx)

    phase("verifying", progress=0.9)
    pytorch_accuracy = evaluate_accuracy(model, eval_x, eval_labels) if eval_labels is not None else None
    onnx_files = {"fp32": fp32_onnx, "deploy": ctx.files["deploy"]}
    if "fake_quant" in ctx.files and ctx.files["fake_quant"] != ctx.files["deploy"]:
        onnx_files["fake_quant"] = ctx.files["fake_quant"]
    result_report = report.build_report(
        spec.kind,
        original_parameters,
        onnx_files,
        eval_x,
        eval_labels,
        split,
        batch,
        pytorch_accuracy,
        params.deploy_format,
        output_names=io["output_names"],
        outputs=spec.outputs,
        input_names=io["input_names"],
    )
    result_report.update(ctx.report)  # the tables a search kind adds (sensitivity, mixed precision, …)
    if "fused_onnx" in ctx.files:  # PTQ's BN-folded float model: what it was checked at, too
        result_report["shapes"].update(size_report.shapes({"fused": ctx.files["fused_onnx"]}))
    if params.objective is not None:
        result_report["training"] = {"objective": objective, "loss": loss_trend(ctx.losses)}
        if objective == DISTILL_OUTPUTS:
            result_report["training"]["distill_loss"] = leaf_choices(
                params.distill_loss, spec.outputs, labels is not None
            )
    missed = gate_failures(result_report, params, ctx.losses)
    result_report["quality_gate"] = {
        "passed": not missed,
        "failures": missed,
        "max_accuracy_drop": params.max_accuracy_drop,
        "min_output_cosine": params.min_output_cosine,
    }
    report_path = workdir / "out" / "report.json"
    report_path.write_text(json.dumps(result_report, indent=2))
    files = {**ctx.files, "fp32_onnx": fp32_onnx, "report": str(report_path)}
    metrics = summary_metrics(result_report)
    if checkpoints.resumed_from is not None:
        metrics["resumed_from"] = checkpoints.resumed_from
    result = {
        "metrics": metrics,
        "artifacts": [
            {"kind": kind, "path": path, "media_type": MEDIA_TYPES.get(Path(path).suffix, "application/octet-stream")}
            for kind, path in sorted(files.items())
        ],
    }
    if missed:
        raise GateMissed("; ".join(missed), result)
    return result


class GateMissed(Exception):
    """The job finished but its model missed the quality gate: failed, with its outputs kept."""

    def __init__(self, detail: str, result: dict) -> None:
        super().__init__(detail)
        self.result = result


def summary_metrics(rep: dict) -> dict:
    """The few numbers GET /v1/jobs/{id} shows; the rest is in report.json."""
    metrics = {
        "onnx_size_bytes": rep["onnx_size_bytes"],
        "size_ratio": rep["size_ratio"],
        "latency_ms": {k: v["median"] for k, v in rep["latency_ms"].items() if isinstance(v, dict)},
        "speedup": rep["latency_ms"]["speedup"],
    }
    if "accuracy" in rep:
        metrics["accuracy_before"] = rep["accuracy"]["fp32"]
        metrics["accuracy_after"] = rep["accuracy"]["deploy"]
    else:
        metrics["agreement"] = rep["agreement_with_original"]["deploy"]
    return metrics


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
    sys.stdout.write(warm.STARTED_LINE + "\n")  # bwrap has set up the sandbox: the folder may be renamed now
    sys.stdout.flush()
    warm.warm_up()
    ready = time.monotonic()
    sys.stdout.write(warm.READY_LINE + "\n")
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
    if spec.params.world_size > 1:
        return distributed.launch(workdir, spec, run_rank)
    return run_rank(workdir, spec, SINGLE)


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
        error_type = "unsupported" if isinstance(e, DeviceUnavailable) else "engine_error"
        # The traceback went to child.log; the answer gets the type and a scrubbed line (errors.py).
        error({"type": error_type, "detail": describe(e, "the job")})
        return 1
    (workdir / RESULT_FILE).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
