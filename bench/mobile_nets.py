"""The mobile CNN layouts people deploy, written out so the benchmarks need no torchvision (issue 37):
MobileNetV2 (ReLU6, depthwise, residual adds), MobileNetV3-Large (hardswish, squeeze-excite with
hardsigmoid gates), EfficientNet-B0 (SiLU, squeeze-excite with sigmoid gates), MTCNN's ONet (PReLU, three
outputs) and a YOLO-style detector (SiLU, split/concat blocks, SPPF max-pools, nearest upsampling, three
outputs). Random weights: bench/deploy_speed.py times them, it does not score them."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

Activation = Callable[[], nn.Module]


def _divisible(value: float, divisor: int = 8) -> int:
    """torchvision's `_make_divisible`: channel counts rounded to multiples of 8, never 10 % below."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class ConvBnAct(nn.Sequential):
    def __init__(
        self, cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1, act: Activation | None = None
    ):
        layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False)]
        layers.append(nn.BatchNorm2d(cout))
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class SqueezeExcite(nn.Module):
    """Global pool -> 1x1 conv -> activation -> 1x1 conv -> gate, the gate multiplying the input."""

    def __init__(self, channels: int, squeezed: int, act: Activation, gate: Activation) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.act = nn.Conv2d(channels, squeezed, 1), act()
        self.fc2, self.gate = nn.Conv2d(squeezed, channels, 1), gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))


