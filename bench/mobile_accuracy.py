"""Mobile CNN accuracy (issue 37): a trained inverted-residual net per activation family, FP32 against its
INT8 deploy models in onnxruntime.

The net (MobileNetV2/V3 and EfficientNet blocks in small: depthwise convs, squeeze-excite, residual adds)
is trained on the first 12,000 Fashion-MNIST training images (Adam 2e-3, batch 128, `--epochs`, seed 0),
once per family: SiLU with sigmoid gates (EfficientNet), hardswish with hardsigmoid gates (MobileNetV3),
ReLU6 (MobileNetV2). Then, from that FP32 base:

- ``ours PTQ``: `create_quant_retrain_model`, one calibration forward on 512 training images, the save
  (no training) for ``deploy_target=auto`` and for ``x86_avx2_u8u8`` (the record's 8-bit weights: the cost
  of AVX2's 7-bit weight codes, export.deploy_target, shows as the difference);
- ``ORT PTQ QDQ U8S8``: onnxruntime's `quantize_static` (after `quant_pre_process`, per-channel, MinMax)
  on the same 512 images;
- ``ours QAT`` (INT8 QAT, 1 epoch on the same 12,000 images, Adam 5e-4) against ``FP32 +1 epoch``, the same
  epoch in FP32 from the same base: like against like.

Top-1 of each ONNX file in onnxruntime on the 10,000 test images (`--quick`: 2,000). Run:
``python bench/mobile_accuracy.py [--quick] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if __package__ in (None, ""):  # run as a script: make `bench`, `examples` and `amct_engine` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import amct_engine as amct  # noqa: E402
from amct_engine.export.deploy_target import detect_deploy_target  # noqa: E402
from amct_engine.export.save import export_onnx  # noqa: E402
from bench.common import isa_flags, ort_accuracy  # noqa: E402
from bench.mobile_nets import ConvBnAct, InvertedResidual, SqueezeExcite  # noqa: E402
from bench.ort_ptq import quantize  # noqa: E402
from examples.fashion_mnist import load_fashion_mnist  # noqa: E402
from job_process.training import train_epochs  # noqa: E402

TRAIN_IMAGES, CALIBRATION_IMAGES, BATCH = 12_000, 512, 128
IO = {"input_names": ["x"], "output_names": ["logits"], "dynamic_axes": {"x": {0: "n"}, "logits": {0: "n"}}}
FAMILIES = {  # name -> (activation, squeeze-excite gate)
    "SiLU + sigmoid gates": (nn.SiLU, nn.Sigmoid),
    "hardswish + hardsigmoid gates": (nn.Hardswish, nn.Hardsigmoid),
    "ReLU6": (nn.ReLU6, nn.Hardsigmoid),
}


class SmallMobileNet(nn.Module):
    """Stem, five inverted residual blocks (the last two with squeeze-excite), a 1x1 head, pool, classifier."""

    def __init__(self, act, gate) -> None:
        super().__init__()
        se = lambda c: SqueezeExcite(c, c // 4, nn.ReLU, gate)  # noqa: E731
        self.features = nn.Sequential(
            ConvBnAct(1, 16, 3, 1, act=act),
            InvertedResidual(16, 64, 24, 3, 2, act),
            InvertedResidual(24, 72, 24, 3, 1, act),
            InvertedResidual(24, 96, 40, 5, 2, act, se),
            InvertedResidual(40, 120, 40, 5, 1, act, se),
            ConvBnAct(40, 128, 1, act=act),
        )
        self.classifier = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, seed: int) -> float:
    torch.manual_seed(seed)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)
    start = time.perf_counter()
    train_epochs(model, loader, epochs, lr, optimizer="adam")
    return time.perf_counter() - start


def ours(model: nn.Module, calibration: torch.Tensor, folder: Path, qat_data=None) -> dict[str, str]:
    """Our deploy files (auto and u8u8 targets): PTQ of `model`, or QAT on `qat_data` = (x, y, seed)."""
    config, record, example = folder / "config.json", folder / "record.txt", calibration[:2]
    model = copy.deepcopy(model).eval()
    amct.create_quant_retrain_config(str(config), model, example)
    qmodel = amct.create_quant_retrain_model(str(config), model, str(record), example)
    if qat_data is not None:
        train(qmodel, *qat_data)
    with torch.no_grad():
        qmodel.eval()(calibration)  # the eval forward calibrates the activation quantisers (the record)
    files = {}
    for target in ("auto", "x86_avx2_u8u8"):
        paths = amct.save_quant_retrain_model(
            str(config), qmodel, str(record), str(folder / target), example, deploy_target=target, **IO
        )
        files[target] = paths["deploy"]
    return files


def family_rows(name: str, data: dict[str, torch.Tensor], epochs: int, folder: Path) -> dict[str, Any]:
    act, gate = FAMILIES[name]
    torch.manual_seed(0)
    model = SmallMobileNet(act, gate)
    train_s = train(model, data["x"], data["y"], epochs, 2e-3, seed=0)
    model.eval()
    calibration = data["x"][:CALIBRATION_IMAGES]
    fp32 = str(folder / "fp32.onnx")
    export_onnx(model, fp32, (calibration[:2],), **IO)
    files = {"FP32": fp32}
    ptq = ours(model, calibration, folder / "ptq")
    files["ours PTQ (auto)"], files["ours PTQ (x86_avx2_u8u8)"] = ptq["auto"], ptq["x86_avx2_u8u8"]
    files["ORT PTQ QDQ U8S8"] = quantize(fp32, calibration.numpy(), folder / "ort_u8s8.onnx", 64, "QDQ", "U8")["onnx"]
    control = copy.deepcopy(model).train()
    train(control, data["x"], data["y"], 1, 5e-4, seed=1)
    files["FP32 +1 epoch"] = str(folder / "fp32_more.onnx")
    export_onnx(control.eval(), files["FP32 +1 epoch"], (calibration[:2],), **IO)
    qat = ours(model, calibration, folder / "qat", (data["x"], data["y"], 1, 5e-4, 1))
    files["ours QAT 1 epoch (auto)"] = qat["auto"]
    top1 = {label: ort_accuracy(path, data["x_test"], data["y_test"]) for label, path in files.items()}
    return {"family": name, "train_s": train_s, "top1": top1}


def run(quick: bool = False, epochs: int = 2) -> dict[str, Any]:
    x, y = load_fashion_mnist("train", limit=TRAIN_IMAGES)
    x_test, y_test = load_fashion_mnist("test", limit=2_000 if quick else None)
    data = {"x": x, "y": y, "x_test": x_test, "y_test": y_test}
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        families = [family_rows(name, data, epochs, Path(tmp) / str(i)) for i, name in enumerate(FAMILIES)]
    header = {"isa": isa_flags(), "deploy_target(auto)": detect_deploy_target(), "test_images": len(x_test)}
    return {"header": header, "epochs": epochs, "families": families}


def print_result(result: dict[str, Any]) -> None:
    print(f"ISA: {', '.join(result['header']['isa'])}; auto = {result['header']['deploy_target(auto)']}")
    for family in result["families"]:
        base = family["top1"]["FP32"]
        print(f"\n{family['family']} (trained in {family['train_s']:.0f} s)")
        for label, top1 in family["top1"].items():
            print(f"  {label:<28} {100 * top1:6.2f} %  ({100 * (top1 - base):+.2f} pt vs FP32)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 test images instead of 10,000")
    parser.add_argument("--epochs", type=int, default=2, help="FP32 training epochs of the base")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    result = run(args.quick, args.epochs)
    print_result(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
