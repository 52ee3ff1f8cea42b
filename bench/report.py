"""Render the benchmark results (bench/results/latest.json) as docs/benchmarks.md plus PNG plots.

    .venv/bin/python bench/report.py [results.json] [--out docs/benchmarks.md] [--images docs/images]

re-renders without running anything. The tables show ratios and deltas against a baseline measured in
the same run; absolute times are min / median / max over repeats. "Where we lose" is computed from
the numbers: every peer that beats the matching row of ours on accuracy, deploy size, latency or
training-step time is listed with the cause.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `bench` importable
    sys.path.insert(0, str(ROOT))

from bench.common import format_markdown  # noqa: E402

# Differences below these are within the noise of one run and are not called a loss.
ACCURACY_NOISE_PT = 0.2  # points of top-1
BYTES_NOISE = 0.02  # relative
TIME_NOISE = 0.10  # relative (latency and step time on a shared 2-core machine)

# Our best filter-pruning recipe (bench/compress.py RECIPES[0], measured by bench/prune_compare.py): the
# row each Torch-Pruning row is measured against, at the same ratio.
BEST_PRUNE_ROW = "amct group-L2 {pct} % + BN recal + INT8"
# Which of our rows each peer is measured against.
COUNTERPART = {
    "ORT static PTQ (QDQ, per-channel)": "amct INT8 QAT",
    "torchao PT2E QAT (x86)": "amct INT8 QAT",
    "NNCF QAT": "amct INT8 QAT",
    **{f"Torch-Pruning {pct} %{ptq}": BEST_PRUNE_ROW.format(pct=pct) for pct in (30, 50) for ptq in ("", " + ORT PTQ")},
}
Row = dict[str, Any]
QUANT_OPS = ("QuantizeLinear", "DequantizeLinear", "ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul")


# --------------------------------------------------------------------------- formatting


def _pt(delta: float | None) -> str | None:
    if delta is None:
        return None
    return f"{round(delta * 100, 2) + 0.0:+.2f} pt"  # + 0.0: no "-0.00"


def _x(value: float | None, digits: int = 2) -> str | None:
    return None if value is None else f"{value:.{digits}f}×"


def _ms(stats: Mapping[str, float] | None, scale: float = 1e3, digits: int = 3) -> str | None:
    if not stats:
        return None
    return " / ".join(f"{stats[k] * scale:.{digits}f}" for k in ("min", "median", "max"))


def _ratio_cell(ratio: Mapping[str, float] | None) -> str | None:
    return None if not ratio else f"{ratio['median']:.2f}× (min {ratio['min']:.2f}×)"


def _step_cell(row: Mapping[str, Any]) -> str | None:
    if "step_ratio" not in row:
        return "no training"
    if row.get("step_is_mean"):
        return f"{row['step_ratio']:.2f}× (means)"
    return f"{row['step_ratio_min']:.2f}× (median {row['step_ratio']:.2f}×)"


def _status_cell(row: Mapping[str, Any]) -> str:
    return f"{row['status']}: {row.get('reason', '')}"


# --------------------------------------------------------------------------- engine table

ENGINE_COLUMNS = [
    "method",
    "top-1",
    "Δ vs FP32",
    "deploy bytes",
    "ORT latency b1",
    "ORT latency b64",
    "train step",
    "params",
    "top-1 ORT basic / PyTorch",
    "top-1 after pruning",
    "deployed as",
]
PRUNING_COLUMNS = [
    "ratio",
    "peer",
    "peer after pruning",
    "peer top-1",
    "ours",
    "ours after pruning",
    "our top-1",
    "Δ top-1",
]
ENGINE_ABS_COLUMNS = [
    "method",
    "deploy kB",
    "b1 ms min / med / max",
    "b64 ms min / med / max",
    "step ms min / med / max",
    "prepare s",
    "train s",
    "convert s",
    "deploy graph (top ops)",
]


def engine_rows(result: Mapping[str, Any]) -> tuple[list[dict], list[dict]]:
    """The ratio table and the absolute-numbers table, as rows of formatted cells."""
    main, absolute = [], []
    for row in result["rows"]:
        label = f"**{row['name']}**" if row["family"] == "ours" else row["name"]
        if row["status"] != "ok":
            main.append({"method": label, "top-1": _status_cell(row)})
            continue
        top1 = f"{row['accuracy']:.4f}" if "accuracy" in row else None
        if "deploy_error" in row:
            top1 = f"{row['torch_accuracy']:.4f} (PyTorch; ONNX failed: {row['deploy_error']})"
        main.append(
            {
                "method": label,
                "top-1": top1,
                "Δ vs FP32": "(baseline)" if row["name"] == "FP32" else _pt(row.get("accuracy_delta")),
                "deploy bytes": _x(row.get("bytes_ratio"), 3),
                "ORT latency b1": _ratio_cell(row.get("latency_b1_ratio")),
                "ORT latency b64": _ratio_cell(row.get("latency_b64_ratio")),
                "train step": _step_cell(row),
                "params": _x(row.get("params_ratio")),
                "top-1 ORT basic / PyTorch": (
                    f"{row['accuracy_ort_basic']:.4f} / {row['torch_accuracy']:.4f}"
                    if "accuracy_ort_basic" in row
                    else None
                ),
                # the pruned float model before any training (ours: with BN recalibration when the recipe has it)
                "top-1 after pruning": (
                    f"{row['accuracy_after_pruning']:.4f}" if row.get("accuracy_after_pruning") is not None else None
                ),
                "deployed as": row.get("deploy_kind"),
            }
        )
        absolute.append(
            {
                "method": row["name"],
                "deploy kB": f"{row['bytes'] / 1024:.1f}" if "bytes" in row else None,
                "b1 ms min / med / max": _ms(row.get("latency_b1_s")),
                "b64 ms min / med / max": _ms(row.get("latency_b64_s")),
                "step ms min / med / max": _ms(row.get("step_s"), digits=1),
                "prepare s": f"{row['prepare_s']:.2f}" if "prepare_s" in row else None,
                "train s": f"{row['train_s']:.1f}" if "train_s" in row else None,
                "convert s": f"{row['convert_s']:.2f}" if "convert_s" in row else None,
                "deploy graph (top ops)": _ops_line(row) or None,
            }
        )
    return main, absolute


def pruning_pairs(result: Mapping[str, Any]) -> list[dict]:
    """Each Torch-Pruning row beside its COUNTERPART (our best recipe at the same ratio): top-1 right after
    pruning and after the epoch (+ INT8), as formatted cells."""
    rows = {r["name"]: r for r in result["rows"] if r["status"] == "ok"}
    pairs = []
    for peer_name, ours_name in COUNTERPART.items():
        peer, ours = rows.get(peer_name), rows.get(ours_name)
        if not peer_name.startswith("Torch-Pruning") or peer is None or ours is None:
            continue
        pairs.append(
            {
                "ratio": peer_name.split("Torch-Pruning ")[1].split(" %")[0] + " %",
                "peer": peer_name,
                "peer after pruning": _fmt4(peer.get("accuracy_after_pruning")),
                "peer top-1": _fmt4(peer.get("accuracy")),
                "ours": ours_name,
                "ours after pruning": _fmt4(ours.get("accuracy_after_pruning")),
                "our top-1": _fmt4(ours.get("accuracy")),
                "Δ top-1": _pt(ours["accuracy"] - peer["accuracy"])
                if "accuracy" in ours and "accuracy" in peer
                else None,
            }
        )
    return pairs


def _fmt4(value: float | None) -> str | None:
    return None if value is None else f"{value:.4f}"


def engine_setup_line(setup: Mapping[str, Any]) -> str:
    return (
        f"{setup['model']} on Fashion-MNIST. FP32 base: {setup['base_epochs']} epoch on {setup['base_images']} "
        f"training images (Adam 2e-3, batch {setup['batch_size']}), test top-1 {setup['base_accuracy']:.4f}. "
        f"Every row then starts from that base and gets {setup['epochs']} extra epoch(s) on the first "
        f"{setup['train_limit']} training images, same batches in the same order, Adam lr {setup['lr']:g} "
        f"(distillation: its own default optimiser, labels unused), seed {setup['seed']}. Top-1 is the deployed "
        f"ONNX model in onnxruntime on {setup['test_images']} test images; {setup['threads']} torch/ORT threads."
    )


def engine_markdown(result: Mapping[str, Any]) -> str:
    main, absolute = engine_rows(result)
    return "\n\n".join(
        [
            engine_setup_line(result["setup"]),
            format_markdown(main, ENGINE_COLUMNS),
            format_markdown(absolute, ENGINE_ABS_COLUMNS),
        ]
    )


# --------------------------------------------------------------------------- plots


def _short(name: str) -> str:
    return (
        name.replace(" (QDQ, per-channel)", "")
        .replace(" (x86)", "")
        .replace("amct ", "")
        .replace("Torch-Pruning", "TP")
        .replace(" + INT8", "+INT8")
        .replace(" + ORT PTQ", "+PTQ")
    )


def _plot_rows(result: Mapping[str, Any]) -> list[Row]:
    return [r for r in result["rows"] if r["status"] == "ok" and "bytes_ratio" in r]


STYLE = {"ours": ("o", "tab:blue"), "peer": ("s", "tab:orange"), "baseline": ("*", "black")}


def _scatter(ax, rows: Sequence[Row], y_of) -> None:
    values = [y_of(r) for r in rows if y_of(r) is not None]
    span = (max(values) - min(values)) or 1.0 if values else 1.0
    placed: list[tuple[float, float]] = []
    for family, (marker, colour) in STYLE.items():
        pts = [(r["bytes_ratio"], y_of(r), r["name"]) for r in rows if r["family"] == family and y_of(r) is not None]
        if not pts:
            continue
        ax.scatter(
            [p[0] for p in pts],
            [p[1] for p in pts],
            marker=marker,
            c=colour,
            s=60 if marker == "*" else 36,
            label={"ours": "amct (ours)", "peer": "peers", "baseline": "FP32"}[family],
            zorder=3,
        )
        for x, y, name in pts:
            # stack the labels of points that sit on top of each other (same size, close values)
            near = sum(1 for px, py in placed if abs(px - x) < 0.03 and abs(py - y) < span * 0.04)
            placed.append((x, y))
            ax.annotate(_short(name), (x, y), textcoords="offset points", xytext=(4, 3 - 9 * near), fontsize=7)
    ax.set_xlabel("deploy ONNX bytes / FP32")
    ax.grid(alpha=0.3)


def plot_accuracy_vs_size(result: Mapping[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    _scatter(ax, _plot_rows(result), lambda r: r.get("accuracy"))
    ax.set_ylabel("top-1 (deployed ONNX, onnxruntime)")
    ax.set_title("Fashion-MNIST: accuracy vs deploy size (same run, same base, same epochs)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_latency_vs_size(result: Mapping[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, batch in zip(axes, (1, 64), strict=True):
        key = f"latency_b{batch}_ratio"
        _scatter(ax, _plot_rows(result), lambda r, k=key: r[k]["median"] if k in r else None)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_ylabel(f"ORT latency / FP32, batch {batch} (median)")
        ax.set_title(f"batch {batch}")
    axes[0].legend(fontsize=8)
    fig.suptitle("Fashion-MNIST: onnxruntime latency vs deploy size (lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _smooth(values: Sequence[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_training_curves(result: Mapping[str, Any], crepe: Mapping[str, Any] | None, path: Path) -> None:
    import matplotlib.pyplot as plt

    panels = 3 if crepe and crepe.get("losses") else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2))
    # "+ ORT PTQ" rows reuse the training of the row before them: one curve each
    ce = [r for r in result["rows"] if r["status"] == "ok" and r.get("losses") and "PTQ" not in r["name"]]
    window = max(1, max((len(r["losses"]) for r in ce), default=1) // 25)
    for r in ce:
        style = "-" if r["family"] != "peer" else "--"
        colour = "black" if r["family"] == "baseline" else None
        axes[0].plot(_smooth(r["losses"], window), style, lw=1.2, color=colour, label=_short(r["name"]))
    axes[0].set_title(f"cross-entropy per step (moving mean of {window})")
    axes[0].set_xlabel("training step")
    axes[0].legend(fontsize=6, ncol=2)
    distill = next((r for r in result["rows"] if r["status"] == "ok" and r.get("distill_losses")), None)
    if distill:
        losses = distill["distill_losses"]
        axes[1].plot(_smooth(losses, max(1, len(losses) // 50)), lw=1.2)
        axes[1].set_yscale("log")
    axes[1].set_title("amct distill INT8: block MSE per group-step")
    axes[1].set_xlabel("group-step (groups in order)")
    if panels == 3:
        losses = crepe["losses"]
        axes[2].plot(_smooth(losses, max(1, len(losses) // 25)), lw=1.2)
        axes[2].set_title("CREPE tiny compressed retrain: BCE vs teacher")
        axes[2].set_xlabel("training step")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- where we lose


def beats_accuracy(theirs: float, ours: float) -> bool:
    """Top-1 higher by more than the noise margin (in points, rounded: 0.8815 − 0.8795 is 0.2 pt, not more)."""
    return round((theirs - ours) * 100, 6) > ACCURACY_NOISE_PT


def _better_latency(peer: Row, ours: Row, batch: int) -> bool:
    key = f"latency_b{batch}_ratio"
    return key in peer and key in ours and peer[key]["median"] < ours[key]["median"] * (1 - TIME_NOISE)


def _ops_line(row: Row) -> str:
    ops = row.get("ops") or {}
    main = sorted(ops.items(), key=lambda kv: -kv[1])[:6]
    return ", ".join(f"{n}×{op}" for op, n in main)


def engine_losses(result: Mapping[str, Any]) -> list[dict[str, str]]:
    """Every metric on which a peer beats the matching row of ours by more than the noise margins."""
    rows = {r["name"]: r for r in result["rows"] if r["status"] == "ok"}
    losses = []
    for peer_name, ours_name in COUNTERPART.items():
        if peer_name in rows and ours_name in rows:
            losses += pair_losses(rows[peer_name], rows[ours_name])
    return losses


def pair_losses(peer: Row, ours: Row) -> list[dict[str, str]]:
    found: list[tuple[str, str, str, str]] = []  # metric, peer value, our value, cause
    if "accuracy" in peer and "accuracy" in ours and beats_accuracy(peer["accuracy"], ours["accuracy"]):
        found.append(("top-1", f"{peer['accuracy']:.4f}", f"{ours['accuracy']:.4f}", accuracy_cause(peer, ours)))
    if "bytes_ratio" in peer and peer["bytes_ratio"] < ours.get("bytes_ratio", 0) * (1 - BYTES_NOISE):
        found.append(
            (
                "deploy size",
                f"{peer['bytes_ratio']:.3f}×",
                f"{ours['bytes_ratio']:.3f}×",
                "their file stores fewer bytes per weight or fewer weights; see 'deployed as'",
            )
        )
    for batch in (1, 64):
        if _better_latency(peer, ours, batch):
            key = f"latency_b{batch}_ratio"
            found.append(
                (
                    f"ORT latency b{batch}",
                    f"{peer[key]['median']:.2f}×",
                    f"{ours[key]['median']:.2f}×",
                    latency_cause(peer, ours),
                )
            )
    if (
        "step_ratio_min" in peer
        and "step_ratio_min" in ours
        and peer["step_ratio_min"] < ours["step_ratio_min"] * (1 - TIME_NOISE)
    ):
        found.append(
            ("train step", f"{peer['step_ratio_min']:.2f}×", f"{ours['step_ratio_min']:.2f}×", step_cause(peer))
        )
    return [
        {
            "metric": metric,
            "peer": peer["name"],
            "ours": ours["name"],
            "peer value": pv,
            "our value": ov,
            "cause": cause,
        }
        for metric, pv, ov, cause in found
    ]


def accuracy_cause(peer: Row, ours: Row) -> str:
    basic = ours.get("accuracy_ort_basic")
    if basic is not None and abs(basic - ours["accuracy"]) > ACCURACY_NOISE_PT / 100:
        theirs = peer.get("accuracy_ort_basic")
        return (
            f"onnxruntime's default graph optimisation (its QDQ→QLinear* fusion) changes our deploy model's "
            f"numbers: top-1 {basic:.4f} with basic rewrites only vs {ours['accuracy']:.4f} at the default "
            f"level; PyTorch eval {ours['torch_accuracy']:.4f}"
            + (f" (theirs: {theirs:.4f} basic vs {peer['accuracy']:.4f} default)" if theirs is not None else "")
        )
    if abs(ours["torch_accuracy"] - ours["accuracy"]) > ACCURACY_NOISE_PT / 100:
        return (
            f"our deploy ONNX scores {ours['accuracy']:.4f} in onnxruntime but {ours['torch_accuracy']:.4f} "
            "in PyTorch eval: an export/runtime mismatch"
        )
    return (
        "the training recipe: same data, epochs and lr, different quantisers; "
        "this run does not isolate which part gives the difference"
    )


def _op_difference(a: Row, b: Row) -> str:
    """Nodes of ``a``'s deploy graph that ``b``'s lacks, as ``n×Op``."""
    extra = Counter(a.get("ops") or {}) - Counter(b.get("ops") or {})
    return ", ".join(f"{n}×{op}" for op, n in sorted(extra.items(), key=lambda kv: (-kv[1], kv[0]))) or "nothing"


def latency_cause(peer: Row, ours: Row) -> str:
    if not any(op in (peer.get("ops") or {}) for op in QUANT_OPS):
        return (
            f"{peer['name']} deploys a float graph; on a model this small onnxruntime's float kernels beat its "
            f"int8 path, whose quantise/dequantise nodes cost more than they save (ours has "
            f"{_op_difference(ours, peer)} more)"
        )
    return (
        f"the graphs differ: ours has {_op_difference(ours, peer)} that theirs lacks, theirs has "
        f"{_op_difference(peer, ours)}; onnxruntime fuses only QuantizeLinear→op→DequantizeLinear patterns "
        "into int8 kernels (QLinearConv/QGemm) and runs every other node separately; on x86 without VNNI our "
        "weights are 7-bit codes (deploy_target x86_avx2), which the u8s8 kernels sum exactly where ORT's "
        "full-range int8 weights can saturate; the profile table shows the per-node times"
    )


def step_cause(peer: Row) -> str:
    if peer["family"] == "peer" and peer["name"].startswith("Torch-Pruning"):
        return (
            "Torch-Pruning fine-tunes the pruned model in plain FP32; ours trains it with fake quantisation "
            "(QAT) at the same time, which the INT8 deploy model needs"
        )
    return (
        "ours fake-quantises activations (ULQ, learnt clipping) and weights (ARQ, per channel) with several "
        "element-wise PyTorch ops per layer and trains BN unfolded; the benchmark does not isolate "
        f"which part makes {peer['name']}'s step faster"
    )


def capture_losses(capture: Mapping[str, Any]) -> list[dict[str, str]]:
    losses = []
    for source, routes in capture["routes"].items():
        ours = routes.get("ours", {})
        for label, entry in routes.items():
            ratio = entry.get("ratio_vs_ours")
            if label == "ours" or not ratio or ratio["median"] >= 1 - TIME_NOISE:
                continue
            cause = (
                (
                    "ours rebuilds TorchScript through torch's TS2EPConverter and then re-traces it with "
                    "torch.export (the converter's imports alone take seconds), while the TorchScript ONNX "
                    "exporter walks the loaded graph once"
                )
                if "TorchScript" in source
                else "ours captures with torch.fx and analyses every layer; the ONNX route exports and parses once"
            )
            losses.append(
                {
                    "metric": f"capture from {source}",
                    "peer": label,
                    "peer value": f"{entry['s']['median']:.2f} s",
                    "ours": "create_quant_retrain_config",
                    "our value": f"{ours['s']['median']:.2f} s",
                    "cause": cause,
                }
            )
    return losses


def own_costs(results: Mapping[str, Any]) -> list[str]:
    """Where our compression costs more than it gives against the FP32 baseline (not a peer)."""
    notes = []
    engine = _section(results, "engine")
    if engine:
        for r in engine["rows"]:
            if r["status"] != "ok" or r["family"] != "ours":
                continue
            for batch in (1, 64):
                ratio = r.get(f"latency_b{batch}_ratio")
                if ratio and ratio["median"] > 1 + TIME_NOISE:
                    notes.append(
                        f"{r['name']}: ORT latency at batch {batch} is {ratio['median']:.2f}× FP32 "
                        f"(slower than the model it compresses; the peers' int8 models are too: see the "
                        f"profile table for which nodes cost it)."
                    )
            if r.get("accuracy_delta", 0) < -1 / 100:
                notes.append(f"{r['name']}: top-1 {_pt(r['accuracy_delta'])} vs FP32.")
    minilm = _section(results, "minilm")
    for name, entry in ((minilm or {}).get("latency_s") or {}).items():
        ratio = entry.get("ratio") if isinstance(entry, Mapping) else None
        if ratio and ratio["median"] > 1 + TIME_NOISE:
            notes.append(
                f"MiniLM INT8 deploy: ORT latency at {name.replace('batch', 'batch ')} is {ratio['median']:.2f}× FP32."
            )
    crepe = _section(results, "crepe")
    if crepe:
        for batch, ratio in crepe["latency_ratio"].items():
            if ratio["median"] > 1 + TIME_NOISE:
                notes.append(
                    f"CREPE tiny compressed: ORT latency at batch {batch[1:]} is {ratio['median']:.2f}× FP32"
                    + _crepe_latency_cause(crepe)
                )
    for name, find in (("ptq", mixed_costs), ("warm_start", warm_start_costs), ("recovery", recovery_costs)):
        section = _section(results, name)
        notes += find(section) if section else []
    return notes


def _crepe_latency_cause(crepe: Mapping[str, Any]) -> str:
    """Why, when the profile shows it: convs left as ConvInteger (deploy files written before issue 22)."""
    int8 = next((p for p in crepe.get("ort_profile", []) if p["name"] == "int8"), None)
    nodes = int8["ort_profile"][0]["nodes"] if int8 else []
    slow = [n for n in nodes if n["op"] == "ConvInteger"]
    if not slow:
        return "."
    share = sum(n["us"] for n in slow) / int8["ort_profile"][0]["total_us"]
    return (
        f": ConvInteger nodes take {100 * share:.0f} % of the deploy model's time. Each conv is followed by "
        "ReLU then BatchNorm, so its output does not reach the next quantised layer through ReLU/max-pool only "
        "and is not requantised into a QLinearConv; onnxruntime's ConvInteger has no fast CPU kernel."
    )


# --------------------------------------------------------------------------- sections


def _section(results: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    section = results["sections"].get(name)
    return section["result"] if section and section["status"] == "ok" else None


def _section_head(results: Mapping[str, Any], name: str, title: str) -> tuple[list[str], Mapping[str, Any] | None]:
    """A section's heading lines and its result; a failed or skipped section gets its status line and no result."""
    section = results["sections"].get(name)
    if section is None:
        return [], None
    lines = [title, ""]
    if section["status"] != "ok":
        return lines + [f"{section['status']}: {section.get('reason', '')}", ""], None
    return lines, section["result"]