class InvertedResidual(nn.Module):
    """Expand (1x1) -> depthwise (kxk) -> [squeeze-excite] -> project (1x1, no activation) [+ input]."""

    def __init__(self, cin: int, expanded: int, cout: int, k: int, stride: int, act: Activation, se=None) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(ConvBnAct(cin, expanded, 1, act=act))
        layers.append(ConvBnAct(expanded, expanded, k, stride, groups=expanded, act=act))
        if se is not None:
            layers.append(se(expanded))
        layers.append(ConvBnAct(expanded, cout, 1))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    """torchvision's mobilenet_v2 layout (ReLU6), 1000 classes: 3.5 M parameters."""

    SETTINGS = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [ConvBnAct(3, 32, 3, 2, act=nn.ReLU6)]
        cin = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, cin * t, c, 3, s if i == 0 else 1, nn.ReLU6))
                cin = c
        layers.append(ConvBnAct(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class MobileNetV3Large(nn.Module):
    """torchvision's mobilenet_v3_large layout (hardswish, hardsigmoid SE gates), 1000 classes: 5.5 M parameters."""

    # kernel, expanded, out, squeeze-excite, hardswish (else ReLU), stride
    SETTINGS = (
        (3, 16, 16, False, False, 1),
        (3, 64, 24, False, False, 2),
        (3, 72, 24, False, False, 1),
        (5, 72, 40, True, False, 2),
        (5, 120, 40, True, False, 1),
        (5, 120, 40, True, False, 1),
        (3, 240, 80, False, True, 2),
        (3, 200, 80, False, True, 1),
        (3, 184, 80, False, True, 1),
        (3, 184, 80, False, True, 1),
        (3, 480, 112, True, True, 1),
        (3, 672, 112, True, True, 1),
        (5, 672, 160, True, True, 2),
        (5, 960, 160, True, True, 1),
        (5, 960, 160, True, True, 1),
    )

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [ConvBnAct(3, 16, 3, 2, act=nn.Hardswish)]
        cin = 16
        for k, expanded, cout, se, hardswish, stride in self.SETTINGS:
            act = nn.Hardswish if hardswish else nn.ReLU
            gate = (lambda c: SqueezeExcite(c, _divisible(c // 4), nn.ReLU, nn.Hardsigmoid)) if se else None
            layers.append(InvertedResidual(cin, expanded, cout, k, stride, act, gate))
            cin = cout
        layers.append(ConvBnAct(cin, 960, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(960, 1280), nn.Hardswish(), nn.Linear(1280, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class EfficientNetB0(nn.Module):
    """torchvision's efficientnet_b0 layout (SiLU, sigmoid SE gates, no stochastic depth), 1000 classes: 5.3 M
    parameters."""

    # expand ratio, kernel, stride, out, repeats
    SETTINGS = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3))
    SETTINGS += ((6, 5, 2, 192, 4), (6, 3, 1, 320, 1))

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [ConvBnAct(3, 32, 3, 2, act=nn.SiLU)]
        cin = 32
        for t, k, s, cout, n in self.SETTINGS:
            for i in range(n):
                squeezed = max(1, cin // 4)
                se = lambda c, sq=squeezed: SqueezeExcite(c, sq, nn.SiLU, nn.Sigmoid)  # noqa: E731
                layers.append(InvertedResidual(cin, cin * t, cout, k, s if i == 0 else 1, nn.SiLU, se))
                cin = cout
        layers.append(ConvBnAct(cin, 1280, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class ONet(nn.Module):
    """MTCNN's output network (48x48 faces, PReLU): face score, box offsets and five landmarks."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3), nn.PReLU(32), nn.MaxPool2d(3, 2, ceil_mode=True),
            nn.Conv2d(32, 64, 3), nn.PReLU(64), nn.MaxPool2d(3, 2, ceil_mode=True),
            nn.Conv2d(64, 64, 3), nn.PReLU(64), nn.MaxPool2d(2, 2, ceil_mode=True),
            nn.Conv2d(64, 128, 2), nn.PReLU(128),
        )  # fmt: skip
        self.dense = nn.Sequential(nn.Linear(1152, 256), nn.PReLU(256))
        self.score, self.box, self.landmarks = nn.Linear(256, 2), nn.Linear(256, 4), nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = self.dense(torch.flatten(self.features(x), 1))
        return torch.softmax(self.score(y), dim=1), self.box(y), self.landmarks(y)


class C2f(nn.Module):
    """YOLOv8's block: a 1x1 conv, its output split in two, bottlenecks on one half, all halves concatenated."""

    def __init__(self, cin: int, cout: int, n: int) -> None:
        super().__init__()
        self.half = cout // 2
        self.stem = ConvBnAct(cin, cout, 1, act=nn.SiLU)
        self.blocks = nn.ModuleList(
            nn.Sequential(
                ConvBnAct(self.half, self.half, 3, act=nn.SiLU), ConvBnAct(self.half, self.half, 3, act=nn.SiLU)
            )
            for _ in range(n)
        )
        self.out = ConvBnAct((2 + n) * self.half, cout, 1, act=nn.SiLU)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.stem(x).split(self.half, dim=1))
        for block in self.blocks:
            parts.append(parts[-1] + block(parts[-1]))
        return self.out(torch.cat(parts, dim=1))


class Sppf(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max-pools concatenated with their input."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.reduce = ConvBnAct(channels, channels // 2, 1, act=nn.SiLU)
        self.pool = nn.MaxPool2d(5, 1, 2)
        self.out = ConvBnAct(channels * 2, channels, 1, act=nn.SiLU)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.reduce(x)
        b = self.pool(a)
        c = self.pool(b)
        return self.out(torch.cat([a, b, c, self.pool(c)], dim=1))


class YoloStyle(nn.Module):
    """A YOLOv8-n-sized detector: C2f backbone, SPPF, an upsampling neck, three heads (strides 8, 16, 32),
    each of 4 box + 80 class channels."""

    def __init__(self, classes: int = 80, width: int = 16) -> None:
        super().__init__()
        w = [width * m for m in (1, 2, 4, 8, 16)]
        self.stem = nn.Sequential(ConvBnAct(3, w[0], 3, 2, act=nn.SiLU), ConvBnAct(w[0], w[1], 3, 2, act=nn.SiLU))
        self.p3 = nn.Sequential(C2f(w[1], w[1], 1), ConvBnAct(w[1], w[2], 3, 2, act=nn.SiLU), C2f(w[2], w[2], 2))
        self.p4 = nn.Sequential(ConvBnAct(w[2], w[3], 3, 2, act=nn.SiLU), C2f(w[3], w[3], 2))
        self.p5 = nn.Sequential(ConvBnAct(w[3], w[4], 3, 2, act=nn.SiLU), C2f(w[4], w[4], 1), Sppf(w[4]))
        self.up = nn.Upsample(scale_factor=2.0, mode="nearest")
        self.neck4 = C2f(w[4] + w[3], w[3], 1)
        self.neck3 = C2f(w[3] + w[2], w[2], 1)
        self.heads = nn.ModuleList(
            nn.Sequential(ConvBnAct(c, c, 3, act=nn.SiLU), nn.Conv2d(c, 4 + classes, 1)) for c in (w[2], w[3], w[4])
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        p3 = self.p3(self.stem(x))
        p4 = self.p4(p3)
        p5 = self.p5(p4)
        n4 = self.neck4(torch.cat([self.up(p5), p4], dim=1))
        n3 = self.neck3(torch.cat([self.up(n4), p3], dim=1))
        h3, h4, h5 = (head(f) for head, f in zip(self.heads, (n3, n4, p5), strict=True))
        return h3, h4, h5


# name -> (constructor, input shape of one sample)
MOBILE_NETS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "mobilenet_v2": (MobileNetV2, (3, 224, 224)),
    "mobilenet_v3": (MobileNetV3Large, (3, 224, 224)),
    "efficientnet_b0": (EfficientNetB0, (3, 224, 224)),
    "onet": (ONet, (3, 48, 48)),
    "yolo": (YoloStyle, (3, 320, 320)),
}
