"""How long graph capture takes on a ResNet-50-sized model, against AMCT's way (ONNX export + load).

Run: ``.venv/bin/python bench/capture.py [--repeats 3] [--no-dynamo]``. Prints the median seconds of:
our capture from the nn.Module, our capture from a traced TorchScript file, and
``torch.onnx.export`` (TorchScript exporter, and the dynamo exporter unless disabled) + ``onnx.load``.
"""

from __future__ import annotations

import argparse
import io
import logging
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import onnx
import torch
from torch import nn

from amct_engine.graph.analysis import distill_groups, quantizable_layers
from amct_engine.graph.capture import capture_model


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            conv = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
            self.downsample = nn.Sequential(conv, nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + identity)


class ResNet50(nn.Module):
    """torchvision's resnet50 layout (25.6 M parameters), written out so the bench needs no torchvision."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        cin = 64
        for i, (width, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)], 1):
            layers = []
            for b in range(blocks):
                layers.append(Bottleneck(cin, width, stride if b == 0 else 1))
                cin = width * Bottleneck.expansion
            setattr(self, f"layer{i}", nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def onnx_export_and_load(model: nn.Module, x: torch.Tensor, dynamo: bool) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            program = torch.onnx.export(model, (x,), dynamo=True, verbose=False)
            program.save(buffer)
        else:
            torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17)
    return onnx.load_from_string(buffer.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-dynamo", action="store_true", help="skip the dynamo ONNX exporter")
    args = parser.parse_args()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed" per export

    torch.manual_seed(0)
    model = ResNet50().eval()
    x = torch.randn(1, 3, 224, 224)
    with tempfile.TemporaryDirectory() as tmp:
        ts_path = Path(tmp) / "resnet50_traced.pt"
        torch.jit.save(torch.jit.trace(model, (x,)), str(ts_path))

        cm = capture_model(ts_path, x)  # also a warm-up of the converter
        reference = capture_model(model, x)
        same = distill_groups(cm) == distill_groups(reference)
        print(f"ResNet-50: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
              f"{len(quantizable_layers(reference))} quantizable layers; "
              f"TorchScript rebuild gives the same distill groups: {same}")

        rows = [
            ("capture_model(nn.Module)  [torch.fx]", lambda: capture_model(model, x)),
            ("capture_model(traced TorchScript file)", lambda: capture_model(ts_path, x)),
            ("torch.onnx.export(dynamo=False) + onnx.load", lambda: onnx_export_and_load(model, x, False)),
        ]
        if not args.no_dynamo:
            rows.append(("torch.onnx.export(dynamo=True) + onnx.load",
                         lambda: onnx_export_and_load(model, x, True)))
        for label, fn in rows:
            try:
                print(f"{label:<48} median {median_seconds(fn, args.repeats):7.3f} s  ({args.repeats} runs)")
            except Exception as exc:  # the dynamo exporter is optional: report, do not stop
                print(f"{label:<48} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")


if __name__ == "__main__":
    main()
