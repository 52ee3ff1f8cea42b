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

ENGINE_COLUMNS = ["method", "top-1", "Δ vs FP32", "deploy bytes", "ORT latency b1", "ORT latency b64",
                  "train step", "params", "top-1 ORT basic / PyTorch", "top-1 after pruning", "deployed as"]
PRUNING_COLUMNS = ["ratio", "peer", "peer after pruning", "peer top-1", "ours", "ours after pruning", "our top-1",
                   "Δ top-1"]
ENGINE_ABS_COLUMNS = ["method", "deploy kB", "b1 ms min / med / max", "b64 ms min / med / max",
                      "step ms min / med / max", "prepare s", "train s", "convert s", "deploy graph (top ops)"]


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
        main.append({
            "method": label,
            "top-1": top1,
            "Δ vs FP32": "(baseline)" if row["name"] == "FP32" else _pt(row.get("accuracy_delta")),
            "deploy bytes": _x(row.get("bytes_ratio"), 3),
            "ORT latency b1": _ratio_cell(row.get("latency_b1_ratio")),
            "ORT latency b64": _ratio_cell(row.get("latency_b64_ratio")),
            "train step": _step_cell(row),
            "params": _x(row.get("params_ratio")),
            "top-1 ORT basic / PyTorch": (f"{row['accuracy_ort_basic']:.4f} / {row['torch_accuracy']:.4f}"
                                          if "accuracy_ort_basic" in row else None),
            # the pruned float model before any training (ours: with BN recalibration when the recipe has it)
            "top-1 after pruning": (f"{row['accuracy_after_pruning']:.4f}" if row.get("accuracy_after_pruning")
                                    is not None else None),
            "deployed as": row.get("deploy_kind"),
        })
        absolute.append({
            "method": row["name"],
            "deploy kB": f"{row['bytes'] / 1024:.1f}" if "bytes" in row else None,
            "b1 ms min / med / max": _ms(row.get("latency_b1_s")),
            "b64 ms min / med / max": _ms(row.get("latency_b64_s")),
            "step ms min / med / max": _ms(row.get("step_s"), digits=1),
            "prepare s": f"{row['prepare_s']:.2f}" if "prepare_s" in row else None,
            "train s": f"{row['train_s']:.1f}" if "train_s" in row else None,
            "convert s": f"{row['convert_s']:.2f}" if "convert_s" in row else None,
            "deploy graph (top ops)": _ops_line(row) or None,
        })
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
        pairs.append({
            "ratio": peer_name.split("Torch-Pruning ")[1].split(" %")[0] + " %", "peer": peer_name,
            "peer after pruning": _fmt4(peer.get("accuracy_after_pruning")), "peer top-1": _fmt4(peer.get("accuracy")),
            "ours": ours_name, "ours after pruning": _fmt4(ours.get("accuracy_after_pruning")),
            "our top-1": _fmt4(ours.get("accuracy")),
            "Δ top-1": _pt(ours["accuracy"] - peer["accuracy"]) if "accuracy" in ours and "accuracy" in peer else None,
        })
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
    return "\n\n".join([engine_setup_line(result["setup"]), format_markdown(main, ENGINE_COLUMNS),
                        format_markdown(absolute, ENGINE_ABS_COLUMNS)])


# --------------------------------------------------------------------------- plots


