"""The torch.nn module an aten call stands for (graph/lifting.py): a conv, a linear, a batch norm on the call's
parameters, or an activation or dropout of a known module, with the attributes the call's arguments give."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx, nn

_INPLACE_CLASSES = frozenset({"ReLU", "ReLU6", "Hardtanh", "LeakyReLU", "Dropout", "Dropout2d", "Dropout3d"})
_CONV_BY_DIM = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_CONV_TRANSPOSE_BY_DIM = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
_BN_BY_RANK = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}


def _ntuple(value: Any, n: int) -> Any:
    # aten lists may be shortened to one element ([1] for stride 1); nn modules want one per dim
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    return value * n if len(value) == 1 else value


def conv_module(args: dict, name: str, weight: nn.Parameter | None, bias: nn.Parameter | None) -> nn.Module | None:
    """nn.Conv*d / nn.ConvTranspose*d of an aten conv call (`name`: its op) on these parameters."""
    if weight is None or args.get("input") is None:
        return None
    dims = weight.dim() - 2
    transposed = bool(args.get("transposed", False)) or name.startswith("conv_transpose")
    groups = int(args.get("groups", 1))
    if transposed:
        cin, cout = weight.shape[0], weight.shape[1] * groups
    else:
        cin, cout = weight.shape[1] * groups, weight.shape[0]
    classes = _CONV_TRANSPOSE_BY_DIM if transposed else _CONV_BY_DIM
    cls = classes.get(dims)
    if cls is None:
        return None
    kw = dict(
        stride=_ntuple(args.get("stride", 1), dims),
        padding=_ntuple(args.get("padding", 0), dims),
        dilation=_ntuple(args.get("dilation", 1), dims),
        groups=groups,
    )
    if transposed:
        kw["output_padding"] = _ntuple(args.get("output_padding", 0), dims)
    conv = cls(cin, cout, tuple(weight.shape[2:]), bias=bias is not None, device="meta", **kw)
    conv.weight = weight
    if bias is not None:
        conv.bias = bias
    return conv


def linear_module(weight: nn.Parameter | None, bias: nn.Parameter | None) -> nn.Module | None:
    if weight is None or weight.dim() != 2:
        return None
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    linear.weight = weight
    if bias is not None:
        linear.bias = bias
    return linear


def batch_norm_module(args: dict, weight, bias, mean, var, batches_tracked) -> nn.Module | None:
    """nn.BatchNorm*d of an aten batch-norm call: its affine parameters, running statistics and counter."""
    ref = weight if weight is not None else mean
    if ref is None:
        return None
    rank = _rank(args["input"])
    cls = _BN_BY_RANK.get(rank, nn.BatchNorm2d)
    bn = cls(
        ref.shape[0],
        eps=float(args["eps"]),
        momentum=float(args["momentum"]),
        affine=weight is not None,
        track_running_stats=mean is not None,
        device="meta",
    )
    if weight is not None:
        bn.weight, bn.bias = weight, bias
    if mean is not None:
        bn.running_mean, bn.running_var = mean, var
        bn.num_batches_tracked = batches_tracked
    return bn


def _rank(node: Any) -> int | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val.dim() if isinstance(val, torch.Tensor) else None


def stateless_module(class_name: str, args: dict, inplace: bool) -> nn.Module | None:
    if inplace and class_name not in _INPLACE_CLASSES:
        return None  # an in-place sigmoid_/tanh_ has no module form that keeps its semantics
    if class_name == "ReLU":
        return nn.ReLU(inplace=inplace)
    if class_name == "ReLU6":
        six = (float(args.get("min_val", 0.0)), float(args.get("max_val", 6.0))) == (0.0, 6.0)
        return nn.ReLU6(inplace=inplace) if six else None
    if class_name == "Hardtanh":
        return nn.Hardtanh(float(args.get("min_val", -1.0)), float(args.get("max_val", 1.0)), inplace=inplace)
    if class_name == "LeakyReLU":
        return nn.LeakyReLU(float(args.get("negative_slope", 0.01)), inplace=inplace)
    if class_name == "Softmax":
        return nn.Softmax(dim=args["dim"]) if args.get("dtype") is None else None
    if class_name in ("Dropout", "Dropout2d", "Dropout3d"):
        return getattr(nn, class_name)(float(args["p"]), inplace=inplace)
    return {"Sigmoid": nn.Sigmoid, "Tanh": nn.Tanh}[class_name]()
