"""Automatic mixed precision (AMCT's accuracy_based_auto_calibration role, docs/spec/engine.md §4.12).

Given an accuracy budget on held-out data (a maximum top-1 drop in points, or a minimum output
cosine to the float model), choose INT4 (A8W4), INT8, INT16 (A16W8) or float (skip) per layer so
that the deploy model's weight bytes are smallest while the budget holds:

1. every layer INT8; while the budget fails, the layer whose INT8 form hurts most goes up one
   step (INT16, then float);
2. then, cheapest damage per saved byte first (from each layer's INT4 sensitivity), a layer goes
   down to INT4 when the whole mixed model still meets the budget;
3. the choice is written as an ordinary calibration ``.cfg`` (docs/spec/engine.md §2.5: overrides for INT4 / INT16
   layers, skip_layers for float ones), run through PTQ and saved, and the deploy ONNX itself is
   measured with onnxruntime; if it misses the budget, the last INT4 step is undone and the cfg
   checked again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

from amct_engine.export.save import quant_layers
from amct_engine.graph.capture import as_input_tuple
from amct_engine.layer_variants import (
    EVAL_CHUNK,
    PRECISIONS,
    Deviation,
    calibrate,
    deviation,
    float_twin,
    layer_costs,
    layer_types,
    outputs,
)
from amct_engine.sensitivity import swapped

WEIGHT_BYTES = {"INT4": 0.5, "INT8": 1.0, "INT16": 1.0, "FP32": 4.0}
RAISE_ORDER = ("INT8", "INT16", "FP32")


@dataclass(frozen=True)
class Budget:
    max_top1_drop: float | None = None  # points
    min_cosine: float | None = None

    def __post_init__(self):
        if self.max_top1_drop is None and self.min_cosine is None:
            raise ValueError("give max_top1_drop (points) or min_cosine")

    def met(self, dev: Deviation) -> bool:
        if self.max_top1_drop is not None and (dev.top1_drop is None or dev.top1_drop > self.max_top1_drop + 1e-9):
            return False
        return self.min_cosine is None or dev.cosine >= self.min_cosine


@dataclass
class MixedPrecisionResult:
    precisions: dict[str, str]
    weight_bytes: float  # estimated: weights x bits / 8 (float: 4 bytes)
    int8_weight_bytes: float
    searched: Deviation  # of the composed PyTorch model
    deployed: Deviation  # of the deploy ONNX run by onnxruntime
    int8_deployed: Deviation
    cfg_file: str
    files: dict[str, str] = field(default_factory=dict)
    file_bytes: dict[str, int] = field(default_factory=dict)  # deploy file sizes, ours and all-INT8's
    steps: list[dict] = field(default_factory=list)
    model: nn.Module | None = field(default=None, repr=False)  # the final PTQ calibration model

    def to_json(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "model"}
        for name in ("searched", "deployed", "int8_deployed"):
            data[name] = asdict(data[name])
        return data


def calibration_cfg_text(precisions: dict[str, str], batch_num: int) -> str:
    """The calibration .cfg (docs/spec/engine.md §2.5) of a per-layer choice: INT8 common, overrides, skip_layers."""
    common = "common_config { ifmr_quantize { dst_type: INT8 } arq_quantize { quant_bits: 8 } }"
    lines = [f"batch_num: {batch_num}", common]
    lines += [f'skip_layers: "{name}"' for name, p in precisions.items() if p == "FP32"]
    for name, p in precisions.items():
        if p == "INT4":
            body = "ifmr_quantize { dst_type: INT8 } arq_quantize { quant_bits: 4 }"
        elif p == "INT16":
            body = "ifmr_quantize { dst_type: INT16 } arq_quantize { quant_bits: 8 }"
        else:
            continue
        lines.append(f'override_layer_configs {{ layer_name: "{name}" calibration_config {{ {body} }} }}')
    return "\n".join(lines) + "\n"


def ort_outputs(path: str, inputs) -> torch.Tensor:
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    inputs = as_input_tuple(inputs)
    parts = []
    for begin in range(0, len(inputs[0]), EVAL_CHUNK):
        feeds = {n: t[begin : begin + EVAL_CHUNK].numpy() for n, t in zip(names, inputs, strict=False)}
        parts.append(session.run(None, feeds)[0].reshape(len(feeds[names[0]]), -1))
    return torch.from_numpy(np.concatenate(parts)).float()


def default_io(input_data) -> dict:
    """Export names when the caller gives none: `input0`, `input1`, … and `output`, batch axes dynamic."""
    names = [f"input{i}" for i in range(len(as_input_tuple(input_data)))]
    return {
        "input_names": names,
        "output_names": ["output"],
        "dynamic_axes": {n: {0: "n"} for n in names} | {"output": {0: "n"}},
    }


def run_cfg(
    model, input_data, calibration_data, cfg_file, workdir, name: str, io: dict | None = None
) -> tuple[dict[str, str], nn.Module]:
    """PTQ with `cfg_file` (create_quant_config -> quantize_model -> batches -> save_model) in two deploy
    formats; returns the files and the calibration model. `io`: input_names / output_names /
    dynamic_axes of the files (default_io when None)."""
    from amct_engine.ptq import create_quant_config, quantize_model, save_model

    folder = Path(workdir)
    config, onnx_file, record = folder / f"{name}.json", folder / f"{name}_fused.onnx", folder / f"{name}_record.txt"
    create_quant_config(str(config), model, input_data, config_defination=str(cfg_file))
    calibration = quantize_model(
        str(config), str(onnx_file), str(record), model, input_data, **(io or default_io(input_data))
    )
    with torch.no_grad():
        for batch in calibration_data:
            calibration(*as_input_tuple(batch))
    paths = save_model(str(onnx_file), str(record), str(folder / name), model=calibration)
    paths["ascend_deploy"] = save_model(
        str(onnx_file), str(record), str(folder / f"{name}_ascend"), model=calibration, deploy_format="ascend"
    )["deploy"]
    return paths, calibration


def auto_mixed_precision(
    model: nn.Module,
    input_data,
    calibration_data: Sequence,
    eval_data,
    eval_labels: torch.Tensor | None,
    budget: Budget,
    workdir: str | os.PathLike,
    candidates: Sequence[str] = ("INT4", "INT8", "INT16", "FP32"),
    progress: Callable[[int, int], None] | None = None,
    io: dict | None = None,
) -> MixedPrecisionResult:
    """Search, write `<workdir>/mixed_precision.cfg`, verify it through PTQ and the deploy ONNX.

    `input_data`, each calibration batch and `eval_data` are a tensor or a tuple of the model's inputs;
    `io` names the saved files' inputs and outputs (input_names / output_names / dynamic_axes)."""
    os.makedirs(workdir, exist_ok=True)
    search = _Search(model, input_data, calibration_data, eval_data, eval_labels, candidates)
    choice = {n: "INT8" for n in search.types}
    dev = search.raise_fragile(choice, budget)
    dev, accepted = search.lower_to_int4(choice, dev, budget, progress)
    batch_num = len(calibration_data)
    int8_cfg = Path(workdir, "all_int8.cfg")
    int8_cfg.write_text(calibration_cfg_text({n: "INT8" for n in search.types}, batch_num))
    int8_files, _ = run_cfg(model, input_data, calibration_data, int8_cfg, workdir, "int8", io)
    int8_dev = deviation(ort_outputs(int8_files["deploy"], eval_data), search.reference, eval_labels)
    cfg_file = Path(workdir, "mixed_precision.cfg")
    while True:
        cfg_file.write_text(calibration_cfg_text(choice, batch_num))
        files, calibration = run_cfg(model, input_data, calibration_data, cfg_file, workdir, "mixed", io)
        deployed = deviation(ort_outputs(files["deploy"], eval_data), search.reference, eval_labels)
        if budget.met(deployed) or not accepted:
            break
        choice[accepted.pop()] = "INT8"  # the deploy model missed: undo the last INT4 step
        search.steps.append({"layer": "(verify)", "to": "undo INT4", "damage": deployed.damage, "accepted": True})
        dev = search.measure(choice)
    sizes = {
        "deploy": files["deploy"],
        "ascend_deploy": files["ascend_deploy"],
        "int8_deploy": int8_files["deploy"],
        "int8_ascend_deploy": int8_files["ascend_deploy"],
    }
    return MixedPrecisionResult(
        precisions=choice,
        weight_bytes=search.size(choice),
        int8_weight_bytes=search.size({n: "INT8" for n in search.types}),
        searched=dev,
        deployed=deployed,
        int8_deployed=int8_dev,
        cfg_file=str(cfg_file),
        files=files,
        file_bytes={k: os.path.getsize(v) for k, v in sizes.items()},
        steps=search.steps,
        model=calibration,
    )