def _kv_table(pairs: Sequence[tuple[str, Any]]) -> str:
    return format_markdown([{"quantity": k, "value": v} for k, v in pairs], ["quantity", "value"])


def _flatten(prefix: str, value: Any, out: list[tuple[str, Any]]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, float):
        out.append((prefix, f"{value:.4g}"))
    elif isinstance(value, (int, str, bool)) or value is None:
        out.append((prefix, value))
    # lists (samples, losses) are left to the JSON


def header_md(results: Mapping[str, Any]) -> list[str]:
    meta = results["meta"]
    m = meta["machine"]
    lines = [
        "# Benchmarks",
        "",
        "Generated by `bench/run_all.py` from `bench/results/latest.json`; re-render with "
        "`python bench/report.py bench/results/latest.json`. Every figure is a ratio or delta against a baseline "
        "measured in the same run; absolute times are min / median / max over repeats.",
    ]
    if meta.get("quick"):
        lines += ["", "> **Quick (smoke) run: tiny sizes, not for publishing.**"]
    lines += [
        "",
        _kv_table(
            [
                ("command", f"`{meta['command']}`"),
                ("date (UTC)", meta["started"][:19].replace("T", " ")),
                ("revision", meta["revision"]),
                ("CPU", m["cpu"]),
                ("cores", f"{m['cores']} ({m['usable_cores']} usable)"),
                ("RAM", f"{m['ram_gib']} GiB"),
                ("OS", m["os"]),
                ("Python", m["python"]),
                *([("CPU ISA flags", ", ".join(m["isa"]) or "none of interest")] if "isa" in m else []),
                ("load average at start", " / ".join(f"{x:.2f}" for x in m["load_avg_at_start"])),
                ("total time", f"{meta.get('total_s', 0) / 60:.1f} min"),
            ]
        ),
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
        "",
        format_markdown(
            [_status_row(name, s) for name, s in results["sections"].items()],
            ["section", "status", "time", "load average (1 min) before → after", "environment"],
        ),
    ]
    return lines


