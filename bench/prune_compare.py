"""Filter pruning + INT8, our recipes beside Torch-Pruning (+ ORT PTQ), at 30 % and 50 %: top-1 only.

The engine table's setting (bench/fashion.py: same FP32 base, same extra epoch, lr and batches), its
pruning rows (bench/compress.py recipes, bench/peers.py Torch-Pruning) and nothing else: no latency,
no other methods. For choosing a recipe on a shared machine:

    OMP_NUM_THREADS=1 python bench/prune_compare.py [--quick] [--recipe LABEL-PART ...] [--ratio 0.3 ...] [--seed N ...]
        [--model small|459k]

Prints one line per row: top-1 right after pruning (before training; BN recalibrated when the recipe
has it) and after the epoch (onnxruntime, deploy model), then a JSON summary on stdout. With several
``--seed``: every row per seed, then each recipe paired with Torch-Pruning + ORT PTQ seed by seed (``paired``):
one seed's difference is a few test images either way, so a recipe is "ahead" only when the interval says so.
``make bench`` runs it as its ``prune_compare`` section (``run``: every recipe at 30 % and 50 %, seed 0, one
thread) and, on the 459k CNN, its ``prune_compare_459k`` section (``LARGE_MODEL_RECIPES``), rendered by bench/report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import compress, peers, ptq  # noqa: E402
from bench.common import ort_accuracy  # noqa: E402
from bench.fashion import MODELS, prepare  # noqa: E402

# The larger CNN's rows (``make bench`` section ``prune_compare_459k``): AMCT's BCP, the named best recipe, Taylor,
# and the FP32-epoch + PTQ order of work; the other recipes tied or lost on the 20k CNN.
LARGE_MODEL_RECIPES = [r.label for r in (compress.AMCT, *compress.RECIPES[:2], compress.PRUNE_THEN_PTQ)]


def recipes(parts: list[str]) -> list[compress.Recipe]:
    """AMCT's BCP and every recipe of bench/compress.py; a whole label picks that recipe only, a part every label
    with it."""
    every = (compress.AMCT, *compress.RECIPES)
    labels = {r.label for r in every}
    return [r for r in every if not parts or any(p == r.label if p in labels else p in r.label for p in parts)]


def compare(setup, ratios: list[float], parts: list[str]) -> list[dict]:
    """Per ratio: Torch-Pruning, Torch-Pruning + ORT PTQ, then each of our recipes (INT8 deploy model)."""
    rows = []
    for ratio in ratios:
        tp = peers.torch_pruning(setup, ratio)
        rows.append(
            _row(
                f"Torch-Pruning {round(ratio * 100)} %",
                "peer",
                ratio,
                tp,
                ort_accuracy(tp["onnx"], setup.x_test, setup.y_test, setup.threads),
            )
        )
        quantized = peers.torch_pruning_ptq(setup, ratio)
        rows.append(
            _row(
                f"Torch-Pruning {round(ratio * 100)} % + ORT PTQ", "peer", ratio, quantized, quantized["torch_accuracy"]
            )
        )
        for recipe in recipes(parts):
            name = compress.row_name(recipe, ratio)
            row = compress.amct_compressed(setup, name, recipe.filter_cfg(ratio, len(setup.loader())), recipe)
            rows.append(
                _row(name, "ours", ratio, row, ort_accuracy(row["onnx"], setup.x_test, setup.y_test, setup.threads))
            )
    return rows


def _row(name: str, family: str, ratio: float, row: dict, accuracy: float) -> dict:
    out = {
        "name": name,
        "family": family,
        "ratio": ratio,
        "accuracy_after_pruning": row.get("accuracy_after_pruning"),
        "accuracy": accuracy,
        "params": row.get("params"),
    }
    after = out["accuracy_after_pruning"]
    print(
        f"{name:<55} after pruning {after if after is None else f'{after:.4f}'}  final {accuracy:.4f}  "
        f"params {out['params']}",
        file=sys.stderr,
        flush=True,
    )
    return out


def run(
    quick: bool = False,
    threads: int = 1,
    seed: int = 0,
    ratios: tuple[float, ...] = (0.3, 0.5),
    parts: list[str] | None = None,
    model: str = "small",
) -> dict:
    """The ``prune_compare`` sections of ``make bench`` (bench/run_all.py), rendered by bench/report.py: every recipe
    on the 20k CNN, ``LARGE_MODEL_RECIPES`` on the 459k one (``quick``: AMCT's BCP and the best recipe, on the small
    setting) at 30 % and 50 %."""
    torch.set_num_threads(threads)
    load = os.getloadavg()
    if parts is None:
        parts = (
            [compress.AMCT.label, compress.RECIPES[0].label]
            if quick
            else LARGE_MODEL_RECIPES
            if model != "small"
            else []
        )
    with tempfile.TemporaryDirectory(prefix="amct-prune-compare-") as tmp:
        setup = prepare(Path(tmp), quick=quick, seed=seed, threads=threads, model=model)
        print(f"FP32 base top-1 {setup.base_accuracy:.4f}", file=sys.stderr, flush=True)
        rows = compare(setup, list(ratios), parts)
    return {
        "setting": setup.describe(),
        "ptq_calibration_images": ptq.CALIBRATION_IMAGES,
        "rows": rows,
        "load_avg": [load, os.getloadavg()],
    }


def paired(per_seed: dict[int, list[dict]]) -> list[dict]:
    """Each of our rows against Torch-Pruning + ORT PTQ at its ratio on the same seed (same base model, same
    batches), over the seeds: the mean top-1 difference in points, its sample standard deviation, a 95 % t
    interval of the mean, and the seeds won, tied and lost."""
    from scipy.stats import t as student_t  # scikit-learn's and NNCF's dependency

    diffs: dict[tuple[float, str], list[float]] = {}
    for rows in per_seed.values():
        peer = {r["ratio"]: r["accuracy"] for r in rows if r["name"].endswith("+ ORT PTQ") and r["family"] == "peer"}
        for r in rows:
            if r["family"] == "ours":
                # rounded: top-1 is a count of test images, and float noise would show as "-0.000 pt"
                diffs.setdefault((r["ratio"], r["name"]), []).append(round(100 * (r["accuracy"] - peer[r["ratio"]]), 6))
    out = []
    for (ratio, name), d in diffs.items():
        mean = statistics.fmean(d)
        sd = statistics.stdev(d) if len(d) > 1 else float("nan")
        half = student_t.ppf(0.975, len(d) - 1) * sd / len(d) ** 0.5 if len(d) > 1 else float("nan")
        out.append(
            {
                "name": name,
                "ratio": ratio,
                "seeds": len(d),
                "mean_pt": mean,
                "sd_pt": sd,
                "ci95_pt": [mean - half, mean + half],
                "won": sum(x > 0 for x in d),
                "tied": sum(x == 0 for x in d),
                "lost": sum(x < 0 for x in d),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ratio", type=float, action="append", default=[])
    parser.add_argument("--recipe", action="append", default=[], help="part of a recipe label; repeatable")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--seed",
        type=int,
        action="append",
        default=[],
        help="the base model's and the batches' seed (0: the table's); repeatable: paired over seeds",
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="small", help="the CNN (bench/fashion.py MODELS)")
    args = parser.parse_args(argv)
    seeds = args.seed or [0]
    per_seed = {
        seed: run(args.quick, args.threads, seed, tuple(args.ratio or (0.3, 0.5)), args.recipe, args.model)["rows"]
        for seed in seeds
    }
    if len(seeds) == 1:
        print(json.dumps(per_seed[seeds[0]], indent=1))
        return 0
    summary = paired(per_seed)
    for s in summary:
        print(
            f"{s['name']:<55} vs Torch-Pruning + ORT PTQ over {s['seeds']} seeds: {s['mean_pt']:+.3f} pt "
            f"(sd {s['sd_pt']:.3f}, 95 % [{s['ci95_pt'][0]:+.3f}, {s['ci95_pt'][1]:+.3f}]), "
            f"won {s['won']} tied {s['tied']} lost {s['lost']}",
            file=sys.stderr,
        )
    print(json.dumps({"per_seed": per_seed, "paired": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
