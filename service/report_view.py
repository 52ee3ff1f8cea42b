"""report.json as the before/after rows a person reads: size, parameters, accuracy or agreement, latency.

The CLI prints these rows as a table; the dashboard (service/ui/job.js) shows the same rows in HTML.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from amct_engine.export.formats import DEFAULT_DEPLOY_FORMAT

NONZERO_LABEL = "nonzero weights¹"
NONZERO_NOTE = "¹ of the weight tensors only; an integer code counts when ≠ its zero point"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _ratio(before: float, after: float) -> str:
    return f"{after / before:.2f}×" if before else "–"


WARNING_LABEL = "warning"  # a row per report.json `warnings` line (job_process/quality_gate.py `warnings`)


def llm_rows(llm: dict) -> list[tuple[str, str, str, str]]:
    """An llm_quant report (job_process/llm_runner.py): perplexity in PyTorch and onnxruntime, bytes, prefill."""
    ppl, tokens, prefill = llm["perplexity"], llm["tokens"], llm["prefill"]
    held_out = f"{tokens['evaluation_tokens']:,} held-out tokens"
    size = llm["onnx_size_bytes"]
    rows = [("ONNX size", _bytes(size["fp32"]), _bytes(size["deploy"]), _ratio(size["fp32"], size["deploy"]))]
    for runtime, label in (("pytorch", "PyTorch"), ("onnxruntime", "onnxruntime")):
        before, after = ppl["fp32"][runtime], ppl["deploy"][runtime]
        rows.append(
            (f"perplexity, {label} ({held_out})", f"{before:.3f}", f"{after:.3f}", f"{after / before - 1:+.2%}")
        )
    rows.append(
        (
            f"prefill, median ({prefill['tokens']} tokens, {prefill['threads']} thread)",
            f"{prefill['fp32']['median_ms']:.2f} ms",
            f"{prefill['deploy']['median_ms']:.2f} ms",
            f"speed-up {prefill['speedup']:.2f}×",
        )
    )
    rows.append(
        (
            "prefill tokens per second",
            f"{prefill['fp32']['tokens_per_s']:,.0f}",
            f"{prefill['deploy']['tokens_per_s']:,.0f}",
            "",
        )
    )
    return rows


def report_rows(report: dict) -> list[tuple[str, str, str, str]]:
    """(what, before, after, change) for the FP32 model against the deploy model."""
    if "llm" in report:
        return llm_rows(report["llm"])
    rows = []
    size = report["onnx_size_bytes"]
    rows.append(("ONNX size", _bytes(size["fp32"]), _bytes(size["deploy"]), _ratio(size["fp32"], size["deploy"])))
    params = report["parameters"]
    rows.append(
        (
            "parameters",
            f"{params['original']:,}",
            f"{params['deploy']['total']:,}",
            _ratio(params["original"], params["deploy"]["total"]),
        )
    )
    # Weight tensors only; in the deploy model the integer codes that differ from their zero point.
    before, after = params["fp32"].get("nonzero_weights"), params["deploy"].get("nonzero_weights")
    if before is not None and after is not None:
        rows.append((NONZERO_LABEL, f"{before:,}", f"{after:,}", _ratio(before, after)))
    samples = report["eval"]["samples"]
    if "accuracy" in report:
        acc = report["accuracy"]
        rows.append(
            (
                f"accuracy ({report['eval']['split']}, {samples} samples)",
                f"{acc['fp32']:.4f}",
                f"{acc['deploy']:.4f}",
                f"{(acc['deploy'] - acc['fp32']) * 100:+.2f} pts",
            )
        )
    pruning = report.get("pruning", {})  # the kinds that prune (job_process/runners.py `pruning_section`)
    for unit, label in (("heads", "attention heads"), ("channels", "channels (filters, FFN neurons)")):
        if pruning.get(unit, {}).get("groups"):
            before, after = pruning[unit]["before"], pruning[unit]["after"]
            rows.append((label, f"{before:,}", f"{after:,}", _ratio(before, after)))
    rows += output_rows(report)
    latency = report["latency_ms"]
    lengths = latency.get("lengths") or {}
    at = f", {next(iter(lengths.values()))} tokens" if len(lengths) == 1 else ""
    # the declared batch, then batch 8; at the dataset's length, then at 128 tokens (a model of token sequences)
    for timed in [latency, *latency.get("other_batches", []), *latency.get("other_lengths", [])]:
        tokens = f", {timed['size']} tokens" if "size" in timed else at
        rows.append(
            (
                f"latency, median (batch {timed['fp32']['batch']}{tokens})",
                f"{timed['fp32']['median']:.3f} ms",
                f"{timed['deploy']['median']:.3f} ms",
                f"speed-up {timed['speedup']:.2f}×",
            )
        )
    formats = report.get("formats", {})
    if formats:
        rows.append(
            ("format", formats.get("fp32", DEFAULT_DEPLOY_FORMAT), formats.get("deploy", DEFAULT_DEPLOY_FORMAT), "")
        )
    deploy = report.get("deploy", {})
    if deploy.get("deploy_target"):  # "auto" resolved on the worker
        bits = f"{deploy['weight_bits']}-bit weight codes" if deploy.get("weight_bits") else ""
        rows.append(("deploy CPU", "", deploy["deploy_target"], bits))
    return rows


def output_rows(report: dict) -> list[tuple[str, str, str, str]]:
    """Deploy against FP32 per output (one set of rows, unnamed, for a one-output model)."""
    outputs = report.get("outputs") or {"output": {"deploy": report["agreement_with_original"]["deploy"]}}
    rows = []
    for name, figures in outputs.items():
        label = f" ({name})" if len(outputs) > 1 else ""
        agreement = figures["deploy"]
        if "top1_agreement" in agreement:
            rows.append((f"top-1 agreement with FP32{label}", "1.0000", f"{agreement['top1_agreement']:.4f}", ""))
        rows.append((f"output cosine with FP32{label}", "1.0000", f"{agreement['mean_cosine']:.4f}", ""))
        if "max_abs_diff" in agreement:
            rows.append(
                (f"max abs difference{label}", "0", f"{agreement['max_abs_diff']:.4f}", f"MSE {agreement['mse']:.6f}")
            )
    gate = report.get("quality_gate")
    if gate and not gate["passed"]:
        rows.append(("quality gate", "", "FAILED", "; ".join(gate["failures"])))
    rows += [(WARNING_LABEL, "", "", text) for text in report.get("warnings", [])]
    return rows


def summary_table(report: dict, title: str | None = None) -> Table:
    rows = report_rows(report)
    notes = NONZERO_NOTE if any(row[0] == NONZERO_LABEL for row in rows) else None
    table = Table(
        title=title or f"{report.get('kind', 'compression')}: FP32 → deploy",
        title_justify="left",
        caption=notes,
        caption_justify="left",
    )
    table.add_column("")
    table.add_column("before (FP32)", justify="right")
    table.add_column("after (deploy)", justify="right")
    table.add_column("change", justify="right")
    for row in rows:
        table.add_row(*row, style="bold yellow" if row[0] == WARNING_LABEL else None)
    return table


def _damage(row: dict) -> str:
    return f"{row['top1_drop']:.2f} pts" if row.get("top1_drop") is not None else f"cosine {row['cosine']:.4f}"


def layer_tables(report: dict) -> list[Table | Text]:
    """The per-layer tables of the search kinds (report.json `sensitivity`, `mixed_precision`), as the
    dashboard's job page shows them."""
    tables: list[Table | Text] = []
    if "sensitivity" in report:
        table = Table(
            "layer",
            "variant",
            "damage",
            "MACs",
            "weights",
            title="per-layer sensitivity, worst first",
            title_justify="left",
        )
        for row in report["sensitivity"]["rows"]:
            table.add_row(
                row["layer"], row["variant"], _damage(row), f"{row['macs_share']:.1%}", f"{row['bytes_share']:.1%}"
            )
        tables.append(table)
    if "mixed_precision" in report:
        mp = report["mixed_precision"]
        budget = ", ".join(f"{k} {v}" for k, v in mp["budget"].items())
        # A line of its own: a table title wraps at the (narrow) table's width.
        tables.append(
            Text(
                f"mixed precision ({budget}): deploy {_damage(mp['deployed'])}, weights "
                f"{_bytes(mp['weight_bytes'])} vs {_bytes(mp['int8_weight_bytes'])} all-INT8"
            )
        )
        table = Table("layer", "precision")
        for layer, precision in mp["precisions"].items():
            table.add_row(layer, precision)
        tables.append(table)
    return tables