def _status_row(name: str, s: Mapping[str, Any]) -> dict[str, str | None]:
    load = s.get("load_avg")
    return {
        "section": name,
        "status": s["status"] + (f": {s['reason']}" if s.get("reason") else ""),
        "time": f"{s['wall_s'] / 60:.1f} min",
        "environment": ", ".join(f"`{k}={v}`" for k, v in (s.get("env") or {}).items()) or None,
        "load average (1 min) before → after": f"{load[0][0]:.2f} → {load[1][0]:.2f}" if load else None,
    }


def engine_md(results: Mapping[str, Any], images: Path, md_dir: Path) -> list[str]:
    result = _section(results, "engine")
    if result is None:
        return []
    main, absolute = engine_rows(result)
    acc = images / "bench_accuracy_vs_size.png"
    lat = images / "bench_latency_vs_size.png"
    plot_accuracy_vs_size(result, acc)
    plot_latency_vs_size(result, lat)
    lines = [
        "## Engine: Fashion-MNIST, ours against the tools a user would otherwise pick",
        "",
        engine_setup_line(result["setup"]),
        "",
        "Ours in **bold**. Ratios are against the FP32 row (same extra epochs, no compression). ORT latency: "
        "median ratio with the ratio of the minima in brackets; one ORT thread, every model timed round-robin "
        f"({result['setup']['latency_rounds']} rounds) so load bursts hit all alike. 'train step': the fastest "
        "training step over the FP32 row's fastest (rows train one after another, so the minimum is the figure a "
        "load burst moves least), the ratio of the medians in brackets; distillation has only a mean time per "
        "batch of images, compared with the FP32 row's mean.",
        "",
        format_markdown(main, ENGINE_COLUMNS),
        "",
        f"![accuracy vs size]({acc.relative_to(md_dir).as_posix()})",
        "",
        f"![latency vs size]({lat.relative_to(md_dir).as_posix()})",
        "",
        "Absolute numbers (ms are min / median / max):",
        "",
        format_markdown(absolute, ENGINE_ABS_COLUMNS),
        "",
    ]
    pairs = pruning_pairs(result)
    if pairs:
        lines += [
            "Filter pruning, our best recipe beside Torch-Pruning at the same ratio (same channel counts): "
            "top-1 of the pruned float model before any training, and of the deployed model after the "
            "epoch (Δ: ours − peer):",
            "",
            format_markdown(pairs, PRUNING_COLUMNS),
            "",
        ]
    differing = [
        r
        for r in result["rows"]
        if r["status"] == "ok"
        and "accuracy_ort_basic" in r
        and abs(r["accuracy_ort_basic"] - r["accuracy"]) > ACCURACY_NOISE_PT / 100
    ]
    if differing:
        lines += [
            "onnxruntime's default optimisation level changes these deploy models' top-1 (vs basic rewrites "
            "only): "
            + "; ".join(
                f"{r['name']} {r['accuracy']:.4f} default vs {r['accuracy_ort_basic']:.4f} "
                f"basic (PyTorch {r['torch_accuracy']:.4f})"
                for r in differing
            )
            + ".",
            "",
        ]
    lines += profile_md(result["rows"])
    sparse = [
        r
        for r in result["rows"]
        if r["status"] == "ok"
        and r.get("nonzero_ratio") is not None
        and r["nonzero_ratio"] < (r.get("params_ratio") or 1) - 0.05
    ]
    if sparse:
        lines += [
            "Sparse rows keep zeros in a dense file: "
            + "; ".join(f"{r['name']} non-zero weights {r['nonzero_ratio']:.2f}× FP32" for r in sparse)
            + ".",
            "",
        ]
    return lines


