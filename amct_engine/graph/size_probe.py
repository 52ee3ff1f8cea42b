"""Run a model at other sizes along its dynamic axes and compare it with a reference (docs/spec/engine.md §1.8).

A captured graph or an exported file can bake a size of the example into itself and still run at that
size; only a run at another size shows it. This module makes such runs: it groups the dynamic axes of
the inputs (`seq` of `input_ids` and of `attention_mask` change together), picks two other sizes per
group, builds inputs at those sizes from the example, and compares a candidate (an onnxruntime session,
a captured graph) with a reference (the PyTorch model it came from). Used by the export check of every
ONNX file (export/size_checks.py) and by the upload check of the service.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils._pytree import tree_leaves

from amct_engine.graph.errors import GraphCaptureError, first_line

# A file agrees with its reference at another size when its relative error there is at most this, or
# at most AGREEMENT_FACTOR times its error at the example (a quantised file is not exact anywhere).
# A size baked into a graph gives errors of the order of the outputs themselves, or no run at all.
AGREEMENT_FLOOR, AGREEMENT_FACTOR = 0.05, 4.0
# torch.onnx's name for an axis given by index only: `<input>_dynamic_axes_<n>`.
_AUTO_NAME = "_dynamic_axes_"


class DynamicAxisError(RuntimeError):
    """A model or file that declares an axis dynamic does not run, or computes something else, at another
    size there. The message names the axis, the inputs it belongs to and the size."""


@dataclass(frozen=True)
class AxisGroup:
    """One dynamic axis: the (input index, axis) pairs that take its size together, and its example size."""

    name: str
    members: tuple[tuple[int, int], ...]
    size: int

    @property
    def is_batch(self) -> bool:
        return any(axis == 0 for _, axis in self.members)

    def describe(self, input_names: Sequence[str]) -> str:
        where = ", ".join(f"axis {axis} of {_input_name(input_names, i)}" for i, axis in self.members)
        return f"dynamic axis '{self.name}' ({where})"


def _input_name(names: Sequence[str], index: int) -> str:
    return f"'{names[index]}'" if index < len(names) else f"input {index}"


def axis_groups(example: Sequence[torch.Tensor], named_axes: Sequence[dict[int, str]]) -> list[AxisGroup]:
    """The dynamic axes of `example`'s inputs (`named_axes[i]`: axis -> name for input i) as groups: one per
    name; unnamed axes (torch.onnx's auto names) group by axis index and example size."""
    members: dict[str, list[tuple[int, int]]] = {}
    for index, axes in enumerate(named_axes):
        if index >= len(example):
            break
        for axis, name in sorted(axes.items()):
            if axis >= example[index].dim():
                continue
            key = f"axis{axis}:{example[index].shape[axis]}" if _AUTO_NAME in name else name
            members.setdefault(key, []).append((index, axis))
    groups = []
    for key, pairs in members.items():
        index, axis = pairs[0]
        groups.append(AxisGroup(key, tuple(pairs), int(example[index].shape[axis])))
    return groups


def candidate_sizes(group: AxisGroup) -> list[int]:
    """Other sizes to try, best first: a batch of one and a small odd batch; half and twice a length."""
    n = group.size
    wanted = [1, 3, 2, 5] if group.is_batch else [n // 2, 2 * n, n - 1, n + 1]
    sizes = []
    for s in wanted:
        if s >= 1 and s != n and s not in sizes:
            sizes.append(s)
    return sizes


def resized(example: Sequence[torch.Tensor], group: AxisGroup, size: int) -> tuple[torch.Tensor, ...]:
    """`example` with `group`'s axes at `size`: cut, or cycled with seeded noise on float copies (so that
    repeated rows still differ and rows mixed up by a baked shape show)."""
    out = list(example)
    generator = torch.Generator().manual_seed(size)
    for index, axis in group.members:
        x = out[index]
        picked = x.index_select(axis, torch.arange(size) % x.shape[axis])
        if size > x.shape[axis] and picked.is_floating_point():
            copies = (torch.arange(size) // x.shape[axis]).to(picked.dtype)
            shape = [1] * picked.dim()
            shape[axis] = size
            noise = torch.randn(picked.shape, generator=generator).to(picked.dtype)
            scale = float(x.float().std()) if x.numel() > 1 else 1.0
            picked = picked + 0.1 * scale * noise * (copies.reshape(shape) > 0)
        out[index] = picked
    return tuple(out)


def leaves_as_arrays(outputs) -> list[np.ndarray]:
    """A forward result (tensor, tuple, dict, nested) as the list of its tensors in ONNX output order."""
    return [t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t) for t in tree_leaves(outputs)]


def relative_error(expected: list[np.ndarray], actual: list[np.ndarray]) -> float:
    """The largest relative L2 error over the float outputs; inf when shapes or counts differ."""
    if len(expected) != len(actual):
        return math.inf
    worst = 0.0
    for e, a in zip(expected, actual, strict=True):
        if e.shape != a.shape:
            return math.inf
        if not np.issubdtype(e.dtype, np.floating):
            continue
        e64, a64 = e.astype(np.float64), a.astype(np.float64)
        scale = max(float(np.linalg.norm(e64)), 1e-6 * math.sqrt(max(e.size, 1)))
        worst = max(worst, float(np.linalg.norm(a64 - e64)) / scale)
    return worst


Runner = Callable[[tuple[torch.Tensor, ...]], list[np.ndarray]]


def torch_runner(model: torch.nn.Module) -> Runner:
    """The model in eval mode on its own device (every module's mode restored after each run)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))

    def run(inputs: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
        modes = [(m, m.training) for m in model.modules()]
        try:
            with torch.no_grad():
                return leaves_as_arrays(model.eval()(*(t.to(device) for t in inputs)))
        finally:
            for m, training in modes:
                m.training = training

    return run


def probe_dynamic_axes(
    reference: Runner,
    candidate: Runner,
    example: Sequence[torch.Tensor],
    groups: Sequence[AxisGroup],
    input_names: Sequence[str] = (),
    what: str = "the exported file",
    sizes_per_axis: int = 2,
) -> dict[str, list[int]]:
    """Run `candidate` and `reference` at `sizes_per_axis` other sizes of every group and compare them;
    returns group name -> the sizes checked. Raises DynamicAxisError naming the axis when the candidate
    fails or disagrees at a size the reference runs at, or when the reference runs at no other size."""
    example = tuple(example)
    baseline = relative_error(reference(example), candidate(example))
    allowed = max(AGREEMENT_FLOOR, AGREEMENT_FACTOR * baseline)
    checked: dict[str, list[int]] = {}
    for group in groups:
        label = group.describe(input_names)
        sizes: list[int] = []
        for size in candidate_sizes(group):
            if len(sizes) == sizes_per_axis:
                break
            inputs = resized(example, group, size)
            try:
                expected = reference(inputs)
            except GraphCaptureError as exc:  # the captured graph itself fixed the axis (graph/symbolic_sizes.py)
                raise DynamicAxisError(f"{what} declares {label}, but {exc}") from exc
            except Exception:  # the model does not take this size (a pooling pyramid's multiple of 32)
                continue
            try:
                actual = candidate(inputs)
            except GraphCaptureError as exc:
                raise DynamicAxisError(f"{what} declares {label}, but {exc}") from exc
            except Exception as exc:
                raise DynamicAxisError(
                    f"{what} fails at size {size} of {label} (example size {group.size}): {first_line(exc)}"
                ) from exc
            error = relative_error(expected, actual)
            if not error <= allowed:
                raise DynamicAxisError(
                    f"{what} computes something else than the model at size {size} of {label} (relative "
                    f"error {error:.3g}, {baseline:.3g} at the example size {group.size}): a size of the example "
                    "is baked into it"
                )
            sizes.append(size)
        if not sizes:
            raise DynamicAxisError(
                f"{what} declares {label}, but its PyTorch model runs at no other size "
                f"there than {group.size} (tried {candidate_sizes(group)})"
            )
        checked[group.name] = sizes
    return checked
