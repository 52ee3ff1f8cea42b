"""`amct compress` and `amct distill-config` without a server: the engine on this machine.

`compress` runs exactly what a worker runs, the job process (`python -m job_process.main`, started
by the same job_process/launcher.py; the runners of job_process/kinds.py, report.json from
job_process/report.py), with the same spec file and the same JSON progress lines. Here the CLI plays
the worker's part: it draws the progress lines and moves the outputs into --out. One engine path for
both, so a local run predicts a service run.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from job_process.arrays import load_arrays, sniff_format
from job_process.kinds import JOB_KINDS
from job_process.launcher import ChildProcess
from job_process.objective_names import default_objective
from job_process.protocol import LOG_FILE, SPEC_FILE


class LocalJobError(RuntimeError):
    def __init__(self, type_: str, detail: str) -> None:
        super().__init__(f"{type_}: {detail}")
        self.type, self.detail = type_, detail


def check_dataset(data: Path, kind: str, input_shape: list[int]) -> tuple[str, bool]:
    """What the API refuses at upload and submit, refused here before the engine starts."""
    try:
        fmt = sniff_format(str(data))
        arrays = load_arrays(str(data), fmt)
    except Exception as e:  # the user's file, in their terms
        raise LocalJobError("bad_dataset", f"cannot read {data}: {e}") from None
    if "inputs" not in arrays:
        raise LocalJobError("bad_dataset", f"{data} has no 'inputs' array (it has: {', '.join(sorted(arrays))})")
    if list(arrays["inputs"].shape[1:]) != input_shape[1:]:
        raise LocalJobError("bad_dataset", f"samples have shape {list(arrays['inputs'].shape[1:])} but the input "
                                           f"shape is {input_shape} (without the batch dimension: {input_shape[1:]})")
    return fmt, "labels" in arrays


def compress(model: Path, cfg: Path, data: Path, kind: str, out: Path, input_shape: list[int], params: dict,
             device: str = "cpu", input_dtype: str = "float32",
             on_message: Callable[[dict], None] = lambda m: None) -> dict:
    """Run one job here; returns `{metrics, report, files: {artifact kind: path in out}}`.

    Raises LocalJobError with the engine's error type and detail when the job fails.
    """
    fmt, has_labels = check_dataset(data, kind, input_shape)
    if JOB_KINDS[kind].needs_labels:  # a retraining kind: its objective, as POST /v1/jobs resolves it
        params = {**params, "objective": params.get("objective") or default_objective(has_labels)}
        if params["objective"] == "cross_entropy" and not has_labels:
            raise LocalJobError("bad_dataset", f"{data} has no 'labels'; the cross_entropy objective trains on "
                                               "them (use --objective distill_outputs)")
    out.mkdir(parents=True, exist_ok=True)
    # Absolute: the child starts in the work folder, where a path relative to ours would point elsewhere.
    workdir = Path(tempfile.mkdtemp(prefix=".amct-work-", dir=out.resolve()))
    try:
        spec = {"kind": kind, "device": device, "params": params, "input_shape": input_shape,
                "input_dtype": input_dtype, "dataset_format": fmt, "model": str(model.resolve()),
                "cfg": str(cfg.resolve()), "dataset": str(data.resolve())}
        (workdir / SPEC_FILE).write_text(json.dumps(spec))
        # Leaving the block kills it if it still runs: Ctrl-C or a failing callback takes the engine down with us.
        with ChildProcess(workdir, read_only=[model, cfg, data]) as child:
            for message in child:
                on_message(message)
            returncode = child.wait()
        shutil.copyfile(workdir / LOG_FILE, out / "engine.log")
        if returncode == 0 and (result := child.result()) is not None:
            return _collect(result, out)
        error = child.error() or {
            "type": "crashed", "detail": f"the engine process exited with code {returncode}; see {out / 'engine.log'}"}
        raise LocalJobError(error["type"], error["detail"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _collect(result: dict, out: Path) -> dict:
    files = {}
    for artifact in result["artifacts"]:
        source = Path(artifact["path"])
        dest = out / source.name
        shutil.move(source, dest)
        files[artifact["kind"]] = dest
    files["log"] = out / "engine.log"
    return {"metrics": result["metrics"], "report": json.loads(files["report"].read_text()), "files": files}


def distill_config(model: Path, out: Path, input_shape: list[int], cfg: Path | None = None) -> dict:
    """AMCT's create_distill_config on a TorchScript file: writes the JSON config, returns it."""
    import torch

    from amct_engine import create_distill_config

    example = torch.zeros(input_shape)
    out.parent.mkdir(parents=True, exist_ok=True)
    create_distill_config(str(out), str(model), example, str(cfg) if cfg else None)
    return json.loads(out.read_text())
