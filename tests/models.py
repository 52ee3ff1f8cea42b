"""Small test models shared by the test suite (``from tests.models import ConvBnReluNet``).

Each class pins one graph shape the engine must handle; keep them tiny so tests stay fast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvBnReluNet(nn.Module):
    """conv1→bn→relu→conv2→bn2→relu2→flatten→fc; input [N, 1, 28, 28]."""

    input_shape = (1, 1, 28, 28)

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.relu2 = nn.ReLU()
        self.fc = nn.Linear(16 * 14 * 14, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn(self.conv1(x)))
        x = self.relu2(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs with BN, a residual add, and its ReLU module used twice."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            conv = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
            self.downsample = nn.Sequential(conv, nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + identity)


class TinyResNet(nn.Module):
    """Stem conv/bn/relu, two stages of basic blocks (paths like ``layer1.0.conv1``), pool, fc.

    Input [N, 3, 16, 16].
    """

    input_shape = (1, 3, 16, 16)

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 8))
        self.layer2 = nn.Sequential(BasicBlock(8, 16, stride=2))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class ReusedModuleNet(nn.Module):
    """``conv`` is called twice (reused); ``head`` once. Input [N, 4, 8, 8]."""

    input_shape = (1, 4, 8, 8)

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.relu(self.conv(self.conv(x))))


class SharedWeightNet(nn.Module):
    """``fc_a`` and ``fc_b`` hold the same weight Parameter; ``fc_out`` is independent. Input [N, 8]."""

    input_shape = (1, 8)

    def __init__(self) -> None:
        super().__init__()
        self.fc_a = nn.Linear(8, 8)
        self.fc_b = nn.Linear(8, 8)
        self.fc_b.weight = self.fc_a.weight
        self.fc_out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(torch.relu(self.fc_b(self.fc_a(x))))


class DataDependentNet(nn.Module):
    """Branches on the values of a tensor: neither fx nor the TorchScript converter can capture it."""

    input_shape = (1, 1, 8, 8)

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if x.sum() > 0:
            y = y * 2
        return y


class ShapeBranchNet(nn.Module):
    """Branches on an input *shape*: fx cannot trace it, torch.export specialises it."""

    input_shape = (1, 3, 8, 8)

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.conv(x))
        if y.shape[-1] > 4:
            y = F.avg_pool2d(y, 2)
        return self.fc(y.mean(dim=(2, 3)))


class TwoInputNet(nn.Module):
    """forward(x, y): two conv branches joined by an add, then a linear head. Inputs [N,3,8,8] twice."""

    input_shape = (1, 3, 8, 8)

    def __init__(self) -> None:
        super().__init__()
        self.conv_x = nn.Conv2d(3, 4, 3, padding=1)
        self.conv_y = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 8 * 8, 5)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = F.relu(self.conv_x(x)) + self.conv_y(y)
        return self.fc(z.flatten(1))


class ExclusionNet(nn.Module):
    """One layer for each docs/spec/engine.md §4.9 exclusion next to supported layers. Input [N, 2, 6, 6, 6]."""

    input_shape = (1, 2, 6, 6, 6)

    def __init__(self) -> None:
        super().__init__()
        self.conv3d_ok = nn.Conv3d(2, 2, 3, padding=1)
        self.conv3d_dilated = nn.Conv3d(2, 2, 3, padding=2, dilation=2)
        self.conv3d_reflect = nn.Conv3d(2, 2, 3, padding=1, padding_mode="reflect")
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv3d_reflect(self.conv3d_dilated(self.conv3d_ok(x)))
        return self.fc(x.mean(dim=(2, 3, 4)))


class ActivationsNet(nn.Module):
    """Conv/Linear chains ending in each distill activation, plus a functional relu. Input [N, 2, 6, 6]."""

    input_shape = (1, 2, 6, 6)

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 3, padding=1)
        self.act1 = nn.LeakyReLU(0.2)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(4)
        self.act2 = nn.Sigmoid()
        self.conv3 = nn.Conv2d(4, 4, 3, padding=1)
        self.fc1 = nn.Linear(4, 6)
        self.act3 = nn.Tanh()
        self.fc2 = nn.Linear(6, 3)
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act2(self.bn2(self.conv2(self.act1(self.conv1(x)))))
        x = F.relu(self.conv3(x))
        x = self.act3(self.fc1(x.mean(dim=(2, 3))))
        return self.softmax(self.fc2(x))


class LayerZooNet(nn.Module):
    """Every layer kind the rebuild lifts, with non-default attributes. Input [N, 2, 8, 8]."""

    input_shape = (1, 2, 8, 8)

    def __init__(self) -> None:
        super().__init__()
        self.deconv = nn.ConvTranspose2d(2, 4, 3, stride=2, padding=1, output_padding=1, bias=False)
        self.same = nn.Conv2d(4, 4, 3, padding="same", dilation=2, groups=2)
        self.relu6 = nn.ReLU6()
        self.conv1d = nn.Conv1d(4, 6, 5, stride=2, padding=2)
        self.bn1d = nn.BatchNorm1d(6, eps=1e-3, momentum=0.3)
        self.conv3d = nn.Conv3d(1, 2, (1, 3, 3), padding=(0, 1, 1))
        self.bn3d = nn.BatchNorm3d(2)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(6 + 2, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu6(self.same(self.deconv(x)))  # [N, 4, 16, 16]
        seq = self.bn1d(self.conv1d(y.flatten(2)))  # [N, 6, 128]
        vol = self.bn3d(self.conv3d(y[:, :1].unsqueeze(1)))  # [N, 2, 1, 16, 16]
        feats = torch.cat([seq.mean(dim=2), vol.mean(dim=(2, 3, 4))], dim=1)
        return self.fc(self.drop(feats))


def example_input(model_cls: type[nn.Module], batch: int = 2, seed: int = 0) -> torch.Tensor:
    """A random input of the model's documented shape with the given batch size."""
    shape = (batch, *model_cls.input_shape[1:])
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


class BranchesNet(nn.Module):
    """Two convs read one ReLU output: their activation quantisers are shared (docs/spec/engine.md §4.8)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 1)
        self.relu = nn.ReLU()
        self.branch1 = nn.Conv2d(4, 4, 3, padding=1)
        self.branch2 = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        y = self.relu(self.stem(x))
        return self.branch1(y) + self.branch2(y)