def _short(name: str) -> str:
    return (name.replace(" (QDQ, per-channel)", "").replace(" (x86)", "").replace("amct ", "")
            .replace("Torch-Pruning", "TP").replace(" + INT8", "+INT8").replace(" + ORT PTQ", "+PTQ"))


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
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, c=colour, s=60 if marker == "*" else 36,
                   label={"ours": "amct (ours)", "peer": "peers", "baseline": "FP32"}[family], zorder=3)
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
    if "accuracy" in peer and "accuracy" in ours and peer["accuracy"] - ours["accuracy"] > ACCURACY_NOISE_PT / 100:
        found.append(("top-1", f"{peer['accuracy']:.4f}", f"{ours['accuracy']:.4f}", accuracy_cause(peer, ours)))
    if "bytes_ratio" in peer and peer["bytes_ratio"] < ours.get("bytes_ratio", 0) * (1 - BYTES_NOISE):
        found.append(("deploy size", f"{peer['bytes_ratio']:.3f}×", f"{ours['bytes_ratio']:.3f}×",
                      "their file stores fewer bytes per weight or fewer weights; see 'deployed as'"))
    for batch in (1, 64):
        if _better_latency(peer, ours, batch):
            key = f"latency_b{batch}_ratio"
            found.append((f"ORT latency b{batch}", f"{peer[key]['median']:.2f}×", f"{ours[key]['median']:.2f}×",
                          latency_cause(peer, ours)))
    if "step_ratio_min" in peer and "step_ratio_min" in ours and \
            peer["step_ratio_min"] < ours["step_ratio_min"] * (1 - TIME_NOISE):
        found.append(("train step", f"{peer['step_ratio_min']:.2f}×", f"{ours['step_ratio_min']:.2f}×",
                      step_cause(peer)))
    return [{"metric": metric, "peer": peer["name"], "ours": ours["name"], "peer value": pv, "our value": ov,
             "cause": cause} for metric, pv, ov, cause in found]


def accuracy_cause(peer: Row, ours: Row) -> str:
    basic = ours.get("accuracy_ort_basic")
    if basic is not None and abs(basic - ours["accuracy"]) > ACCURACY_NOISE_PT / 100:
        theirs = peer.get("accuracy_ort_basic")
        return (f"onnxruntime's default graph optimisation (its QDQ→QLinear* fusion) changes our deploy model's "
                f"numbers: top-1 {basic:.4f} with basic rewrites only vs {ours['accuracy']:.4f} at the default "
                f"level; PyTorch eval {ours['torch_accuracy']:.4f}"
                + (f" (theirs: {theirs:.4f} basic vs {peer['accuracy']:.4f} default)" if theirs is not None else ""))
    if abs(ours["torch_accuracy"] - ours["accuracy"]) > ACCURACY_NOISE_PT / 100:
        return (f"our deploy ONNX scores {ours['accuracy']:.4f} in onnxruntime but {ours['torch_accuracy']:.4f} "
                "in PyTorch eval: an export/runtime mismatch")
    return ("the training recipe: same data, epochs and lr, different quantisers; "
            "this run does not isolate which part gives the difference")


def _op_difference(a: Row, b: Row) -> str:
    """Nodes of ``a``'s deploy graph that ``b``'s lacks, as ``n×Op``."""
    extra = Counter(a.get("ops") or {}) - Counter(b.get("ops") or {})
    return ", ".join(f"{n}×{op}" for op, n in sorted(extra.items(), key=lambda kv: (-kv[1], kv[0]))) or "nothing"


def latency_cause(peer: Row, ours: Row) -> str:
    if not any(op in (peer.get("ops") or {}) for op in QUANT_OPS):
        return (f"{peer['name']} deploys a float graph; on a model this small onnxruntime's float kernels beat its "
                f"int8 path, whose quantise/dequantise nodes cost more than they save (ours has "
                f"{_op_difference(ours, peer)} more)")
    return (f"the graphs differ: ours has {_op_difference(ours, peer)} that theirs lacks, theirs has "
            f"{_op_difference(peer, ours)}; onnxruntime fuses only QuantizeLinear→op→DequantizeLinear patterns "
            "into int8 kernels (QLinearConv/QGemm) and runs every other node separately; on x86 without VNNI our "
            "weights are uint8 codes + 128 (deploy_target x86_avx2), which run the exact u8u8 kernels, slower than "
            "the u8s8 ones (those saturate there); the profile table shows the per-node times")


def step_cause(peer: Row) -> str:
    if peer["family"] == "peer" and peer["name"].startswith("Torch-Pruning"):
        return ("Torch-Pruning fine-tunes the pruned model in plain FP32; ours trains it with fake quantisation "
                "(QAT) at the same time, which the INT8 deploy model needs")
    return ("ours fake-quantises activations (ULQ, learnt clipping) and weights (ARQ, per channel) with several "
            "element-wise PyTorch ops per layer and trains BN unfolded; the benchmark does not isolate "
            f"which part makes {peer['name']}'s step faster")


