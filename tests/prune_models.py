"""Test models for pruning: each pins a graph shape the channel dependency graph must handle.

``PruneResNet`` is the issue's acceptance net: residual adds with identity and 1x1-downsample
shortcuts, a concat branch, a depthwise-separable block and a flatten→Linear head. The others port
the AMCT prune tests (docs/spec/engine.md §7.3) or pin one rule each.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ResidualBlock(nn.Module):
    """Two 3x3 conv/BN; the shortcut is the identity or a 1x1 conv + BN."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + identity)


class PruneResNet(nn.Module):
    """stem → identity block → downsample block → concat of two branches → depthwise-separable
    block → avgpool → flatten → Linear. Input [N, 3, 16, 16]."""

    input_shape = (2, 3, 16, 16)

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.relu = nn.ReLU()
        self.layer1 = ResidualBlock(32, 32)
        self.layer2 = ResidualBlock(32, 64, stride=2)
        self.branch_a = nn.Sequential(nn.Conv2d(64, 32, 1), nn.BatchNorm2d(32), nn.ReLU())
        self.branch_b = nn.Sequential(nn.Conv2d(64, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.dw = nn.Conv2d(64, 64, 3, padding=1, groups=64, bias=False)
        self.dw_bn = nn.BatchNorm2d(64)
        self.pw = nn.Conv2d(64, 32, 1, bias=False)
        self.pw_bn = nn.BatchNorm2d(32)
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(32 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        x = torch.cat([self.branch_a(x), self.branch_b(x)], dim=1)
        x = F.relu(self.dw_bn(self.dw(x)))
        x = F.relu(self.pw_bn(self.pw(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class EltwiseConv(nn.Module):
    """AMCT's EltwiseConv (docs/spec/engine.md §7.3): four grouped convs 16→160 (g=2) joined by adds, two g=2
    consumers 160→80, circular padding on layer1. Input [N, 16, 12, 12]."""

    input_shape = (1, 16, 12, 12)

    def __init__(self) -> None:
        super().__init__()

        def block(cin: int, cout: int, **kw) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, groups=2, **kw), nn.BatchNorm2d(cout))

        self.layer1 = block(16, 160, padding=1, padding_mode="circular")
        self.layer2 = block(16, 160, padding=1)
        self.layer3 = block(16, 160, padding=1)
        self.layer4 = block(16, 160, padding=1)
        self.layer5 = block(160, 80)
        self.layer6 = block(160, 80)

    def forward(self, x: torch.Tensor):
        x12 = self.layer1(x) + self.layer2(x)
        y1 = self.layer5(x12 + self.layer3(x))
        y2 = self.layer6(x12 + self.layer4(x))
        return y1, y2


class ConvToLinearOnLastDim(nn.Module):
    """AMCT's Conv2dLinear: a Linear over the conv output's last (width) axis. Input [N, 3, 16, 14]."""

    input_shape = (2, 3, 16, 14)

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1)
        self.bn = nn.BatchNorm2d(32)
        self.fc = nn.Linear(14, 8)
        self.head = nn.Linear(32 * 16 * 8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(self.bn(self.conv(x))).flatten(1))


class SliceNet(nn.Module):
    """A channel slice (unknown consumer) after conv1; conv2 feeds a plain head. Input [N, 4, 8, 8]."""

    input_shape = (2, 4, 8, 8)

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(4, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Conv2d(16, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x)[:, :8]
        return self.head(F.relu(self.conv2(y)))


class LinearStack(nn.Module):
    """Linear → BN1d → ReLU → Linear → Linear (AMCT's LinearIn2 without the MatMul quirk). Input [N, 16]."""

    input_shape = (4, 16)

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.bn = nn.BatchNorm1d(64)
        self.fc2 = nn.Linear(64, 32, bias=False)
        self.fc3 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.fc2(F.relu(self.bn(self.fc1(x)))))


class HardcodedViewNet(nn.Module):
    """``view(-1, 16 * 8 * 8)`` hard-codes conv2's channel count: pruning it breaks the forward.
    Input [N, 3, 8, 8]."""

    input_shape = (2, 3, 8, 8)

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 8 * 8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv2(F.relu(self.conv1(x)))
        return self.fc(x.view(-1, 16 * 8 * 8))


def example_input(model_cls: type[nn.Module], seed: int = 0) -> torch.Tensor:
    return torch.randn(model_cls.input_shape, generator=torch.Generator().manual_seed(seed))
