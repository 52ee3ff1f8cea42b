"""Distillation groups over a ``CapturedModel`` (docs/spec/engine.md §6.1): the layers each distillation step trains
together, found in the graph or checked from a cfg's distill_group entries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import fx

from amct_engine.graph.analysis import (
    BN_TYPES,
    dedupe,
    describe_node,
    excluded_layers,
    is_module_of,
    module_type_name,
    quantizable_layers,
    single_consumer,
)
from amct_engine.graph.capture import CapturedModel
from amct_engine.layer_table import distill_type_names

DISTILL_BN_TYPES: tuple[str, ...] = ("BatchNorm2d",)


# ONNX Relu, LeakyRelu, Sigmoid, Tanh, Softmax (DISTILL_ACTIVATION_ONNX_TYPES) as modules
DISTILL_ACTIVATION_TYPES: tuple[str, ...] = ("ReLU", "LeakyReLU", "Sigmoid", "Tanh", "Softmax")


def _distill_module_types() -> tuple[str, ...]:
    return distill_type_names() + DISTILL_BN_TYPES + DISTILL_ACTIVATION_TYPES


def distill_groups(
    cm: CapturedModel,
    group_size: int = 1,
    user_groups: Iterable[Any] = (),
) -> list[list[str]]:
    """Distillation groups per docs/spec/engine.md §6.1, sorted by the position of each group's first module.

    ``user_groups`` holds (start, end) layer-name pairs, or objects with ``start_layer_name`` and
    ``end_layer_name`` (the cfg's ``distill_group``).
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    fixed = [_expand_user_group(cm, start, end) for start, end in _pairs(user_groups)]
    _check_disjoint(cm, fixed)
    taken = {name for group in fixed for name in group}
    groups = fixed + _cascade(_distill_units(cm, taken), group_size)
    if not groups:
        raise ValueError(
            "Not found distill group: the model has no Conv2d or Linear layer that can be "
            f"distilled (excluded: {excluded_layers(cm, distill_type_names()) or 'none'})"
        )
    return sorted(groups, key=lambda group: cm.position(group[0]))


def _distill_units(cm: CapturedModel, taken: set[str]) -> list[list[fx.Node]]:
    """docs/spec/engine.md §6.1 step 1: [layer, BatchNorm2d, activation], [layer, activation] or [layer]."""
    units = []
    for info in quantizable_layers(cm, distill_type_names()):
        if info.name in taken:
            continue
        unit = [cm.nodes_of(info.name)[0]]
        nxt = single_consumer(unit[-1])
        bn_ok = is_module_of(cm, nxt, DISTILL_BN_TYPES) and cm.call_count(nxt.target) == 1
        if bn_ok and nxt.target not in taken:
            unit.append(nxt)
            nxt = single_consumer(nxt)
        if is_module_of(cm, nxt, DISTILL_ACTIVATION_TYPES) and _free(cm, nxt.target, taken):
            unit.append(nxt)
        units.append(unit)
    return units


def _cascade(units: list[list[fx.Node]], group_size: int) -> list[list[str]]:
    """docs/spec/engine.md §6.1 step 2: join a unit to the next while its last node feeds only that unit's layer."""
    index_of_start = {unit[0]: i for i, unit in enumerate(units)}
    used: set[int] = set()
    groups = []
    for i in range(len(units)):  # units come in topological order of their layer
        if i in used:
            continue
        chain = [i]
        used.add(i)
        while len(chain) < group_size:
            j = index_of_start.get(single_consumer(units[chain[-1]][-1]))
            if j is None or j in used:
                break
            chain.append(j)
            used.add(j)
        groups.append(dedupe(node.target for k in chain for node in units[k]))
    return groups


def _expand_user_group(cm: CapturedModel, start: str, end: str) -> list[str]:
    """docs/spec/engine.md §6.1 step 3: the modules on the only route from ``start`` to ``end``."""
    label = f"Distill group {start} → {end}"
    for name in (start, end):
        if not cm.nodes_of(name):
            raise ValueError(f"{label}: layer '{name}' is not called in the model's forward (check the module path)")
    if cm.call_count(start) > 1:
        raise ValueError(f"{label}: the start layer '{start}' is reused (called {cm.call_count(start)} times)")
    route = _only_route(cm.nodes_of(start)[0], set(cm.nodes_of(end)), start, end)
    for node in route:
        if not is_module_of(cm, node, _distill_module_types()):
            raise ValueError(
                f"{label}: the route passes through {describe_node(cm, node)}, which is not one "
                f"of the distill module types {', '.join(_distill_module_types())}"
            )
        if is_module_of(cm, node, BN_TYPES) and cm.call_count(node.target) > 1:
            raise ValueError(
                f"{label}: the BatchNorm '{node.target}' on the route is reused "
                f"(called {cm.call_count(node.target)} times)"
            )
    return dedupe(node.target for node in route)


def _only_route(start: fx.Node, ends: set[fx.Node], start_name: str, end_name: str) -> list[fx.Node]:
    """DFS over the paths from start to an end node; exactly one must exist."""
    reaches_end = _ancestors(ends)  # prune the DFS to nodes that lead to an end: it stops at 2 routes
    routes: list[list[fx.Node]] = []
    stack = [[start]] if start in reaches_end else []
    while stack and len(routes) < 2:
        path = stack.pop()
        if path[-1] in ends:
            routes.append(path)
            continue
        stack.extend(path + [user] for user in path[-1].users if user in reaches_end)
    if len(routes) == 1:
        return routes[0]
    why = (
        f"'{end_name}' cannot be reached from '{start_name}'"
        if not routes
        else "the data can flow between them along more than one path (a branch or a residual add)"
    )
    raise ValueError(
        f"Can not find an only route from {start_name} to {end_name}: {why}. "
        "Choose a start and an end layer on one straight chain of modules."
    )


def _ancestors(nodes: set[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(node.all_input_nodes)
    return seen


def _check_disjoint(cm: CapturedModel, groups: list[list[str]]) -> None:
    # docs/spec/engine.md §6.1: groups must not intersect; a reused activation module may sit in several
    for i, first in enumerate(groups):
        for second in groups[i + 1 :]:
            common = [name for name in first if name in second and not _shareable(cm, name)]
            if common:
                raise ValueError(
                    f"Distill groups {first[0]} → {first[-1]} and {second[0]} → {second[-1]} "
                    f"share {', '.join(common)}; distill groups must not intersect"
                )


def _free(cm: CapturedModel, name: str, taken: set[str]) -> bool:
    """Not in another group yet, or shareable."""
    return name not in taken or _shareable(cm, name)


def _shareable(cm: CapturedModel, name: str) -> bool:
    # docs/spec/engine.md §6.1: a reused activation module may sit in several groups (it holds no state to train)
    return cm.call_count(name) > 1 and module_type_name(cm, name) in DISTILL_ACTIVATION_TYPES


def _pairs(user_groups: Iterable[Any]) -> list[tuple[str, str]]:
    pairs = []
    for group in user_groups:
        if hasattr(group, "start_layer_name"):
            pairs.append((group.start_layer_name, group.end_layer_name))
        elif isinstance(group, (tuple, list)) and len(group) == 2 and all(isinstance(g, str) for g in group):
            pairs.append((group[0], group[1]))
        else:
            raise TypeError(f"a user distill group must be a (start_layer_name, end_layer_name) pair, got {group!r}")
    return pairs
