"""Filter pruning + INT8, our recipes beside Torch-Pruning (+ ORT PTQ), at 30 % and 50 %: top-1 only.

The engine table's setting (bench/fashion.py: same FP32 base, same extra epoch, lr and batches), its
pruning rows (bench/compress.py recipes, bench/peers.py Torch-Pruning) and nothing else: no latency,
no other methods. For choosing a recipe on a shared machine:

    OMP_NUM_THREADS=1 python bench/prune_compare.py [--quick] [--recipe LABEL-PART ...] [--ratio 0.3 ...] [--seed N]

Prints one line per row: top-1 right after pruning (before training; BN recalibrated when the recipe
has it) and after the epoch (onnxruntime, deploy model), then a JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import compress, peers  # noqa: E402
from bench.common import ort_accuracy  # noqa: E402
from bench.fashion import prepare  # noqa: E402


def compare(workdir: Path, quick: bool, ratios: list[float], parts: list[str], threads: int,
            seed: int = 0) -> list[dict]:
    torch.set_num_threads(threads)
    setup = prepare(workdir, quick=quick, seed=seed, threads=threads)
    print(f"FP32 base top-1 {setup.base_accuracy:.4f}", file=sys.stderr, flush=True)
    every = (compress.AMCT, *compress.RECIPES)
    labels = {r.label for r in every}  # a whole label picks that recipe only, a part every label with it
    recipes = [r for r in every if not parts or any(p == r.label if p in labels else p in r.label for p in parts)]
    rows = []
    for ratio in ratios:
        tp = peers.torch_pruning(setup, ratio)
        rows.append(_row(f"Torch-Pruning {round(ratio * 100)} %", tp, ort_accuracy(tp["onnx"], setup.x_test,
                                                                                      setup.y_test, threads)))
        ptq = peers.torch_pruning_ptq(setup, ratio)
        rows.append(_row(f"Torch-Pruning {round(ratio * 100)} % + ORT PTQ", ptq, ptq["torch_accuracy"]))
        for recipe in recipes:
            name = compress.row_name(recipe, ratio)
            row = compress.amct_compressed(setup, name, recipe.filter_cfg(ratio, len(setup.loader())), recipe)
            rows.append(_row(name, row, ort_accuracy(row["onnx"], setup.x_test, setup.y_test, threads)))
    return rows


def _row(name: str, row: dict, accuracy: float) -> dict:
    out = {"name": name, "accuracy_after_pruning": row.get("accuracy_after_pruning"), "accuracy": accuracy,
           "params": row.get("params")}
    after = out["accuracy_after_pruning"]
    print(f"{name:<55} after pruning {after if after is None else f'{after:.4f}'}  final {accuracy:.4f}  "
          f"params {out['params']}", file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ratio", type=float, action="append", default=[])
    parser.add_argument("--recipe", action="append", default=[], help="part of a recipe label; repeatable")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="the base model's and the batches' seed (0: the table's)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="amct-prune-compare-") as tmp:
        rows = compare(Path(tmp), args.quick, args.ratio or [0.3, 0.5], args.recipe, args.threads, args.seed)
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