def capture_losses(capture: Mapping[str, Any]) -> list[dict[str, str]]:
    losses = []
    for source, routes in capture["routes"].items():
        ours = routes.get("ours", {})
        for label, entry in routes.items():
            ratio = entry.get("ratio_vs_ours")
            if label == "ours" or not ratio or ratio["median"] >= 1 - TIME_NOISE:
                continue
            cause = ("ours rebuilds TorchScript through torch's TS2EPConverter and then re-traces it with "
                     "torch.export (the converter's imports alone take seconds), while the TorchScript ONNX "
                     "exporter walks the loaded graph once") if "TorchScript" in source else \
                "ours captures with torch.fx and analyses every layer; the ONNX route exports and parses once"
            losses.append({"metric": f"capture from {source}", "peer": label,
                           "peer value": f"{entry['s']['median']:.2f} s", "ours": "create_quant_retrain_config",
                           "our value": f"{ours['s']['median']:.2f} s", "cause": cause})
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
                    notes.append(f"{r['name']}: ORT latency at batch {batch} is {ratio['median']:.2f}× FP32 "
                                 f"(slower than the model it compresses; the peers' int8 models are too: see the "
                                 f"profile table for which nodes cost it).")
            if r.get("accuracy_delta", 0) < -1 / 100:
                notes.append(f"{r['name']}: top-1 {_pt(r['accuracy_delta'])} vs FP32.")
    minilm = _section(results, "minilm")
    for name, entry in ((minilm or {}).get("latency_s") or {}).items():
        ratio = entry.get("ratio") if isinstance(entry, Mapping) else None
        if ratio and ratio["median"] > 1 + TIME_NOISE:
            notes.append(f"MiniLM INT8 deploy: ORT latency at {name.replace('batch', 'batch ')} is "
                         f"{ratio['median']:.2f}× FP32.")
    crepe = _section(results, "crepe")
    if crepe:
        for batch, ratio in crepe["latency_ratio"].items():
            if ratio["median"] > 1 + TIME_NOISE:
                notes.append(f"CREPE tiny compressed: ORT latency at batch {batch[1:]} is {ratio['median']:.2f}× FP32"
                             + _crepe_latency_cause(crepe))
    return notes


def _crepe_latency_cause(crepe: Mapping[str, Any]) -> str:
    """Why, when the profile shows it: convs left as ConvInteger (deploy files written before issue 22)."""
    int8 = next((p for p in crepe.get("ort_profile", []) if p["name"] == "int8"), None)
    nodes = int8["ort_profile"][0]["nodes"] if int8 else []
    slow = [n for n in nodes if n["op"] == "ConvInteger"]
    if not slow:
        return "."
    share = sum(n["us"] for n in slow) / int8["ort_profile"][0]["total_us"]
    return (f": ConvInteger nodes take {100 * share:.0f} % of the deploy model's time. Each conv is followed by "
            "ReLU then BatchNorm, so its output does not reach the next quantised layer through ReLU/max-pool only "
            "and is not requantised into a QLinearConv; onnxruntime's ConvInteger has no fast CPU kernel.")


# --------------------------------------------------------------------------- sections