def profile_md(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The onnxruntime profile table: each profiled deploy model's costliest nodes per batch size."""
    table = []
    for row in rows:
        for prof in row.get("ort_profile", ()):
            total = prof["total_us"]
            costliest = "; ".join(
                f"{n['op']} `{n['node'].strip('/')}` {n['us']:.0f} ({100 * n['us'] / total:.0f} %)"
                for n in prof["nodes"][:4]
            )
            table.append(
                {
                    "method": row["name"],
                    "batch": str(prof["batch"]),
                    "all nodes µs": f"{total:.0f}",
                    "costliest nodes, µs per run (share)": costliest,
                }
            )
    if not table:
        return []
    return [
        "Where onnxruntime spends a run (its own profiler, one thread, mean over the runs; node names are "
        "those of the optimised graph, e.g. a fused `QLinearConv`):",
        "",
        format_markdown(table, ["method", "batch", "all nodes µs", "costliest nodes, µs per run (share)"]),
        "",
    ]


def minilm_md(results: Mapping[str, Any]) -> list[str]:
    lines, m = _section_head(results, "minilm", "### all-MiniLM-L6-v2, INT8 distillation")
    if m is None:
        return lines
    try:
        sentences = m["sentences"]
        pairs = [
            (
                "sentences (train / held-out / tokens)",
                f"{sentences['train']} / {sentences['eval']} / {sentences['tokens']}",
            ),
            ("mean cosine, INT8 student vs FP32 embedding (PyTorch)", f"{m['cos_student_fp32']:.4f}"),
            (
                "mean (min) cosine, deploy ONNX vs FP32",
                f"{m['cos_deploy_fp32']['mean']:.4f} ({m['cos_deploy_fp32']['min']:.4f})",
            ),
            (
                "mean (min) cosine, deploy ONNX vs PyTorch student",
                f"{m['cos_deploy_pytorch']['mean']:.5f} ({m['cos_deploy_pytorch']['min']:.5f})",
            ),
            *[
                (
                    f"ORT latency deploy / FP32, {name.replace('batch', 'batch ')} (median, min)",
                    _ratio_cell(entry["ratio"]),
                )
                for name, entry in m["latency_s"].items()
            ],
            ("deploy bytes / FP32 ONNX (word embeddings stay FP32)", f"{m['deploy_bytes_ratio']:.3f}×"),
            ("distill step (one group) / FP32 train step", _x(m["distill_group_step_over_fp32_step"])),
            ("distillation wall time", f"{m['distill_total_s']:.0f} s"),
        ]
    except (KeyError, TypeError):  # another shape of result: show whatever scalars it has
        pairs = []
        _flatten("", m, pairs)
    return lines + [_kv_table(pairs), ""]


def crepe_md(results: Mapping[str, Any]) -> list[str]:
    lines, c = _section_head(
        results,
        "crepe",
        "### CREPE tiny, compressed retrain (30 % filter pruning + INT8, and "
        "INT8 alone) with the FP32 model as teacher",
    )
    if c is None:
        return lines
    s = c["setup"]
    lines += [
        f"Synthetic harmonic tones, {s['range_hz'][0]:g}–{s['range_hz'][1]:g} Hz, 16 kHz frames of 1,024 samples: "
        f"{s['train_tones']} for training, {s['test_tones']} held out. {s['epochs']} epochs, Adam {s['lr']:g} "
        f"decaying to {s['lr'] / 100:g} on a cosine, batch {s['batch']}, "
        "BCE against the teacher's 360 activations (no labels).",
        "",
        format_markdown(
            [
                {
                    "model": name,
                    "median error Hz": f"{e['median_hz']:.2f}",
                    "mean error Hz": f"{e['mean_hz']:.2f}",
                    "median error cents": f"{e['median_cents']:.1f}",
                    "mean error cents": f"{e['mean_cents']:.1f}",
                    "within 50 cents": f"{e['rpa_50c']:.3f}",
                }
                for name, e in c["errors"].items()
            ],
            ["model", "median error Hz", "mean error Hz", "median error cents", "mean error cents", "within 50 cents"],
        ),
        "",
        _kv_table(
            [
                (
                    "parameters compressed / FP32",
                    f"{c['params']['ratio']:.3f}× ({c['params']['compressed']:,} / {c['params']['fp32']:,})",
                ),
                ("deploy bytes / FP32 ONNX", f"{c['bytes_ratio']:.3f}×"),
                ("ORT latency / FP32, batch 1 (median, min)", _ratio_cell(c["latency_ratio"]["b1"])),
                ("ORT latency / FP32, batch 64 (median, min)", _ratio_cell(c["latency_ratio"]["b64"])),
                *(
                    [
                        ("INT8 only (no pruning): deploy bytes / FP32 ONNX", f"{c['int8_only']['bytes_ratio']:.3f}×"),
                        (
                            "INT8 only: ORT latency / FP32, batch 1 (median, min)",
                            _ratio_cell(c["int8_only"]["latency_ratio"]["b1"]),
                        ),
                        (
                            "INT8 only: ORT latency / FP32, batch 64 (median, min)",
                            _ratio_cell(c["int8_only"]["latency_ratio"]["b64"]),
                        ),
                    ]
                    if "int8_only" in c
                    else []
                ),
                ("median |deploy − teacher| pitch, cents", f"{c['agreement_cents_vs_teacher']:.1f}"),
                ("train step median, s", f"{c['step_s']:.3f}"),
                ("section time, s", f"{c['total_s']:.0f}"),
            ]
        ),
        "",
    ]
    return lines + profile_md(c.get("ort_profile", []))


LLM_TITLE = "### SmolLM2-135M: LLM weight quantisation"
BBC_TITLE = "### BBC News topics: a fine-tuned MiniLM, PTQ, QAT and one compressed_retrain job (issue 38)"


def bbc_task_lines(result: Mapping[str, Any]) -> list[str]:
    """bench/bbc_task.py's result as markdown: accuracy and bytes, then latency, then each row's notes."""
    if result.get("status") != "ok":
        return [f"BBC task skipped: {result.get('reason')}"]
    task = result["task"]
    lines = [
        f"BBC News, all-MiniLM-L6-v2 + linear head: {task['train']} training / {task['held_out']} held-out "
        f"articles, seq {task['seq']}; fine-tuned in {task['train_s']:.0f} s "
        f"({'cached' if task['weights_cached'] else 'trained now'}); PyTorch FP32 accuracy "
        + ", ".join(f"{k} {v:.4f}" for k, v in task["pytorch_fp32_acc"].items()),
        "",
    ]
    accs = [key for key in result["rows"][0] if key.startswith("acc_seq")]
    lines += ["| model | " + " | ".join(accs) + " | MB | bytes vs FP32 |", "|---|" + "---|" * (len(accs) + 2)]
    fp32 = next(r for r in result["rows"] if r["model"] == "FP32")
    for row in result["rows"]:
        cells = [f"{row[a]:.4f} ({100 * (row[a] - fp32[a]):+.1f} pt)" for a in accs]
        ratio = row["bytes"] / fp32["bytes"]
        lines.append(f"| {row['model']} | " + " | ".join(cells) + f" | {row['bytes'] / 1e6:.1f} | {ratio:.3f} |")
    keys = [k[: -len("_min_ms")] for k in result["rows"][0] if k.endswith("_min_ms")]
    lines += [
        "",
        "| model | " + " | ".join(f"{k} min / med ms (min vs FP32, CPU vs FP32)" for k in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for row in result["rows"]:
        cells = [
            f"{row[f'{k}_min_ms']:.1f} / {row[f'{k}_med_ms']:.1f} "
            f"({row[f'{k}_vs_fp32_min']:.2f}x, {row[f'{k}_cpu_vs_fp32']:.2f}x)"
            for k in keys
        ]
        lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    lines.append("")
    for row in result["rows"]:
        keys = ("make_s", "train_s", "epochs", "params", "params_fp32", "cfg", "job_report")
        notes = {k: v for k, v in row.items() if k in keys}
        notes.update({k: v for k, v in row.items() if k.startswith(("pytorch_", "loss_"))})
        if notes:
            lines.append(f"- {row['model']}: " + json.dumps(notes, default=lambda v: round(v, 4)))
    lines += ["- load average (1/5/15 min) before / after timing: " + json.dumps(result["load_avg"]), ""]
    return lines


def bbc_task_md(results: Mapping[str, Any]) -> list[str]:
    """bench/bbc_task.py's tables as it prints them (ratios to FP32 in the same run; CPU: one-thread CPU time)."""
    lines, r = _section_head(results, "bbc_task", BBC_TITLE)
    return lines if r is None else lines + bbc_task_lines(r)


def llm_quant_md(results: Mapping[str, Any]) -> list[str]:
    """bench/llm_quant.py's table as it printed it (ratios to FP32 in the same run; cpu1: one-thread CPU time)."""
    lines, r = _section_head(results, "llm_quant", LLM_TITLE)
    if r is None:
        return lines
    tokens = r.get("tokens", {})
    return lines + [
        f"CPU ISA flags: {', '.join(r.get('isa', [])) or 'none'}; MatMulNBits accuracy_level {r.get('accuracy_level')} "
        f"(chosen for this CPU); {tokens.get('calibration')} calibration tokens, {tokens.get('evaluation')} evaluation "
        f"tokens. Prefill: batch 1, `cpu1_x_N` the CPU time of one run on one thread, `wall2_x_N` the wall time on "
        f"{r.get('threads')} threads, each as a ratio to FP32 at N tokens (below 1: faster).",
        "",
        r["table"],
        "",
    ]


def capture_md(results: Mapping[str, Any]) -> list[str]:
    lines, c = _section_head(
        results, "capture", "## Graph capture: ours (capture + config) vs AMCT's route (ONNX export + load)"
    )
    if c is None:
        return lines
    rows = []
    for source, routes in c["routes"].items():
        for label, entry in routes.items():
            if entry["status"] != "ok":
                rows.append(
                    {
                        "source": source,
                        "route": label,
                        "seconds min / med / max": entry["status"] + ": " + entry["reason"],
                    }
                )
                continue
            rows.append(
                {
                    "source": source,
                    "route": "**ours: create_quant_retrain_config**" if label == "ours" else label,
                    "seconds min / med / max": _ms(entry["s"], 1, 2),
                    "time / ours": _x(entry.get("ratio_vs_ours", {}).get("median")),
                }
            )
    lines += [
        f"{c['model']}, {c['quantizable_layers']} quantisable layers, {c['repeats']} repeat(s); the TorchScript "
        f"rebuild gives the same distill groups as the nn.Module: {c['same_groups_from_torchscript']}.",
        "",
        format_markdown(rows, ["source", "route", "seconds min / med / max", "time / ours"]),
        "",
    ]
    return lines


def service_md(results: Mapping[str, Any]) -> list[str]:
    lines, s = _section_head(results, "service", "## Service under load")
    if s is None:
        return lines
    setup = s["setup"]
    lines += [
        "The embedded back end: `python -m service serve` with its embedded worker. PostgreSQL + Redis: the "
        "production shape (docker-compose.yml), `python -m service api --workers N` and two Celery workers with a "
        "fork server each. All on this machine; the load comes from other processes. "
        f"GET load: {setup['rate_per_endpoint']:g} requests/s per endpoint on a fixed schedule "
        f"(open loop: latency counts from the scheduled time) for {setup['seconds']:g} s, once idle and once while "
        f"the batch drains. Batch: {setup['jobs']} jobs of {setup['model']}, submitted back to back; jobs still "
        f"queued after {setup['window_s']:.0f} s are cancelled (their messages must then be skipped), and the "
        f"database is audited. Server environment: "
        + ", ".join(f"`{k}={v}`" for k, v in setup["server_env"].items())
        + " (the reaper re-sends every job queued over a minute, so duplicate deliveries are part of the test).",
        "",
    ]
    rows = []
    for b in s["backends"].values():
        if b["status"] != "ok":
            rows.append({"back end": b["backend"], "submit → running s": f"{b['status']}: {b.get('reason', '')}"})
            continue
        batch, audit = b["batch"], b["batch"]["audit"]
        processes = b.get("api_processes", 1)
        row = {
            "back end": f"{b['backend']}, {processes} API process{'es' if processes > 1 else ''}, "
            f"{b['workers']} worker(s), auth {b['auth']}",
            "submit → running s": f"{b['submit_to_running_s']['median']:.2f}",
        }
        for phase in ("idle", "busy"):
            for endpoint, stats in b[f"read_{phase}"]["endpoints"].items():
                short = "get" if "{id}" in endpoint else "list"
                row[f"{short} p50/p99 ms ({phase})"] = (
                    f"{stats['p50_ms']:.1f} / {stats['p99_ms']:.1f}" if "p50_ms" in stats else "-"
                )
        row["submits/s"] = f"{batch['jobs'] / batch['submit_s']:.0f}"
        row["jobs/min"] = f"{batch['jobs_per_min']:.1f}" if batch["jobs_per_min"] else "-"
        row["ran / cancelled / failed"] = (
            f"{batch['succeeded']} / {audit['statuses'].get('cancelled', 0)} / {audit['statuses'].get('failed', 0)}"
        )
        row["lost"] = str(batch["lost"])
        row["ran twice"] = str(batch["ran_twice"])
        row["re-sent messages"] = str(audit["re_sent_messages"])
        rows.append(row)
    columns = [
        "back end",
        "submit → running s",
        "get p50/p99 ms (idle)",
        "list p50/p99 ms (idle)",
        "get p50/p99 ms (busy)",
        "list p50/p99 ms (busy)",
        "submits/s",
        "jobs/min",
        "ran / cancelled / failed",
        "lost",
        "ran twice",
        "re-sent messages",
    ]
    errors = {
        name: b[f"read_{p}"]["errors"]
        for name, b in s["backends"].items()
        if b["status"] == "ok"
        for p in ("idle", "busy")
        if b[f"read_{p}"]["errors"]
    }
    lines += [format_markdown(rows, columns), ""]
    if errors:
        lines += [f"GET errors: {errors}.", ""]
    lines += [
        "'get' is `GET /v1/jobs/{id}`, 'list' is `GET /v1/jobs?limit=50`. 'lost': jobs missing or not in a "
        "terminal state after the run; 'ran twice': jobs claimed more than once, reclaimed, requeued or with "
        "attempt ≠ 1 (from the `jobs` rows and their state events). jobs/min: succeeded jobs over the span "
        "from the first start to the last finish. Each job runs the engine in a fresh child process "
        "forked from its worker's fork server (torch and the engine already imported and used; docs/scaling.md, "
        '"Fork server"), then captures, trains, exports and checks.',
        "",
    ]
    return lines


DEPLOY_TITLES = {
    "deploy": "## Deploy speed: our INT8 ONNX vs FP32 and onnxruntime's own PTQ",
    "mobile": "## Mobile CNNs",
    "transformers": "## Transformer encoders: our PTQ vs onnxruntime's quantize_dynamic",
}


def mobile_accuracy_md(results: Mapping[str, Any]) -> list[str]:
    """bench/mobile_accuracy.py: top-1 of each family's deploy models against its FP32 base, in onnxruntime."""
    lines, m = _section_head(results, "mobile_accuracy", "### Mobile CNN accuracy: FP32 vs INT8 deploy models")
    if m is None:
        return lines
    h = m["header"]
    lines += [
        f"A 5-block inverted-residual net with squeeze-excite (bench/mobile_accuracy.py) trained {m['epochs']} "
        "epochs on the first 12,000 Fashion-MNIST training images, once per activation family; PTQ calibrates on "
        "512 training images (ours and ORT's alike); QAT gets 1 more epoch on the same images, and so does its "
        f"FP32 control. Top-1 in onnxruntime on {h['test_images']:,} test images; CPU ISA: {', '.join(h['isa'])}; "
        f"deploy_target auto = `{h['deploy_target(auto)']}`.",
        "",
    ]
    labels = list(m["families"][0]["top1"])
    rows = []
    for family in m["families"]:
        base = family["top1"]["FP32"]
        row = {"family": family["family"]}
        for label in labels:
            top1 = family["top1"][label]
            row[label] = f"{100 * top1:.2f}" if label == "FP32" else f"{100 * top1:.2f} ({100 * (top1 - base):+.2f})"
        rows.append(row)
    return lines + [format_markdown(rows, ["family", *labels]), ""]


def deploy_md(results: Mapping[str, Any], key: str = "deploy") -> list[str]:
    """bench/deploy_speed.py: latency of our INT8 deploy ONNX against FP32 and ORT's static PTQ, per model."""
    lines, d = _section_head(results, key, DEPLOY_TITLES[key])
    if d is None:
        return lines
    h = d["header"]
    load = h.get("load_avg_at_start")
    lines += [
        f"CPU ISA: {', '.join(h['isa'])}; deploy_target auto = `{h['deploy_target(auto)']}`; onnxruntime "
        f"{h['onnxruntime']}, {h['threads']} threads{_load_text(load, ' at start')}. Per model and batch: "
        "the minimum and median ms per run (interleaved rounds) and each as a ratio to FP32's in the same "
        "run; the ratio of minima is the least load-sensitive wall figure (see Noise), 'ours / best peer' "
        "uses it; `cpu_vs_fp32` is the ratio of minimum CPU times on one thread with spinning off (the work "
        "a run needs, which the load barely moves). "
        "Random-init weights (BN statistics set) except CREPE (pretrained) and MiniLM (distilled); "
        "ours is a calibration-only quantisation of the same weights.",
        "",
    ]
    for section in d["sections"]:
        lines += [f"### {section['name']}", ""]
        if "rows" not in section:
            lines += [section.get("status", ""), ""]
            continue
        columns = [c for c in section["rows"][0] if c != "model"]
        rows = [{"model": r["model"], **{c: f"{r[c]:.3f}" for c in columns}} for r in section["rows"]]
        lines += [format_markdown(rows, ["model", *columns]), ""]
        for label, note in section.get("notes", {}).items():
            lines.append(f"- {label}: {note}")
        if "torch_task_accuracy" in section:
            lines.append(f"- task accuracy of the PyTorch FP32 model: {section['torch_task_accuracy']:.4f}")
        for batch, best in section.get("ours_vs_best_peer", {}).items():
            others = "".join(
                f", {best[key]:.2f}× by {what}"
                for key, what in (("ratio_median", "medians"), ("ratio_cpu", "one-thread CPU time"))
                if key in best
            )
            lines.append(f"- ours / best peer at {batch}: {best['ratio']:.2f}× by minima ({best['peer']}){others}")
        if "load_avg" in section:
            before, after = section["load_avg"]
            lines.append(
                f"- load average (1 / 5 / 15 min) while timing: {_loads(before)} before, {_loads(after)} after"
            )
        report = section.get("report", {})
        lines.append(
            f"- ours after ORT's optimiser: {_op_counts(report.get('optimized_op_counts', {}))}; "
            f"layers not fused: {', '.join(report.get('not_fused') or {}) or 'none'}"
        )
        layout = {k: v for k, v in report.get("conv_layout", {}).items() if v}
        if layout:
            lines.append(
                "- conv layout rewrites (export.conv_layout): "
                + "; ".join(f"{k.replace('_', ' ')}: {', '.join(v)}" for k, v in layout.items())
            )
        for key, label in (("profile_ours", "ours"), ("profile_best_peer", "best peer")):
            top = list(section.get(key, {}).items())[:6]
            if top:
                lines.append(
                    f"- µs per run by op type (one thread, each node's fastest run), {label}: "
                    + ", ".join(f"{op} {us:.0f}" for op, us in top)
                )
        lines.append("")
    return lines


def _loads(load) -> str:
    return " / ".join(f"{v:.2f}" for v in load)


def _load_text(load, when: str) -> str:
    return f", load average{when} {_loads(load)}" if load else ""


def _op_counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n}×{op}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def deploy_losses(deploy: Mapping[str, Any]) -> list[str]:
    """Where our deploy model is slower than FP32 or than the best peer, with the profile's largest op."""
    found = []
    for section in deploy["sections"]:
        ours = next((r for r in section.get("rows", []) if r["model"] == "ours"), None)
        if ours is None:
            continue
        top = next(iter(section.get("profile_ours", {}).items()), None)
        where = f"; {top[0]} takes {top[1]:.0f} µs of our run" if top else ""
        for key in (k for k in ours if k.endswith(("_vs_fp32", "_vs_fp32_min"))):  # older runs: medians only
            if ours[key] > 1 + TIME_NOISE:
                found.append(f"{section['name']} {key.split('_')[0]}: ours {ours[key]:.2f}× FP32{where}")
        for batch, best in section.get("ours_vs_best_peer", {}).items():
            if best["ratio"] > 1 + TIME_NOISE:
                found.append(f"{section['name']} {batch}: ours {best['ratio']:.2f}× {best['peer']}{where}")
    return found


# --------------------------------------------------------------------------- ptq and mixed precision (bench/ptq.py)

PTQ_TITLE = "## PTQ: ours against onnxruntime's static PTQ and NNCF"
MIXED_TITLE = "## Mixed precision: deploy bytes against top-1"
PTQ_TARGET = 2.0  # issue 20: ours at most 2× ORT's quantize_static, by wall time
PTQ_FLOWS_MD = (
    "PTQ wall time: each flow starts from the FP32 PyTorch model and the calibration images in memory and ends with "
    "the INT8 ONNX file on disk. Ours is the four AMCT calls, which write three ONNX files (AMCT's fused float "
    "model, the fake-quant and the deploy model) and check the two quantised ones with `onnx.checker` and one "
    "onnxruntime run each. ORT's user-visible call from a PyTorch model is `torch.onnx.export` (TorchScript "
    'exporter) + `quant_pre_process` + `quantize_static` with its calibration reader, files included; "FP32 ONNX '
    'file given" leaves the FP32 export out, for a user who already has the ONNX model. NNCF is `nncf.quantize` + '
    "`nncf.strip` + `torch.onnx.export` (its C++ extension, built on first use, falls in the warm-up). One untimed "
    "warm-up, then {rounds} rounds, every flow once per round in a rotated order; ours (IFMR) / the flow, min to min "
    "and median to median, measured in the same run:"
)


def _command(results: Mapping[str, Any], name: str, standalone: str) -> str:
    """Which command measured a section: the run's, with the section's environment, and the script on its own."""
    section = results["sections"][name]
    env = "".join(f", `{k}={v}`" for k, v in (section.get("env") or {}).items())
    return f"Command: `{results['meta']['command']}`, section `{name}`{env}; on its own: `{standalone}`."


def _load_pair(load_avg: Sequence[Sequence[float]] | None) -> str:
    return "" if not load_avg else f"; load average {_loads(load_avg[0])} before, {_loads(load_avg[1])} after"


def ptq_md(results: Mapping[str, Any], images: Path, md_dir: Path) -> list[str]:
    lines, p = _section_head(results, "ptq", PTQ_TITLE)
    if p is None:
        return lines
    lines += [
        _command(
            results,
            "ptq",
            "OMP_NUM_THREADS=1 python bench/ptq.py --threads 2 --plot docs/images/bench_mixed_precision.png",
        ),
        "",
    ]
    lines += ptq_accuracy_md(p) + ptq_timing_md(p)
    if not p.get("mixed_precision"):
        return lines
    plot = images / "bench_mixed_precision.png"
    plot_mixed_precision(p, plot)
    image = f"![deploy bytes vs top-1]({plot.relative_to(md_dir).as_posix()})"
    return lines + [MIXED_TITLE, ""] + mixed_md(p) + [image, ""]


def ptq_tables(p: Mapping[str, Any]) -> list[str]:
    """bench/ptq.py on its own: every table of the section, without headings or plot."""
    return ptq_accuracy_md(p) + ptq_timing_md(p) + (mixed_md(p) if p.get("mixed_precision") else [])


def _ptq_setting(p: Mapping[str, Any]) -> str:
    h, fp32 = p["header"], next((r for r in p["rows"] if r["family"] == "baseline" and "accuracy" in r), None)
    base = f" (test top-1 {fp32['accuracy']:.4f})" if fp32 else ""
    return (
        f"Every method quantises the FP32 row's model of the engine table{base}, trained here again from the same "
        f"seed, with the first {p['calibration']['images']} training images in batches of "
        f"{p['calibration']['batch']}; top-1 of each ONNX file in onnxruntime on {p['setting']['test_images']} "
        f"test images. CPU ISA flags: {', '.join(h['isa']) or 'none of interest'}; torch {h['torch']} "
        f"({h['threads']} thread(s), OMP_NUM_THREADS={h['omp_num_threads']}, "
        f"OMP_WAIT_POLICY={h['omp_wait_policy']}), onnxruntime {h['onnxruntime']} (its default threads)"
        f"{_load_pair(h.get('load_avg'))}."
    )


def ptq_accuracy_md(p: Mapping[str, Any]) -> list[str]:
    fp32 = next((r for r in p["rows"] if r["family"] == "baseline" and "accuracy" in r), None)
    rows = []
    for r in p["rows"]:
        label = f"**{r['name']}**" if r["family"] == "ours" else r["name"]
        if r["status"] != "ok":
            rows.append({"method": label, "test top-1": _status_cell(r)})
            continue
        baseline = r is fp32 or fp32 is None
        rows.append(
            {
                "method": label,
                "test top-1": f"{r['accuracy']:.4f}",
                "deploy ONNX bytes": f"{r['bytes']:,}",
                "Δ vs FP32": "(baseline)" if baseline else _pt(r["accuracy"] - fp32["accuracy"]),
                "bytes / FP32": None if baseline else _x(r["bytes"] / fp32["bytes"], 3),
                "deployed as": r.get("deploy_kind"),
            }
        )
    return [
        _ptq_setting(p),
        "",
        format_markdown(
            rows, ["method", "test top-1", "Δ vs FP32", "deploy ONNX bytes", "bytes / FP32", "deployed as"]
        ),
        "",
    ]


def ptq_timing_md(p: Mapping[str, Any]) -> list[str]:
    rows = []
    for flow, t in p["timing"].items():
        if "unavailable" in t:
            rows.append({"flow": flow, "s min / median / max": f"unavailable: {t['unavailable']}"})
            continue
        r = p["ratios"].get(flow)
        rows.append(
            {
                "flow": f"**{flow}**" if flow == p["ours"] else flow,
                "s min / median / max": _ms(t, 1, 3),
                "ours / it, min": _x(r and r["min"]),
                "ours / it, median": _x(r and r["median"]),
            }
        )
    lines = [
        PTQ_FLOWS_MD.format(rounds=p["rounds"]),
        "",
        format_markdown(rows, ["flow", "s min / median / max", "ours / it, min", "ours / it, median"]),
        "",
    ]
    target = p["ratios"].get(p["ort_from_torch"])
    if target:
        met = "met" if target["min"] <= PTQ_TARGET else "not met"
        lines += [
            f"Issue 20 asks for at most {PTQ_TARGET:g}× ORT's `quantize_static` from a PyTorch model: {met} "
            f"({target['min']:.2f}× by minima, {target['median']:.2f}× by medians).",
            "",
        ]
    return lines


def _choice(precisions: Mapping[str, str]) -> str:
    kinds = set(precisions.values())
    return f"all {kinds.pop()}" if len(kinds) == 1 else ", ".join(f"{k} {v}" for k, v in precisions.items())


def mixed_md(p: Mapping[str, Any]) -> list[str]:
    """One row per distinct choice (budgets that chose the same model share it), beside all-INT8."""
    points = p["mixed_precision"]
    int8 = points[0]
    rows = [
        {
            "top-1 budget": "(all INT8)",
            "choice": "all INT8",
            "weight bytes (est.)": f"{int8['int8_weight_bytes']:,.0f}",
            "deploy ONNX bytes": f"{int8['file_bytes']['int8_deploy']:,}",
            "bytes / all-INT8": "1.000×",
            "test top-1": f"{int8['int8_test_accuracy']:.4f}",
            "Δ vs all-INT8": "(baseline)",
        }
    ]
    for group in _budget_groups(points):
        q = group[0]
        rows.append(
            {
                "top-1 budget": ", ".join(f"{g['budget']:g}" for g in group),
                "choice": _choice(q["precisions"]),
                "weight bytes (est.)": f"{q['weight_bytes']:,.0f}",
                "deploy ONNX bytes": f"{q['file_bytes']['deploy']:,}",
                "bytes / all-INT8": _x(q["file_bytes"]["deploy"] / q["file_bytes"]["int8_deploy"], 3),
                "drop on the search images": f"{q['search_top1_drop'] or 0:.2f} pt",
                "test top-1": f"{q['test_accuracy']:.4f}",
                "Δ vs all-INT8": _pt(q["test_accuracy"] - q["int8_test_accuracy"]),
            }
        )
    columns = [
        "top-1 budget",
        "choice",
        "weight bytes (est.)",
        "deploy ONNX bytes",
        "bytes / all-INT8",
        "drop on the search images",
        "test top-1",
        "Δ vs all-INT8",
    ]
    return [
        f"`auto_mixed_precision` on the same model at top-1 budgets of {_budgets_text(points)} "
        "points, searched on the last 2,000 training images (never the test set), each choice run through PTQ and "
        "measured on the test set. The budget bounds the drop on the search images; 2,000 images resolve "
        "0.05 pt each, so the test set can disagree. An INT4 layer adds a Cast node to the file "
        "(docs/spec/engine.md §4.12).",
        "",
        format_markdown(rows, columns),
        "",
    ]


def _budgets_text(points: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"{q['budget']:g}" for q in points)


def _budget_groups(points: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    groups: list[list[Mapping[str, Any]]] = []
    for q in points:
        if groups and groups[-1][0]["precisions"] == q["precisions"]:
            groups[-1].append(q)
        else:
            groups.append([q])
    return groups


def plot_mixed_precision(p: Mapping[str, Any], path: Path) -> None:
    """Deploy ONNX bytes against test top-1: the budgets' choices, all-INT8 and the FP32 and peer models."""
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(7, 4.2))
    points = p["mixed_precision"]
    budgets: dict[tuple[float, float], list[str]] = {}  # budgets that chose the same model share a point
    for q in points:
        budgets.setdefault((q["file_bytes"]["deploy"] / 1024, q["test_accuracy"] * 100), []).append(f"{q['budget']:g}")
    ax.plot(
        [x for x, _ in budgets],
        [y for _, y in budgets],
        "o",
        color="tab:blue",
        label="amct auto mixed precision (top-1 budget, pt)",
    )
    for (x, y), names in budgets.items():
        ax.annotate(", ".join(names), (x, y), textcoords="offset points", xytext=(5, 3), fontsize=8)
    int8 = points[0]
    ax.plot(
        [int8["file_bytes"]["int8_deploy"] / 1024],
        [int8["int8_test_accuracy"] * 100],
        "s",
        color="tab:green",
        label="amct PTQ, all INT8",
    )
    references = [r for r in p["rows"] if r["status"] == "ok" and r["family"] != "ours"]
    for r, marker in zip(references, "^Dv", strict=False):
        ax.plot([r["bytes"] / 1024], [r["accuracy"] * 100], marker, label=r["name"])
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("deploy ONNX file (KiB, log scale)")
    ax.set_ylabel("test top-1 (%), onnxruntime")
    ax.set_title("Fashion-MNIST CNN: deploy bytes vs top-1")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ptq_losses(p: Mapping[str, Any]) -> list[dict[str, str]]:
    """Each peer PTQ row against each of ours (top-1, file size), and each peer flow faster than ours."""
    rows = [r for r in p["rows"] if r["status"] == "ok"]
    losses = []
    for ours in (r for r in rows if r["family"] == "ours"):
        for peer in (r for r in rows if r["family"] == "peer"):
            if beats_accuracy(peer["accuracy"], ours["accuracy"]):
                losses.append(
                    _loss(
                        "PTQ top-1",
                        peer["name"],
                        f"{peer['accuracy']:.4f}",
                        ours["name"],
                        f"{ours['accuracy']:.4f}",
                        "the calibration: same images and batches, "
                        "different range estimates (ours IFMR/HFMG search, theirs MinMax or NNCF's)",
                    )
                )
            if peer["bytes"] < ours["bytes"] * (1 - BYTES_NOISE):
                losses.append(
                    _loss(
                        "PTQ deploy bytes",
                        peer["name"],
                        f"{peer['bytes']:,}",
                        ours["name"],
                        f"{ours['bytes']:,}",
                        "their file stores fewer bytes per weight or fewer nodes",
                    )
                )
    ours_flows = {r["name"] for r in p["rows"] if r["family"] == "ours"}
    for flow, r in p["ratios"].items():
        if r and r["min"] > 1 + TIME_NOISE and flow not in ours_flows:
            t, o = p["timing"][flow], p["timing"][p["ours"]]
            losses.append(
                _loss("PTQ wall time", flow, f"{t['min']:.3f} s", p["ours"], f"{o['min']:.3f} s", PTQ_TIME_CAUSE)
            )
    return losses


PTQ_TIME_CAUSE = (
    "ours writes three ONNX files (AMCT's fused float model, then the fake-quant and deploy models, "
    "all from one trace: docs/spec/engine.md §5.1), checks both quantised files in onnxruntime and "
    "searches each layer's range with IFMR (a 65,536-bin histogram, 60 candidates), where ORT writes "
    "one quantised file and takes the min and max"
)


def _loss(metric: str, peer: str, peer_value: str, ours: str, our_value: str, cause: str) -> dict[str, str]:
    return {
        "metric": metric,
        "peer": peer,
        "peer value": peer_value,
        "ours": ours,
        "our value": our_value,
        "cause": cause,
    }


def mixed_costs(p: Mapping[str, Any]) -> list[str]:
    """Budgets whose choice lost more on the test set, against all-INT8, than the budget and the noise allow."""
    notes = []
    for group in _budget_groups(p.get("mixed_precision") or []):
        q = group[0]
        drop = (q["int8_test_accuracy"] - q["test_accuracy"]) * 100
        if drop > q["budget"] + ACCURACY_NOISE_PT:
            notes.append(
                f"mixed precision at a top-1 budget of {q['budget']:g} pt ({_choice(q['precisions'])}): "
                f"{drop:.2f} pt below all-INT8 on the test set (on the search images "
                f"{q['search_top1_drop'] or 0:.2f} pt)."
            )
    return notes


# --------------------------------------------------------------------------- prune search (bench/prune_search.py)

PRUNE_SEARCH_TITLE = "## Prune search vs uniform BCP"
PRUNE_SEARCH_COLUMNS = [
    "seed",
    "row",
    "MACs (share)",
    "params",
    "top-1 after pruning",
    "top-1 after the epoch",
    "search − row, after the epoch",
]


def prune_search_md(results: Mapping[str, Any]) -> list[str]:
    lines, s = _section_head(results, "prune_search", PRUNE_SEARCH_TITLE)
    if s is None:
        return lines
    setting = s["seeds"][0]["setting"]
    lines += [
        _command(results, "prune_search", "OMP_NUM_THREADS=1 python bench/prune_search.py --seed 0 --seed 1"),
        "",
        f"The engine table's setting: FP32 base {setting['base_epochs']} epoch on {setting['base_images']:,} images, "
        "then each row `create_prune_retrain_model` (channels removed, BatchNorms re-estimated on 8 training "
        f"batches) and {setting['epochs']} epoch on the first {setting['train_limit']:,} training images, same "
        f"batches and Adam lr {setting['lr']:g}; only the prune cfg differs. The search ({_pct(s['target_macs'])} "
        "MACs target) measures on the last 2,000 training images; top-1 on the "
        f'{setting["test_images"]:,} test images (PyTorch, FP32 pruned model). "MACs matched": the uniform ratio '
        f"whose MACs come closest to the search's. {s['threads']} thread(s){_load_pair(s.get('load_avg'))}.",
        "",
        format_markdown([row for seed in s["seeds"] for row in _prune_search_rows(seed)], PRUNE_SEARCH_COLUMNS),
        "",
    ]
    return (
        lines
        + [f"- {line}" for line in _prune_search_verdicts(s)]
        + [
            "- The search steers by the damage before retraining (docs/spec/engine.md §4.13); the order after the "
            "epoch need not follow it. Scoring choices after a short fine-tune would measure what retraining "
            "recovers; it is not done.",
            "",
        ]
    )


def _prune_search_rows(seed: Mapping[str, Any]) -> list[dict[str, str]]:
    search = _by_role(seed, "search")
    rows = []
    for r in seed["rows"]:
        if r["role"] == "search":
            ratios = ", ".join(f"{k} {v:g}" for k, v in seed["search"]["ratios"].items())
            name, top1, delta = f"prune search: {ratios or 'no cut'}", f"**{r['accuracy']:.4f}**", "(baseline)"
        else:
            name, top1 = r["name"].removeprefix("amct "), f"{r['accuracy']:.4f}"
            delta = _pt(search["accuracy"] - r["accuracy"])
        rows.append(
            {
                "seed": str(seed["seed"]),
                "row": name,
                "MACs (share)": f"{r['macs_ratio']:.3f}",
                "params": f"{r['params']:,}",
                "top-1 after pruning": f"{r['accuracy_after_pruning']:.4f}",
                "top-1 after the epoch": top1,
                "search − row, after the epoch": delta,
            }
        )
    return rows


def _pct(share: float) -> str:
    return f"{share * 100:.0f} %"


def _by_role(seed: Mapping[str, Any], role: str) -> Mapping[str, Any]:
    return next(r for r in seed["rows"] if r["role"] == role)


def _prune_search_verdicts(s: Mapping[str, Any]) -> list[str]:
    uniform = {
        seed["seed"]: _by_role(seed, "search")["accuracy"] - _by_role(seed, "uniform")["accuracy"]
        for seed in s["seeds"]
    }
    matched = {
        seed["seed"]: _by_role(seed, "search")["accuracy"] - _by_role(seed, "matched")["accuracy"]
        for seed in s["seeds"]
    }
    met = all(d >= 0 for d in uniform.values())
    return [
        f"Issue 20's done-when (search at {_pct(s['target_macs'])} MACs ≥ uniform 50 % BCP at the same epochs): "
        f"{'met' if met else 'not met'}: " + ", ".join(f"{_pt(d)} on seed {k}" for k, d in uniform.items()) + ".",
        "Against the MACs-matched uniform cut (the fairer row: uniform 50 % is the harder cut): "
        + ", ".join(f"{_pt(d)} on seed {k}" for k, d in matched.items())
        + f"; within ±{ACCURACY_NOISE_PT} pt is this model's seed-to-seed noise.",
    ]


def prune_search_losses(s: Mapping[str, Any]) -> list[dict[str, str]]:
    """A uniform BCP row (AMCT's recipe) that retrains better than the search, per seed."""
    losses = []
    for seed in s["seeds"]:
        search = _by_role(seed, "search")
        for r in seed["rows"]:
            if r["role"] != "search" and beats_accuracy(r["accuracy"], search["accuracy"]):
                losses.append(
                    _loss(
                        f"prune search: top-1 after the epoch, seed {seed['seed']}",
                        r["name"],
                        f"{r['accuracy']:.4f}",
                        "amct prune search",
                        f"{search['accuracy']:.4f}",
                        f"the search chose by the damage before retraining ({search['macs_ratio']:.3f} "
                        f"of the MACs against {r['macs_ratio']:.3f}); what the epoch recovers is not "
                        "measured",
                    )
                )
    return losses


# --------------------------------------------------------------------------- pruning recipes (bench/prune_compare.py)

PRUNE_COMPARE_TITLE = "## Filter pruning: our recipes against Torch-Pruning"
PRUNE_COMPARE_459K_TITLE = "### The 459k-parameter CNN"
PRUNE_COMPARE_COLUMNS = [
    "ratio",
    "method",
    "params",
    "top-1 after pruning",
    "top-1 after the epoch",
    "Δ vs Torch-Pruning + ORT PTQ",
]


def prune_compare_md(results: Mapping[str, Any]) -> list[str]:
    """The 20k CNN's table (every recipe), then the 459k CNN's (bench/prune_compare.py LARGE_MODEL_RECIPES)."""
    return _prune_compare_md(results, "prune_compare", PRUNE_COMPARE_TITLE, "") + _prune_compare_md(
        results, "prune_compare_459k", PRUNE_COMPARE_459K_TITLE, " --model 459k"
    )


def _prune_compare_md(results: Mapping[str, Any], name: str, title: str, flags: str) -> list[str]:
    lines, c = _section_head(results, name, title)
    if c is None:
        return lines
    st = c["setting"]
    lines += [
        _command(results, name, f"OMP_NUM_THREADS=1 python bench/prune_compare.py{flags}"),
        "",
        f"{st['model']}; the engine table's setting (FP32 base top-1 {st['base_accuracy']:.4f}; {st['epochs']} extra "
        f"epoch on the first {st['train_limit']:,} training images, same batches, Adam lr {st['lr']:g}, seed "
        f"{st['seed']}, {st['threads']} thread(s)), pruning rows only. Ours: the recipes of bench/compress.py in the "
        'table (criterion, BatchNorm recalibration, schedule, KD) with INT8 QAT during the epoch, or ("FP32 epoch, '
        "PTQ\") the epoch in FP32 then our PTQ on the images ORT's PTQ gets; deployed as our INT8 ONNX. "
        "Torch-Pruning: `MetaPruner` with group L2 magnitude (the classifier excluded, as ours; per-layer ratios that "
        'keep our channel counts), FP32 fine-tuning, FP32 ONNX; "+ ORT PTQ": that ONNX through '
        f"ORT's static PTQ on {c['ptq_calibration_images']} training images. 'after pruning': the pruned float "
        "model before any training (ours: BatchNorms recalibrated when the recipe has it); 'after the epoch': the "
        f"deployed model in onnxruntime on {st['test_images']:,} test images. Δ: ours − Torch-Pruning + ORT PTQ at "
        f"the same ratio, both INT8{_load_pair(c.get('load_avg'))}. One seed's Δ is a few test images either way: "
        f"`OMP_NUM_THREADS=1 python bench/prune_compare.py{flags} --seed 0 --seed 1 …` pairs each recipe with "
        "Torch-Pruning + ORT PTQ seed by seed and prints the mean Δ with its 95 % interval.",
        "",
        format_markdown(_prune_compare_rows(c["rows"]), PRUNE_COMPARE_COLUMNS),
        "",
    ]
    return lines + [f"- {line}" for line in _prune_compare_best(c["rows"])] + [""]


def _prune_compare_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    out = []
    for r in rows:
        peer = _tp_ptq(rows, r["ratio"])
        out.append(
            {
                "ratio": f"{round(r['ratio'] * 100)} %",
                "method": f"**{r['name']}**" if r["family"] == "ours" else r["name"],
                "params": f"{r['params']:,}" if r.get("params") else None,
                "top-1 after pruning": _fmt4(r.get("accuracy_after_pruning")),
                "top-1 after the epoch": f"{r['accuracy']:.4f}",
                "Δ vs Torch-Pruning + ORT PTQ": _pt(r["accuracy"] - peer["accuracy"])
                if r["family"] == "ours" and peer
                else None,
            }
        )
    return out


def _tp_ptq(rows: Sequence[Mapping[str, Any]], ratio: float) -> Mapping[str, Any] | None:
    return next((r for r in rows if r["ratio"] == ratio and r["name"].endswith("+ ORT PTQ")), None)


def _prune_compare_best(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    for ratio in sorted({r["ratio"] for r in rows}):
        ours = [r for r in rows if r["ratio"] == ratio and r["family"] == "ours"]
        peers = [r for r in rows if r["ratio"] == ratio and r["family"] == "peer"]
        if not ours or not peers:
            continue
        best, peer = max(ours, key=lambda r: r["accuracy"]), max(peers, key=lambda r: r["accuracy"])
        lines.append(
            f"{round(ratio * 100)} %: our best recipe in this run, {best['name']}, {best['accuracy']:.4f}; "
            f"the best Torch-Pruning row, {peer['name']}, {peer['accuracy']:.4f} "
            f"({_pt(best['accuracy'] - peer['accuracy'])}). 'Where we lose' measures the peers against the "
            f"recipe named before the run ({BEST_PRUNE_ROW.format(pct=round(ratio * 100))}), not this "
            "run's best."
        )
    return lines


def prune_compare_losses(c: Mapping[str, Any], label: str = "pruning recipes") -> list[dict[str, str]]:
    """Each Torch-Pruning row against our best recipe (BEST_PRUNE_ROW) at the same ratio: after pruning and after
    the epoch."""
    rows = {r["name"]: r for r in c["rows"]}
    losses = []
    for peer in (r for r in c["rows"] if r["family"] == "peer"):
        ours = rows.get(BEST_PRUNE_ROW.format(pct=round(peer["ratio"] * 100)))
        if ours is None:
            continue
        for key, when, cause in (
            ("accuracy_after_pruning", "right after pruning", PRUNED_CAUSE),
            ("accuracy", "after the epoch", TRAINED_CAUSE),
        ):
            metric = f"{label}: top-1 {when}"
            if peer.get(key) is not None and ours.get(key) is not None and beats_accuracy(peer[key], ours[key]):
                losses.append(_loss(metric, peer["name"], f"{peer[key]:.4f}", ours["name"], f"{ours[key]:.4f}", cause))
    return losses


PRUNED_CAUSE = "the channels each removes: same criterion family (group L2), different grouping and per-layer ratios"
TRAINED_CAUSE = (
    "the training recipe: same data, epochs and lr; ours trains with fake quantisation (QAT), "
    "Torch-Pruning fine-tunes in FP32"
)


# --------------------------------------------------------------------------- warm start and recovery (service)

WARM_TITLE = "## Warm job processes and the fork server: cold vs warm start"
WARM_KEYS = {
    "submit_to_running_s": "submit → running",
    "running_to_training_s": "running → training",
    "running_to_first_step_s": "running → first recorded step",
    "submit_to_first_step_s": "submit → first recorded step",
}


def warm_start_md(results: Mapping[str, Any]) -> list[str]:
    lines, w = _section_head(results, "warm_start", WARM_TITLE)
    if w is None:
        return lines
    setup, load = w["setup"], w.get("load_average") or {}
    rows = [
        _warm_row(f"cold (`AMCT_WARM_START=0`), median of {len(w['cold']['samples'])}", w["cold"]),
        _warm_row(f"warm process (`AMCT_FORK_SERVER=0`), median of {len(w['warm']['samples'])}", w["warm"]),
    ]
    if "fork" in w:  # since stop 31
        rows.append(_warm_row(f"fork server (default), median of {len(w['fork']['samples'])}", w["fork"]))
    for mode in ("warm", "fork"):
        if f"{mode}_over_cold" in w:
            rows.append(
                {
                    "mode": f"{mode} / cold",
                    **{label: _x(w[f"{mode}_over_cold"].get(key)) for key, label in WARM_KEYS.items()},
                }
            )
    loads = _load_pair([load["before"], load["after"]]) if load else ""
    return lines + [
        _command(
            results, "warm_start", f"python bench/warm_start.py --samples {setup['samples']} --idle {setup['idle_s']:g}"
        ),
        "",
        f"`amct serve` on {setup['backend']} with its embedded worker, one small job at a time on an idle worker "
        "(the 2.6k-parameter TorchScript model of bench/service_load.py, 64 samples, 1 epoch INT8 QAT). Times come "
        "from the database: submit, claim, the `training` phase and the first recorded `progress` event (an upper "
        f"bound on the first step). {setup['samples']} samples per mode, each after {setup['idle_s']:g} s idle; "
        f"before each warm sample the worker's warm job process (or fork server) is ready{loads}. Seconds; min – max "
        "in brackets.",
        "",
        format_markdown(rows, ["mode", *WARM_KEYS.values()]),
        "",
        "The warm-up is the work a cold job does before its first step (imports, the sandbox), done ahead: once "
        "per job by a warm process, once per 100 jobs by the fork server. What remains after the hand-over is the "
        "job's own: its inputs, the dataset, the FP32 export and the capture (docs/scaling.md).",
        "",
    ]


def _warm_row(mode: str, entry: Mapping[str, Any]) -> dict[str, str]:
    row = {"mode": mode}
    for key, label in WARM_KEYS.items():
        values = [s[key] for s in entry["samples"] if s.get(key) is not None]
        row[label] = f"{entry['median'][key]:.3f} ({min(values):.2f} – {max(values):.2f})" if values else None
    return row


def warm_start_costs(w: Mapping[str, Any]) -> list[str]:
    lines = []
    for mode, name in (("warm", "warm job processes"), ("fork", "the fork server")):
        ratio = w.get(f"{mode}_over_cold", {}).get("submit_to_first_step_s")
        if ratio is not None and ratio > 1 + TIME_NOISE:
            lines.append(f"{name}: submit → first recorded step is {ratio:.2f}× the cold start's (median).")
    return lines


RECOVERY_TITLE = "## Crash recovery"
RECOVERY_LABELS = {
    "worker": "worker group killed, new worker started",
    "engine": "engine child killed",
    "embedded": "`amct serve`'s worker killed",
}
RECOVERY_COUNTS = ("succeeded", "resumed", "none_run_twice", "none_left_queued")


def recovery_md(results: Mapping[str, Any]) -> list[str]:
    lines, r = _section_head(results, "recovery", RECOVERY_TITLE)
    if r is None:
        return lines
    rows = []
    for name, t in r["scenarios"].items():
        rows.append(
            {
                "scenario": RECOVERY_LABELS.get(name, name),
                "trials": str(t["trials"]),
                **{c.replace("_", " "): str(t[c]) for c in RECOVERY_COUNTS},
                "orphans": str(t["orphans"]),
                "kill → resumed s (min / median / max)": _spread(t["recover_s"]),
                "kill → succeeded s": _spread(t["finish_s"]),
            }
        )
    columns = [
        "scenario",
        "trials",
        *(c.replace("_", " ") for c in RECOVERY_COUNTS),
        "orphans",
        "kill → resumed s (min / median / max)",
        "kill → succeeded s",
    ]
    return lines + [
        _command(results, "recovery", "python bench/recovery.py --trials 10"),
        "",
        f"{r['trials']} trial(s) per scenario (10 on its own): a 2-epoch INT8 QAT job (SmallFashionCnn, 400 "
        "Fashion-MNIST images, batch 16) killed once the checkpoint of epoch 1 is stored: the whole process group of "
        "a Celery worker (a new one is started), only the engine child (both on "
        f"{r['database']} + a private redis-server), and the worker of a real `amct serve` (SQLite, filesystem "
        "queue). Counts are trials out of the total: succeeded, resumed from the checkpoint stored before the kill, "
        "trained no step twice, left no job queued (requeued → claimed within 30 s); times from the kill"
        f"{_load_pair(r.get('load_avg'))}. There is no peer: the baseline is every trial recovering.",
        "",
        format_markdown(rows, columns),
        "",
    ]


def _spread(samples: Sequence[float]) -> str | None:
    if not samples:
        return None
    return f"{min(samples):.1f} / {statistics.median(samples):.1f} / {max(samples):.1f}"


def recovery_costs(r: Mapping[str, Any]) -> list[str]:
    notes = []
    for name, t in r["scenarios"].items():
        short = [f"{c.replace('_', ' ')} {t[c]}" for c in RECOVERY_COUNTS if t[c] < t["trials"]]
        if t["orphans"]:
            short.append(f"{t['orphans']} orphan process(es)")
        if short:
            notes.append(
                f"crash recovery, {RECOVERY_LABELS.get(name, name)}: of {t['trials']} trials, " + ", ".join(short) + "."
            )
    return notes


STANDALONE_MD = [
    "## Not run by `make bench`",
    "",
    "- `bench/api_cost.py --baseline <another checkout>`: the API's CPU time per read of this tree over a baseline "
    "tree's, both servers up at once in alternating windows. It compares two revisions, so it needs a second "
    "checkout of the change's base (with its own database), which a run of one revision has none to pick for; the "
    "last measurement is in [docs/scaling.md](scaling.md#the-api).",
    "- `bench/sandbox_overhead.py`: a job child started with and without bubblewrap; reported in "
    "[docs/security.md](security.md).",
    "- `bench/recovery.py --trials 10`: the crash-recovery section above with 10 trials per scenario instead of 3; "
    "earlier runs are in [docs/service.md](service.md).",
    "",
]


LOSS_SOURCES = (
    ("engine", engine_losses),
    ("ptq", ptq_losses),
    ("prune_search", prune_search_losses),
    ("prune_compare", prune_compare_losses),
    ("prune_compare_459k", lambda c: prune_compare_losses(c, "pruning recipes, 459k CNN")),
    ("capture", capture_losses),
)
LOSS_MATCHING = (
    "Peers are matched as: in the engine table, ORT PTQ, torchao and NNCF against amct INT8 QAT, and Torch-Pruning "
    "(± ORT PTQ) against our best pruning recipe ({best}) at the same ratio; in the PTQ section, ORT static PTQ and "
    "NNCF against each of our PTQ rows, and every other flow's wall time against ours (IFMR); in the prune search, "
    "uniform BCP (AMCT's recipe, at 50 % and MACs-matched) against the search, per seed; in the pruning recipes "
    "(both CNNs), Torch-Pruning (± ORT PTQ) against {best} at the same ratio, right after pruning and after the "
    "epoch."
)


def losses_md(results: Mapping[str, Any]) -> list[str]:
    losses = [loss for name, find in LOSS_SOURCES if (section := _section(results, name)) for loss in find(section)]
    lines = ["## Where we lose", ""]
    if losses:
        lines += [
            f"Computed from the numbers above: every metric on which a peer (or AMCT's own recipe or ONNX route) "
            f"beats the matching row of ours by more than the noise margin (top-1 {ACCURACY_NOISE_PT} pt, size "
            f"{BYTES_NOISE:.0%}, time {TIME_NOISE:.0%}). " + LOSS_MATCHING.format(best=BEST_PRUNE_ROW.format(pct="N")),
            "",
            format_markdown(losses, ["metric", "peer", "peer value", "ours", "our value", "cause"]),
            "",
        ]
    else:
        lines += ["No peer beats the matching row of ours beyond the noise margins in this run.", ""]
    slower = [s for key in DEPLOY_TITLES if (deploy := _section(results, key)) for s in deploy_losses(deploy)]
    if slower:
        lines += (
            ["Deploy speed (the deploy and mobile sections above), beyond the time noise margin:", ""]
            + [f"- {s}" for s in slower]
            + [""]
        )
    costs = own_costs(results)
    if costs:
        lines += [
            "Where our compression or service costs more than it gives, against the uncompressed model, "
            "the budget or the cold start:",
            "",
        ]
        lines += [f"- {c}" for c in costs] + [""]
    return lines


NOISE_MD = [
    "## Noise",
    "",
    "- The machine is shared: compare ratios within one run, not absolute times across runs. Latencies are "
    "measured round-robin across models (each round runs every model in turn), so a burst of load slows every "
    "model of that round; the ratio of minima is the least load-sensitive figure.",
    "- Training-step times include fetching the batch; the engine table leads with the ratio of the fastest "
    "steps (its rows train one after another, not round-robin), the absolute table gives min / median / max.",
    f"- Accuracy differences below {ACCURACY_NOISE_PT} pt are within seed-to-seed variation for this model and "
    "are not called losses; one seed is run.",
    "- Service latencies share the 2 cores with the worker's engine processes during the 'busy' phase.",
    "- The status table gives each section's load average before and after: above the core count, the processes "
    "measured had a fraction of a core, and absolute times say more about the machine than about the code. The ptq, "
    "prune and recovery sections run with one OpenMP thread, so torch's spinning threads do not wait for a second "
    "core.",
    "",
]


def render(results: Mapping[str, Any], md_path: Path, images: Path) -> None:
    """Write the markdown report and its PNGs (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    md_path.parent.mkdir(parents=True, exist_ok=True)
    images.mkdir(parents=True, exist_ok=True)
    lines = header_md(results) + [""] + engine_md(results, images, md_path.parent)
    crepe = _section(results, "crepe")
    engine = _section(results, "engine")
    if engine:
        curves = images / "bench_training_curves.png"
        plot_training_curves(engine, crepe, curves)
        lines += [
            "Training curves (same batches for every row):",
            "",
            f"![training curves]({curves.relative_to(md_path.parent).as_posix()})",
            "",
        ]
    lines += ptq_md(results, images, md_path.parent) + prune_search_md(results) + prune_compare_md(results)
    lines += ["## Real pretrained models", ""] + minilm_md(results) + crepe_md(results) + llm_quant_md(results)
    lines += (
        deploy_md(results)
        + deploy_md(results, "mobile")
        + deploy_md(results, "transformers")
        + bbc_task_md(results)
        + mobile_accuracy_md(results)
        + capture_md(results)
        + service_md(results)
        + warm_start_md(results)
    )
    lines += recovery_md(results) + STANDALONE_MD + losses_md(results) + NOISE_MD
    md_path.write_text("\n".join(lines).rstrip() + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="?", default=ROOT / "bench" / "results" / "latest.json")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--images", type=Path, help="folder of the PNGs (default: images/ next to --out)")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    render(results, args.out, args.images or args.out.parent / "images")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
