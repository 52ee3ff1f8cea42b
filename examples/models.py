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