def _section(results: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    section = results["sections"].get(name)
    return section["result"] if section and section["status"] == "ok" else None


def _section_head(results: Mapping[str, Any], name: str,
                  title: str) -> tuple[list[str], Mapping[str, Any] | None]:
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
        _kv_table([
            ("command", f"`{meta['command']}`"), ("date (UTC)", meta["started"][:19].replace("T", " ")),
            ("revision", meta["revision"]), ("CPU", m["cpu"]),
            ("cores", f"{m['cores']} ({m['usable_cores']} usable)"), ("RAM", f"{m['ram_gib']} GiB"),
            ("OS", m["os"]), ("Python", m["python"]),
            ("load average at start", " / ".join(f"{x:.2f}" for x in m["load_avg_at_start"])),
            ("total time", f"{meta.get('total_s', 0) / 60:.1f} min"),
        ]),
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
        "",
        format_markdown([{"section": name, "status": s["status"] + (f": {s['reason']}" if s.get("reason") else ""),
                          "time": f"{s['wall_s'] / 60:.1f} min"} for name, s in results["sections"].items()],
                        ["section", "status", "time"]),
    ]
    return lines


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
        "## Engine: Fashion-MNIST, ours against the tools a user would otherwise pick", "",
        engine_setup_line(result["setup"]), "",
        "Ours in **bold**. Ratios are against the FP32 row (same extra epochs, no compression). ORT latency: "
        "median ratio with the ratio of the minima in brackets; one ORT thread, every model timed round-robin "
        f"({result['setup']['latency_rounds']} rounds) so load bursts hit all alike. 'train step': the fastest "
        "training step over the FP32 row's fastest (rows train one after another, so the minimum is the figure a "
        "load burst moves least), the ratio of the medians in brackets; distillation has only a mean time per "
        "batch of images, compared with the FP32 row's mean.", "",
        format_markdown(main, ENGINE_COLUMNS), "",
        f"![accuracy vs size]({acc.relative_to(md_dir).as_posix()})", "",
        f"![latency vs size]({lat.relative_to(md_dir).as_posix()})", "",
        "Absolute numbers (ms are min / median / max):", "",
        format_markdown(absolute, ENGINE_ABS_COLUMNS), "",
    ]
    pairs = pruning_pairs(result)
    if pairs:
        lines += ["Filter pruning, our best recipe beside Torch-Pruning at the same ratio (same channel counts): "
                  "top-1 of the pruned float model before any training, and of the deployed model after the "
                  "epoch (Δ: ours − peer):", "", format_markdown(pairs, PRUNING_COLUMNS), ""]
    differing = [r for r in result["rows"] if r["status"] == "ok" and "accuracy_ort_basic" in r
                 and abs(r["accuracy_ort_basic"] - r["accuracy"]) > ACCURACY_NOISE_PT / 100]
    if differing:
        lines += ["onnxruntime's default optimisation level changes these deploy models' top-1 (vs basic rewrites "
                  "only): " + "; ".join(f"{r['name']} {r['accuracy']:.4f} default vs {r['accuracy_ort_basic']:.4f} "
                                        f"basic (PyTorch {r['torch_accuracy']:.4f})" for r in differing) + ".", ""]
    lines += profile_md(result["rows"])
    sparse = [r for r in result["rows"] if r["status"] == "ok" and r.get("nonzero_ratio") is not None
              and r["nonzero_ratio"] < (r.get("params_ratio") or 1) - 0.05]
    if sparse:
        lines += ["Sparse rows keep zeros in a dense file: " + "; ".join(
            f"{r['name']} non-zero weights {r['nonzero_ratio']:.2f}× FP32" for r in sparse) + ".", ""]
    return lines


