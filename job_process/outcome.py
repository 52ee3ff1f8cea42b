"""What a finished job leaves: report.json (every file against the FP32 one, the kind's tables, the training
loss, the quality gate), its summary metrics and its result (the artifacts the worker stores)."""

from __future__ import annotations

import json
from pathlib import Path

from job_host.objective_names import DISTILL_OUTPUTS
from job_host.spec import JobSpec
from job_process.job_data import Baseline, JobData

MEDIA_TYPES = {
    ".json": "application/json",
    ".txt": "text/plain",
    ".cfg": "text/plain",
    ".onnx": "application/octet-stream",
    ".pt": "application/octet-stream",
    ".log": "text/plain",
}


def verify(spec: JobSpec, workdir: Path, ctx, data: JobData, baseline: Baseline, model, resumed_from) -> dict:
    """report.json (the files against the FP32 one, the kind's tables, training, the quality gate) and the
    job's result; GateMissed when the model missed a limit the job set."""
    from job_process.quality_gate import failures as gate_failures
    from job_process.quality_gate import warnings as deploy_warnings
    from job_process.training import evaluate_accuracy

    pytorch_accuracy = evaluate_accuracy(model, data.eval_x, data.eval_labels) if data.has_labels else None
    ctx.checkpoints.check_cancel()  # the report's evaluations and timings take a while: a cancel still stops them
    result_report = _report(spec, ctx, data, baseline, pytorch_accuracy)
    ctx.checkpoints.check_cancel()
    missed = gate_failures(result_report, spec.params, ctx.losses)
    result_report["quality_gate"] = {
        "passed": not missed,
        "failures": missed,
        "max_accuracy_drop": spec.params.max_accuracy_drop,
        "min_output_cosine": spec.params.min_output_cosine,
    }
    result_report["warnings"] = deploy_warnings(result_report, spec.params)
    report_path = workdir / "out" / "report.json"
    report_path.write_text(json.dumps(result_report, indent=2))
    files = {**ctx.files, "fp32_onnx": baseline.fp32_onnx, "report": str(report_path)}
    metrics = summary_metrics(result_report)
    if resumed_from is not None:
        metrics["resumed_from"] = resumed_from
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


def _report(spec: JobSpec, ctx, data: JobData, baseline: Baseline, pytorch_accuracy: float | None) -> dict:
    from job_process import report, size_report
    from job_process.objectives import leaf_choices
    from job_process.quality_gate import loss_trend

    params = spec.params
    onnx_files = {"fp32": baseline.fp32_onnx, "deploy": ctx.files["deploy"]}
    if "fake_quant" in ctx.files and ctx.files["fake_quant"] != ctx.files["deploy"]:
        onnx_files["fake_quant"] = ctx.files["fake_quant"]
    result_report = report.build_report(
        spec.kind,
        baseline.parameters,
        onnx_files,
        data.eval_x,
        data.eval_labels,
        data.split,
        data.batch,
        pytorch_accuracy,
        params.deploy_format,
        output_names=baseline.io["output_names"],
        outputs=spec.outputs,
        input_names=baseline.io["input_names"],
    )
    result_report.update(ctx.report)  # the tables a search kind adds (sensitivity, mixed precision, …)
    if "fused_onnx" in ctx.files:  # PTQ's BN-folded float model: what it was checked at, too
        result_report["shapes"].update(size_report.shapes({"fused": ctx.files["fused_onnx"]}))
    if params.objective is not None:
        result_report["training"] = {"objective": params.objective, "loss": loss_trend(ctx.losses)}
        if params.objective == DISTILL_OUTPUTS:
            result_report["training"]["distill_loss"] = leaf_choices(params.distill_loss, spec.outputs, data.has_labels)
            if data.has_labels and params.distill_alpha < 1:  # the KD + CE mix (job_process/objectives.py)
                result_report["training"]["distill_alpha"] = params.distill_alpha
    return result_report


class GateMissed(Exception):
    """The job finished but its model missed the quality gate: failed, with its outputs kept."""

    def __init__(self, detail: str, result: dict) -> None:
        super().__init__(detail)
        self.result = result


def summary_metrics(rep: dict) -> dict:
    """The few numbers GET /v1/jobs/{id} shows; the rest is in report.json."""
    from job_process.quality_gate import speedups

    metrics = {
        "onnx_size_bytes": rep["onnx_size_bytes"],
        "size_ratio": rep["size_ratio"],
        "latency_ms": {k: v["median"] for k, v in rep["latency_ms"].items() if isinstance(v, dict) and "median" in v},
        "speedup": rep["latency_ms"]["speedup"],
        "speedup_by_batch": {str(batch): x for batch, x in speedups(rep["latency_ms"]).items()},
    }
    if "deploy_target" in rep.get("deploy", {}):  # the CPU kind the deploy model was written for ("auto" resolved)
        metrics["deploy_target"] = rep["deploy"]["deploy_target"]
    if rep.get("warnings"):  # slower than FP32, or more accuracy lost than half a point (quality_gate.warnings)
        metrics["warnings"] = rep["warnings"]
    if "accuracy" in rep:
        metrics["accuracy_before"] = rep["accuracy"]["fp32"]
        metrics["accuracy_after"] = rep["accuracy"]["deploy"]
    else:
        metrics["agreement"] = rep["agreement_with_original"]["deploy"]
    return metrics
