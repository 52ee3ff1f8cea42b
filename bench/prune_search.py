"""Budgeted prune search against uniform BCP, at the same retraining (issue 20: 50 %-MACs target, top-1).

The engine table's setting (bench/fashion.py: the same FP32 base, the same extra epoch on the same batches
with the same Adam lr). Every row is ``create_prune_retrain_model`` (channels removed, BatchNorms
re-estimated on the same 8 training batches) then that training, in FP32; only the prune cfg differs:

- ``prune search``: ``auto_channel_prune_search`` with a 50 % MACs target, its sensitivity measured on the
  last 2,000 training images (no test image), calibrated on the first 512; its cfg as it is;
- ``uniform BCP 50 %``: every prunable group at prune ratio 0.5, AMCT's recipe at the ratio the issue
  names (a harder cut: half the channels of two stacked convs leave about a third of the MACs);
- ``uniform BCP, MACs matched``: the uniform ratio whose MACs come closest to the search's result.

Top-1 on the test set right after pruning (BN re-estimated, before training) and after the epoch;
MACs and parameters of the pruned model. ``--seed`` repeats with another base model and batch order.

    OMP_NUM_THREADS=1 python bench/prune_search.py [--quick] [--seed 0 --seed 1] [--threads 1]

``make bench`` runs it as its ``prune_search`` section (``run``: seeds 0 and 1, one thread), rendered by
bench/report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a script: make `bench` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fashion import FashionSetup, prepare, timed_training  # noqa: E402
from job_process.training import evaluate_accuracy  # noqa: E402

TARGET_MACS = 0.5
CALIBRATION = 512  # images the search calibrates on, in batches of 128 (as bench/ptq.py)
SEARCH_IMAGES = 2000  # the training split's tail: the search's held-out data
BN_BATCHES = 8
UNIFORM_CANDIDATES = tuple(r / 100 for r in range(20, 61, 2))
FILTER_CFG = (
    "prune_config {{ filter_pruner {{ balanced_l2_norm_filter_prune "
    "{{ prune_ratio: {ratio:g} ascend_optimized: false }} }} }}\n"
)


def search_cfg(setup: FashionSetup, path: Path) -> dict[str, Any]:
    from amct_engine.prune_search import auto_channel_prune_search

    images = setup.x_train[:CALIBRATION]
    tail = slice(len(setup.x_train) - SEARCH_IMAGES, len(setup.x_train))
    result = auto_channel_prune_search(
        setup.base_copy().eval(),
        setup.example,
        [images[i : i + 128] for i in range(0, CALIBRATION, 128)],
        setup.x_train[tail],
        setup.y_train[tail],
        TARGET_MACS,
        path,
    )
    return {"cfg": path, "ratios": result.ratios, "search_macs_ratio": result.measured_macs_ratio}


def pruned(setup: FashionSetup, cfg: Path, folder: Path) -> torch.nn.Module:
    """The base pruned by ``cfg``, BatchNorms re-estimated on the first BN_BATCHES training batches."""
    from amct_engine.prune_retrain import create_prune_retrain_model

    return create_prune_retrain_model(
        setup.base_copy(),
        setup.example,
        str(cfg),
        str(folder / "record.txt"),
        calibration_data=setup.loader(),
        calibration_batches=BN_BATCHES,
    )


def macs_ratio(setup: FashionSetup, model: torch.nn.Module) -> float:
    from amct_engine.prune_search import model_macs

    return model_macs(model, setup.example) / model_macs(setup.base, setup.example)


def uniform_cfg(folder: Path, ratio: float) -> Path:
    path = folder / f"uniform_{ratio:g}.cfg"
    path.write_text(FILTER_CFG.format(ratio=ratio))
    return path


def matched_ratio(setup: FashionSetup, folder: Path, target: float) -> tuple[float, float]:
    """(uniform ratio, its MACs share) with the MACs share closest to ``target``."""
    from amct_engine.prune_retrain import create_prune_retrain_model

    best = None
    for ratio in UNIFORM_CANDIDATES:
        model = create_prune_retrain_model(
            setup.base_copy(), setup.example, str(uniform_cfg(folder, ratio)), str(folder / "probe_record.txt")
        )
        share = macs_ratio(setup, model)
        if best is None or abs(share - target) < abs(best[1] - target):
            best = (ratio, share)
    return best


def row(setup: FashionSetup, name: str, cfg: Path) -> dict[str, Any]:
    folder = setup.folder(name)
    torch.manual_seed(setup.seed + 1)
    model = pruned(setup, cfg, folder)
    before = evaluate_accuracy(model, setup.x_test, setup.y_test)
    training = timed_training(model, setup.loader(), setup.epochs, setup.lr)
    out = {
        "name": name,
        "macs_ratio": macs_ratio(setup, model),
        "params": sum(p.numel() for p in model.parameters()),
        "accuracy_after_pruning": before,
        "accuracy": evaluate_accuracy(model, setup.x_test, setup.y_test),
        "train_s": training["train_s"],
        "cfg": cfg.read_text().strip(),
    }
    print(
        f"[prune search] {name}: MACs {out['macs_ratio']:.3f}, params {out['params']}, top-1 after pruning "
        f"{before:.4f}, after {setup.epochs} epoch(s) {out['accuracy']:.4f}",
        file=sys.stderr,
        flush=True,
    )
    return out


def compare(workdir: Path, quick: bool, seed: int, threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    setup = prepare(workdir, quick=quick, seed=seed, threads=threads)
    print(f"[prune search] seed {seed}: FP32 base top-1 {setup.base_accuracy:.4f}", file=sys.stderr, flush=True)
    search = search_cfg(setup, workdir / "prune_search.cfg")
    ratio, share = matched_ratio(setup, workdir, search["search_macs_ratio"])
    rows = [
        {"role": "search", **row(setup, f"amct prune search ({TARGET_MACS:.0%} MACs target)", search["cfg"])},
        {"role": "uniform", **row(setup, "amct uniform BCP 50 %", uniform_cfg(workdir, 0.5))},
        {
            "role": "matched",
            "ratio": ratio,
            **row(setup, f"amct uniform BCP {ratio:.0%} (MACs matched: {share:.3f})", uniform_cfg(workdir, ratio)),
        },
    ]
    return {
        "seed": seed,
        "base_accuracy": setup.base_accuracy,
        "search": {"ratios": search["ratios"]},
        "setting": setup.describe(),
        "rows": rows,
    }


def run(quick: bool = False, seeds: tuple[int, ...] | None = None, threads: int = 1) -> dict[str, Any]:
    """The ``prune_search`` section of ``make bench`` (bench/run_all.py), rendered by bench/report.py: seeds 0
    and 1 (``quick``: seed 0 on the small setting)."""
    load = os.getloadavg()
    results = []
    for seed in seeds or ((0,) if quick else (0, 1)):
        with tempfile.TemporaryDirectory(prefix="amct-prune-search-") as tmp:
            results.append(compare(Path(tmp), quick, seed, threads))
    return {"target_macs": TARGET_MACS, "threads": threads, "seeds": results, "load_avg": [load, os.getloadavg()]}


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| seed | row | MACs (share of FP32) | params | top-1 after pruning | top-1 after retraining |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        for r in result["rows"]:
            lines.append(
                f"| {result['seed']} | {r['name']} | {r['macs_ratio']:.3f} | {r['params']:,} | "
                f"{r['accuracy_after_pruning']:.4f} | {r['accuracy']:.4f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, action="append", default=[])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    results = []
    for seed in args.seed or [0]:
        with tempfile.TemporaryDirectory(prefix="amct-prune-search-") as tmp:
            results.append(compare(Path(tmp), args.quick, seed, args.threads))
    print(markdown(results))
    print(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