def profile_md(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The onnxruntime profile table: each profiled deploy model's costliest nodes per batch size."""
    table = []
    for row in rows:
        for prof in row.get("ort_profile", ()):
            total = prof["total_us"]
            costliest = "; ".join(f"{n['op']} `{n['node'].strip('/')}` {n['us']:.0f} ({100 * n['us'] / total:.0f} %)"
                                  for n in prof["nodes"][:4])
            table.append({"method": row["name"], "batch": str(prof["batch"]), "all nodes µs": f"{total:.0f}",
                          "costliest nodes, µs per run (share)": costliest})
    if not table:
        return []
    return ["Where onnxruntime spends a run (its own profiler, one thread, mean over the runs; node names are "
            "those of the optimised graph, e.g. a fused `QLinearConv`):", "",
            format_markdown(table, ["method", "batch", "all nodes µs", "costliest nodes, µs per run (share)"]), ""]


def minilm_md(results: Mapping[str, Any]) -> list[str]:
    lines, m = _section_head(results, "minilm", "### all-MiniLM-L6-v2, INT8 distillation")
    if m is None:
        return lines
    try:
        sentences = m["sentences"]
        pairs = [
            ("sentences (train / held-out / tokens)", f"{sentences['train']} / {sentences['eval']} / "
                                                       f"{sentences['tokens']}"),
            ("mean cosine, INT8 student vs FP32 embedding (PyTorch)", f"{m['cos_student_fp32']:.4f}"),
            ("mean (min) cosine, deploy ONNX vs FP32", f"{m['cos_deploy_fp32']['mean']:.4f} "
                                                       f"({m['cos_deploy_fp32']['min']:.4f})"),
            ("mean (min) cosine, deploy ONNX vs PyTorch student", f"{m['cos_deploy_pytorch']['mean']:.5f} "
                                                                  f"({m['cos_deploy_pytorch']['min']:.5f})"),
            *[(f"ORT latency deploy / FP32, {name.replace('batch', 'batch ')} (median, min)",
               _ratio_cell(entry["ratio"])) for name, entry in m["latency_s"].items()],
            ("deploy bytes / FP32 ONNX (word embeddings stay FP32)", f"{m['deploy_bytes_ratio']:.3f}×"),
            ("distill step (one group) / FP32 train step", _x(m["distill_group_step_over_fp32_step"])),
            ("distillation wall time", f"{m['distill_total_s']:.0f} s"),
        ]
    except (KeyError, TypeError):  # another shape of result: show whatever scalars it has
        pairs = []
        _flatten("", m, pairs)
    return lines + [_kv_table(pairs), ""]


def crepe_md(results: Mapping[str, Any]) -> list[str]:
    lines, c = _section_head(results, "crepe", "### CREPE tiny, compressed retrain (30 % filter pruning + INT8, and "
                                               "INT8 alone) with the FP32 model as teacher")
    if c is None:
        return lines
    s = c["setup"]
    lines += [
        f"Synthetic harmonic tones, {s['range_hz'][0]:g}–{s['range_hz'][1]:g} Hz, 16 kHz frames of 1,024 samples: "
        f"{s['train_tones']} for training, {s['test_tones']} held out. {s['epochs']} epochs, Adam {s['lr']:g}, "
        f"batch {s['batch']}, BCE against the teacher's 360 activations (no labels).", "",
        format_markdown([{"model": name, "median error Hz": f"{e['median_hz']:.2f}",
                          "mean error Hz": f"{e['mean_hz']:.2f}", "median error cents": f"{e['median_cents']:.1f}",
                          "mean error cents": f"{e['mean_cents']:.1f}", "within 50 cents": f"{e['rpa_50c']:.3f}"}
                         for name, e in c["errors"].items()],
                        ["model", "median error Hz", "mean error Hz", "median error cents", "mean error cents",
                         "within 50 cents"]), "",
        _kv_table([
            ("parameters compressed / FP32", f"{c['params']['ratio']:.3f}× ({c['params']['compressed']:,} / "
                                             f"{c['params']['fp32']:,})"),
            ("deploy bytes / FP32 ONNX", f"{c['bytes_ratio']:.3f}×"),
            ("ORT latency / FP32, batch 1 (median, min)", _ratio_cell(c["latency_ratio"]["b1"])),
            ("ORT latency / FP32, batch 64 (median, min)", _ratio_cell(c["latency_ratio"]["b64"])),
            *([("INT8 only (no pruning): deploy bytes / FP32 ONNX", f"{c['int8_only']['bytes_ratio']:.3f}×"),
               ("INT8 only: ORT latency / FP32, batch 1 (median, min)",
                _ratio_cell(c["int8_only"]["latency_ratio"]["b1"])),
               ("INT8 only: ORT latency / FP32, batch 64 (median, min)",
                _ratio_cell(c["int8_only"]["latency_ratio"]["b64"]))] if "int8_only" in c else []),
            ("median |deploy − teacher| pitch, cents", f"{c['agreement_cents_vs_teacher']:.1f}"),
            ("train step median, s", f"{c['step_s']:.3f}"), ("section time, s", f"{c['total_s']:.0f}"),
        ]), "",
    ]
    return lines + profile_md(c.get("ort_profile", []))


def capture_md(results: Mapping[str, Any]) -> list[str]:
    lines, c = _section_head(results, "capture",
                             "## Graph capture: ours (capture + config) vs AMCT's route (ONNX export + load)")
    if c is None:
        return lines
    rows = []
    for source, routes in c["routes"].items():
        for label, entry in routes.items():
            if entry["status"] != "ok":
                rows.append({"source": source, "route": label, "seconds min / med / max": entry["status"] + ": "
                             + entry["reason"]})
                continue
            rows.append({"source": source, "route": "**ours: create_quant_retrain_config**" if label == "ours"
                         else label, "seconds min / med / max": _ms(entry["s"], 1, 2),
                         "time / ours": _x(entry.get("ratio_vs_ours", {}).get("median"))})
    lines += [f"{c['model']}, {c['quantizable_layers']} quantisable layers, {c['repeats']} repeat(s); the TorchScript "
              f"rebuild gives the same distill groups as the nn.Module: {c['same_groups_from_torchscript']}.", "",
              format_markdown(rows, ["source", "route", "seconds min / med / max", "time / ours"]), ""]
    return lines


def service_md(results: Mapping[str, Any]) -> list[str]:
    lines, s = _section_head(results, "service", "## Service under load")
    if s is None:
        return lines
    setup = s["setup"]
    lines += [
        f"Each back end: `python -m service serve` with its embedded worker on this machine; the load comes from "
        f"other processes. GET load: {setup['rate_per_endpoint']:g} requests/s per endpoint on a fixed schedule "
        f"(open loop: latency counts from the scheduled time) for {setup['seconds']:g} s, once idle and once while "
        f"the batch drains. Batch: {setup['jobs']} jobs of {setup['model']}, submitted back to back; jobs still "
        f"queued after {setup['window_s']:.0f} s are cancelled (their messages must then be skipped), and the "
        f"database is audited. Server environment: "
        + ", ".join(f"`{k}={v}`" for k, v in setup["server_env"].items())
        + " (the reaper re-sends every job queued over a minute, so duplicate deliveries are part of the test).", "",
    ]
    rows = []
    for b in s["backends"].values():
        if b["status"] != "ok":
            rows.append({"back end": b["backend"], "submit → running s": f"{b['status']}: {b.get('reason', '')}"})
            continue
        batch, audit = b["batch"], b["batch"]["audit"]
        row = {"back end": f"{b['backend']}, {b['workers']} worker(s), auth {b['auth']}",
               "submit → running s": f"{b['submit_to_running_s']['median']:.2f}"}
        for phase in ("idle", "busy"):
            for endpoint, stats in b[f"read_{phase}"]["endpoints"].items():
                short = "get" if "{id}" in endpoint else "list"
                row[f"{short} p50/p99 ms ({phase})"] = (f"{stats['p50_ms']:.1f} / {stats['p99_ms']:.1f}"
                                                        if "p50_ms" in stats else "-")
        row["submits/s"] = f"{batch['jobs'] / batch['submit_s']:.0f}"
        row["jobs/min"] = f"{batch['jobs_per_min']:.1f}" if batch["jobs_per_min"] else "-"
        row["ran / cancelled / failed"] = (f"{batch['succeeded']} / {audit['statuses'].get('cancelled', 0)} / "
                                           f"{audit['statuses'].get('failed', 0)}")
        row["lost"] = str(batch["lost"])
        row["ran twice"] = str(batch["ran_twice"])
        row["re-sent messages"] = str(audit["re_sent_messages"])
        rows.append(row)
    columns = ["back end", "submit → running s", "get p50/p99 ms (idle)", "list p50/p99 ms (idle)",
               "get p50/p99 ms (busy)", "list p50/p99 ms (busy)", "submits/s", "jobs/min",
               "ran / cancelled / failed", "lost", "ran twice", "re-sent messages"]
    errors = {name: b[f"read_{p}"]["errors"] for name, b in s["backends"].items() if b["status"] == "ok"
              for p in ("idle", "busy") if b[f"read_{p}"]["errors"]}
    lines += [format_markdown(rows, columns), ""]
    if errors:
        lines += [f"GET errors: {errors}.", ""]
    lines += ["'get' is `GET /v1/jobs/{id}`, 'list' is `GET /v1/jobs?limit=50`. 'lost': jobs missing or not in a "
              "terminal state after the run; 'ran twice': jobs claimed more than once, reclaimed, requeued or with "
              "attempt ≠ 1 (from the `jobs` rows and their state events). jobs/min: succeeded jobs over the span "
              "from the first start to the last finish. Each job runs the engine in a fresh child process "
              "(import torch, capture, train, export, check): that start-up, not the queue, bounds jobs/min.", ""]
    return lines


def deploy_md(results: Mapping[str, Any]) -> list[str]:
    """bench/deploy_speed.py: latency of our INT8 deploy ONNX against FP32 and ORT's static PTQ, per model."""
    lines, d = _section_head(results, "deploy", "## Deploy speed: our INT8 ONNX vs FP32 and onnxruntime's own PTQ")
    if d is None:
        return lines
    h = d["header"]
    load = h.get("load_avg_at_start")
    lines += [f"CPU ISA: {', '.join(h['isa'])}; deploy_target auto = `{h['deploy_target(auto)']}`; onnxruntime "
              f"{h['onnxruntime']}, {h['threads']} threads{_load_text(load, ' at start')}. Per model and batch: "
              "the minimum and median ms per run (interleaved rounds) and each as a ratio to FP32's in the same "
              "run; the ratio of minima is the least load-sensitive wall figure (see Noise), 'ours / best peer' "
              "uses it; `cpu_vs_fp32` is the ratio of minimum CPU times on one thread with spinning off (the work "
              "a run needs, which the load barely moves). "
              "Random-init weights (BN statistics set) except CREPE (pretrained) and MiniLM (distilled); "
              "ours is a calibration-only quantisation of the same weights.", ""]
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
        for batch, best in section.get("ours_vs_best_peer", {}).items():
            others = "".join(f", {best[key]:.2f}× by {what}" for key, what in
                             (("ratio_median", "medians"), ("ratio_cpu", "one-thread CPU time")) if key in best)
            lines.append(f"- ours / best peer at {batch}: {best['ratio']:.2f}× by minima ({best['peer']}){others}")
        if "load_avg" in section:
            before, after = section["load_avg"]
            lines.append(f"- load average (1 / 5 / 15 min) while timing: {_loads(before)} before, "
                         f"{_loads(after)} after")
        report = section.get("report", {})
        lines.append(f"- ours after ORT's optimiser: {_op_counts(report.get('optimized_op_counts', {}))}; "
                     f"layers not fused: {', '.join(report.get('not_fused') or {}) or 'none'}")
        layout = {k: v for k, v in report.get("conv_layout", {}).items() if v}
        if layout:
            lines.append("- conv layout rewrites (export.conv_layout): "
                         + "; ".join(f"{k.replace('_', ' ')}: {', '.join(v)}" for k, v in layout.items()))
        for key, label in (("profile_ours", "ours"), ("profile_best_peer", "best peer")):
            top = list(section.get(key, {}).items())[:6]
            if top:
                lines.append(f"- µs per run by op type (one thread, each node's fastest run), {label}: "
                             + ", ".join(f"{op} {us:.0f}" for op, us in top))
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


def losses_md(results: Mapping[str, Any]) -> list[str]:
    engine = _section(results, "engine")
    capture = _section(results, "capture")
    losses = (engine_losses(engine) if engine else []) + (capture_losses(capture) if capture else [])
    lines = ["## Where we lose", ""]
    if losses:
        lines += [f"Computed from the numbers above: every metric on which a peer (or AMCT's ONNX route, for "
                  f"capture) beats the matching row of ours by more than the noise margin (top-1 "
                  f"{ACCURACY_NOISE_PT} pt, size {BYTES_NOISE:.0%}, time {TIME_NOISE:.0%}). Peers are matched as: "
                  "ORT PTQ, torchao and NNCF against amct INT8 QAT; Torch-Pruning (± ORT PTQ) against our best "
                  f"pruning recipe ({BEST_PRUNE_ROW.format(pct='N')}) at the same ratio.", "",
                  format_markdown(losses, ["metric", "peer", "peer value", "ours", "our value", "cause"]), ""]
    else:
        lines += ["No peer beats the matching row of ours beyond the noise margins in this run.", ""]
    deploy = _section(results, "deploy")
    slower = deploy_losses(deploy) if deploy else []
    if slower:
        lines += ["Deploy speed (section above), beyond the time noise margin:", ""] + [f"- {s}" for s in slower] + [""]
    costs = own_costs(results)
    if costs:
        lines += ["Where our compression costs more than it gives, against the uncompressed model:", ""]
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
        lines += ["Training curves (same batches for every row):", "",
                  f"![training curves]({curves.relative_to(md_path.parent).as_posix()})", ""]
    lines += ["## Real pretrained models", ""] + minilm_md(results) + crepe_md(results)
    lines += deploy_md(results) + capture_md(results) + service_md(results) + losses_md(results) + NOISE_MD
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
