"""The example models the demo, the samples, the tests and the benchmark train."""

from __future__ import annotations

import torch
from torch import nn


class SmallFashionCnn(nn.Module):
    """conv(1→16)-bn-relu-maxpool, conv(16→32, stride 2)-bn-relu, linear(1568→10); 20,586 params.

    Sized for 1x28x28 inputs (Fashion-MNIST). One epoch of Adam(2e-3), batch 128 reaches ~0.88 test
    accuracy (docs/spec/offline-assets.md, "Fashion-MNIST").
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu1 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu2 = nn.ReLU()
        self.fc = nn.Linear(32 * 7 * 7, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu1(self.bn1(self.conv1(x))))
        x = self.relu2(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))


class FashionCnn459k(nn.Module):
    """conv32-conv64-conv64 (3x3, BN, ReLU; max-pool after the first two) + FC128 + FC10: 459k parameters.

    The larger Fashion-MNIST CNN of the benchmarks (deploy speed, pruning recipes): wide enough that pruning
    half its channels leaves real capacity to choose between, unlike SmallFashionCnn's 16/32.
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]

        self.features = nn.Sequential(*block(1, 32), nn.MaxPool2d(2), *block(32, 64), nn.MaxPool2d(2), *block(64, 64))
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(torch.flatten(self.features(x), 1))))