class _Search:
    """The search's state: every layer calibrated at each precision once, composed onto the BN-folded float
    model to measure a choice (layer -> precision) against the FP32 outputs; `steps` records every move."""

    def __init__(self, model, input_data, calibration_data, eval_data, eval_labels, candidates) -> None:
        self.types = layer_types(model, input_data)
        self.candidates, self.eval_data, self.eval_labels = candidates, eval_data, eval_labels
        self.wrappers, self.paths = {}, {}
        for p in (p for p in ("INT4", "INT8", "INT16") if p in candidates or p == "INT8"):
            calibration = calibrate(model, input_data, calibration_data, {n: PRECISIONS[p] for n in self.types})
            for path, wrapper in quant_layers(calibration).items():
                self.wrappers[(wrapper.layer_name, p)], self.paths[wrapper.layer_name] = wrapper, path
        self.base = float_twin(calibration)
        self.reference = outputs(self.base, eval_data)
        self.weights = {n: c[1] for n, c in layer_costs(self.base, input_data, self.types).items()}
        self.steps: list[dict] = []

    def measure(self, choice: dict[str, str]) -> Deviation:
        layers = {self.paths[n]: self.wrappers[(n, p)] for n, p in choice.items() if p != "FP32"}
        with swapped(self.base, layers) as mixed:
            return deviation(outputs(mixed, self.eval_data), self.reference, self.eval_labels)

    def size(self, choice: dict[str, str]) -> float:
        return sum(self.weights[n] * WEIGHT_BYTES[p] for n, p in choice.items())

    def raise_fragile(self, choice: dict[str, str], budget: Budget) -> Deviation:
        """Raise layers' precision, the most fragile first, until the budget is met (in place); the deviation."""
        dev = self.measure(choice)
        single = {n: self.measure({n: "INT8"}).damage for n in self.types}
        for name in sorted(self.types, key=lambda n: -single[n]):
            while not budget.met(dev) and choice[name] != RAISE_ORDER[-1]:
                step = RAISE_ORDER[RAISE_ORDER.index(choice[name]) + 1]
                if step not in self.candidates:
                    break
                choice[name] = step
                dev = self.measure(choice)
                self.steps.append({"layer": name, "to": step, "damage": dev.damage, "accepted": True})
        return dev

    def lower_to_int4(self, choice, dev: Deviation, budget: Budget, progress) -> tuple[Deviation, list[str]]:
        """Try each INT8 layer at INT4, the least damage per byte saved first, keeping those the budget allows."""
        lower = []
        if "INT4" in self.candidates:
            damage = {n: self.measure({n: "INT4"}).damage for n in self.types if choice[n] == "INT8"}
            weights = self.weights
            lower = sorted(damage, key=lambda n: max(damage[n], 0.0) / (weights[n] * 0.5) - 1e-12 * weights[n])
        accepted = []
        for done, name in enumerate(lower, 1):
            trial = dict(choice, **{name: "INT4"})
            trial_dev = self.measure(trial)
            ok = budget.met(trial_dev)
            self.steps.append({"layer": name, "to": "INT4", "damage": trial_dev.damage, "accepted": ok})
            if ok:
                choice[name], dev = "INT4", trial_dev
                accepted.append(name)
            if progress is not None:
                progress(done, len(lower))
        return dev, accepted
