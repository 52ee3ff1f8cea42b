"""The prunable layer types, in one table (docs/spec/engine.md §4.4; Torch-Pruning's ``pruner/function.py``).

A ``LayerPruner`` is everything pruning knows about one layer class. The dependency builder asks it
how channels flow through the layer and where they are; the pruning pass asks it to remove them;
the record asks it what to call the layer. Its ``flow`` is one of:

- ``PRODUCER``: makes new channels that lead a group (a Conv2d, a Linear); it also reads its input
  channels as a passive consumer (its weight's input channels go with the group feeding it);
- ``CONSUMER``: reads its input channels like a producer does, but its own output channels are
  never pruned (a ConvTranspose; a Conv1d/Conv3d, which AMCT never lets lead);
- ``PASS_THROUGH``: its output channels are its input channels, and it prunes its own per-channel
  parameters with the group (a BatchNorm);
- ``FOLLOWER``: a depthwise conv: each output channel is one input channel's filter, so it loses
  the channels of its producer and shrinks its ``groups``.

``LAYER_PRUNERS`` maps a module class to its pruner; ``layer_pruner_for`` looks a module up along
its class's MRO, so a subclass of a registered class is pruned as its base. A user layer type takes
one call, ``register_layer_pruner(MyLayer, MyLayerPruner())`` (docs/architecture.md, "Add a prunable
layer type"): it also makes capture keep ``MyLayer`` as one leaf module, so the graph shows it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from amct_engine.graph.capture import register_leaf_module_type, unregister_leaf_module_type
from amct_engine.graph.layer_types import BN_TYPES, CONV_TRANSPOSE_TYPES, CONV_TYPES
from amct_engine.prune.channel_groups import DEPTHWISE, IN, NORM
from amct_engine.registry import Registry

PRODUCER = "producer"
CONSUMER = "consumer"
PASS_THROUGH = "pass_through"
FOLLOWER = "follower"

# The member kind (channel_groups.py) a layer of each flow gets in the groups that feed it.
_INPUT_KINDS = {PRODUCER: IN, CONSUMER: IN, PASS_THROUGH: NORM, FOLLOWER: DEPTHWISE}


class LayerPruner:
    """How the channel dependency graph and the pruning pass treat one layer type.

    Subclasses set ``op_type`` and ``flow`` and implement the channel counts and the two prune
    methods. ``prune_out_channels`` / ``prune_in_channels`` get absolute indices of the channel
    dimension and edit the module in place (parameters, buffers, the attributes that state sizes);
    they raise ``ValueError`` / ``IndexError`` with the reason when they cannot. For a
    ``PASS_THROUGH`` or ``FOLLOWER`` layer in and out channels are the same: the pass calls
    ``prune_out_channels``.
    """

    op_type: str = ""  # the ONNX op type AMCT writes for this layer in a prune record
    flow: str = PRODUCER
    reads_merged_channels = False  # may read channels a flatten merged into blocks of features

    def channel_flow(self, module: nn.Module) -> str:
        return self.flow

    def input_kind(self, module: nn.Module) -> str:
        """The member kind this layer has in the group feeding it (in the groups and the record)."""
        return _INPUT_KINDS[self.channel_flow(module)]

    def not_leading_reason(self, module: nn.Module) -> str:
        """Why a CONSUMER / FOLLOWER layer's output channels lead no group (for the report)."""
        return f"{type(module).__name__} output channels are not pruned"

    def input_problem(self, module: nn.Module) -> str | None:
        """Why this layer's input channels cannot be pruned at all (None: they can)."""
        return None

    def groups(self, module: nn.Module) -> int:
        """Equal parts its channels are split in (conv ``groups``); each part loses the same count."""
        return 1

    def in_channel_axis(self, module: nn.Module, rank: int) -> int:
        """The channel axis of its input tensor, of rank ``rank``."""
        return 1

    def out_channel_axis(self, module: nn.Module, rank: int) -> int:
        """The channel axis of its output tensor, of rank ``rank``."""
        return 1

    def get_out_channels(self, module: nn.Module) -> int:
        raise NotImplementedError

    def get_in_channels(self, module: nn.Module) -> int:
        raise NotImplementedError

    def prune_out_channels(self, module: nn.Module, indices: Iterable[int]) -> None:
        raise NotImplementedError

    def prune_in_channels(self, module: nn.Module, indices: Iterable[int]) -> None:
        raise NotImplementedError

    def filter_weight(self, module: nn.Module) -> torch.Tensor:
        """The weight whose rows (axis 0) are its output channels' filters: what importance scores."""
        return module.weight

    def out_channel_tensors(self, module: nn.Module) -> list[tuple[str, int]]:
        """(parameter name, axis) of the parameters that lose its output channels, for the coupled
        importance criteria (group L2, Taylor; importance.py). Biases are left out, as Torch-Pruning does."""
        return [("weight", 0)] if getattr(module, "weight", None) is not None else []

    def in_channel_tensors(self, module: nn.Module) -> list[tuple[str, int]]:
        """(parameter name, axis) of the parameters that lose its input channels; [] when the layer
        reads them in groups (the group-local columns are not one channel each)."""
        return [("weight", 1)] if self.groups(module) == 1 else []


class _ConvChannels:
    """Channel counts and groups of a Conv / ConvTranspose, read from the module's attributes."""

    def groups(self, conv: nn.Module) -> int:
        return conv.groups

    def get_out_channels(self, conv: nn.Module) -> int:
        return conv.out_channels

    def get_in_channels(self, conv: nn.Module) -> int:
        return conv.in_channels


class ConvPruner(_ConvChannels, LayerPruner):
    """Conv1d/2d/3d, grouped and depthwise; only Conv2d leads a group (docs/spec/engine.md §4.4, §4.9)."""

    op_type = "Conv"

    def __init__(self, leads_groups: bool) -> None:
        self.leads_groups = leads_groups

    def channel_flow(self, conv: nn.Module) -> str:
        if _is_depthwise(conv):
            return FOLLOWER
        return PRODUCER if self.leads_groups else CONSUMER

    def not_leading_reason(self, conv: nn.Module) -> str:
        if _is_depthwise(conv):
            return "depthwise conv: it follows the channels of its producer"
        return f"{type(conv).__name__}: only Conv2d and Linear layers lead a channel group (docs/spec/engine.md §4.9)"

    def input_problem(self, conv: nn.Module) -> str | None:
        if _is_depthwise(conv) and conv.out_channels != conv.in_channels:
            return (
                f"is a depthwise conv with channel multiplier {conv.out_channels // conv.in_channels}; "
                "only multiplier 1 is followed"
            )
        return None

    def prune_out_channels(self, conv: nn.Module, indices: Iterable[int]) -> None:
        removed = set(indices)
        keep = keep_indices(conv.out_channels, removed)
        if _is_depthwise(conv):  # its channels in and out are the same: the groups shrink with them
            _slice_weight_and_bias(conv, keep)
            conv.in_channels = conv.out_channels = conv.groups = len(keep)
            return
        if conv.groups > 1:
            per_group(removed, conv.out_channels, conv.groups)
        _slice_weight_and_bias(conv, keep)
        conv.out_channels = len(keep)

    def prune_in_channels(self, conv: nn.Module, indices: Iterable[int]) -> None:
        if _is_depthwise(conv):
            self.prune_out_channels(conv, indices)
            return
        removed, groups, weight = set(indices), conv.groups, conv.weight.detach()
        keep_indices(conv.in_channels, removed)  # range check
        # weight [Cout, Cin/groups, …]: each row reads the input channels of its own group
        in_len, out_len = conv.in_channels // groups, conv.out_channels // groups
        local = per_group(removed, conv.in_channels, groups)
        keep_local = [[c for c in range(in_len) if c not in part] for part in local]
        index = torch.tensor(
            [keep_local[row // out_len] for row in range(conv.out_channels)], dtype=torch.long, device=weight.device
        )
        index = index.reshape(*index.shape, *[1] * (weight.dim() - 2)).expand(-1, -1, *weight.shape[2:])
        conv.weight = new_parameter(conv.weight, torch.gather(weight, 1, index))
        conv.in_channels -= len(removed)


class ConvTransposePruner(_ConvChannels, LayerPruner):
    """ConvTranspose1d/2d/3d: a passive consumer; only the input channels of an ungrouped one go."""

    op_type = "ConvTranspose"
    flow = CONSUMER

    def not_leading_reason(self, conv: nn.Module) -> str:
        return f"{type(conv).__name__} output channels are not pruned (docs/spec/engine.md §4.4)"

    def input_problem(self, conv: nn.Module) -> str | None:
        return "is a grouped ConvTranspose; its input channels are not pruned" if conv.groups != 1 else None

    def prune_out_channels(self, conv: nn.Module, indices: Iterable[int]) -> None:
        raise ValueError("only the input channels of an ungrouped ConvTranspose can be pruned")

    def prune_in_channels(self, conv: nn.Module, indices: Iterable[int]) -> None:
        if conv.groups != 1:
            raise ValueError("only the input channels of an ungrouped ConvTranspose can be pruned")
        # weight [Cin, Cout/groups, …]: the input channels are its rows
        keep = keep_indices(conv.in_channels, set(indices))
        conv.weight = new_parameter(conv.weight, conv.weight.detach()[keep])
        conv.in_channels = len(keep)

    def filter_weight(self, conv: nn.Module) -> torch.Tensor:
        return conv.weight.transpose(0, 1)

    def in_channel_tensors(self, conv: nn.Module) -> list[tuple[str, int]]:
        return [("weight", 0)] if conv.groups == 1 else []  # weight [Cin, Cout/groups, …]


class LinearPruner(LayerPruner):
    """Linear: channels on the last axis; after a flatten it reads each channel as a block of H·W features."""

    op_type = "Gemm"
    reads_merged_channels = True

    def in_channel_axis(self, linear: nn.Module, rank: int) -> int:
        return rank - 1

    def out_channel_axis(self, linear: nn.Module, rank: int) -> int:
        return rank - 1

    def get_out_channels(self, linear: nn.Module) -> int:
        return linear.out_features

    def get_in_channels(self, linear: nn.Module) -> int:
        return linear.in_features

    def prune_out_channels(self, linear: nn.Module, indices: Iterable[int]) -> None:
        keep = keep_indices(linear.out_features, set(indices))
        _slice_weight_and_bias(linear, keep)
        linear.out_features = len(keep)

    def prune_in_channels(self, linear: nn.Module, indices: Iterable[int]) -> None:
        keep = keep_indices(linear.in_features, set(indices))
        linear.weight = new_parameter(linear.weight, linear.weight.detach()[:, keep])
        linear.in_features = len(keep)


class BatchNormPruner(LayerPruner):
    """BatchNorm1d/2d/3d, SyncBatchNorm: pruned with its producer (weight, bias, running statistics)."""

    op_type = "BatchNormalization"
    flow = PASS_THROUGH
    reads_merged_channels = True  # a BatchNorm1d after a flatten normalises every feature of a channel

    def get_out_channels(self, bn: nn.Module) -> int:
        return bn.num_features

    get_in_channels = get_out_channels

    def prune_out_channels(self, bn: nn.Module, indices: Iterable[int]) -> None:
        keep = keep_indices(bn.num_features, set(indices))
        if bn.weight is not None:
            bn.weight = new_parameter(bn.weight, bn.weight.detach()[keep])
            bn.bias = new_parameter(bn.bias, bn.bias.detach()[keep])
        if bn.running_mean is not None:
            bn.running_mean = bn.running_mean[keep].clone()
            bn.running_var = bn.running_var[keep].clone()
        bn.num_features = len(keep)

    prune_in_channels = prune_out_channels

    def out_channel_tensors(self, bn: nn.Module) -> list[tuple[str, int]]:
        return [("weight", 0)] if bn.weight is not None else []  # gamma: Torch-Pruning's BN term

    in_channel_tensors = out_channel_tensors


# ---------------------------------------------------------------------- the table

LAYER_PRUNERS: Registry[LayerPruner] = Registry("prunable layer type")  # keyed by module class


def register_layer_pruner(module_type: type[nn.Module], pruner: LayerPruner, *, replace: bool = False) -> LayerPruner:
    """Make ``module_type`` (and its subclasses) prunable, and captured as one leaf module."""
    if not isinstance(pruner, LayerPruner):
        raise TypeError(f"a layer pruner must be a LayerPruner instance, got {type(pruner).__name__}")
    LAYER_PRUNERS.register(module_type, pruner, replace=replace)
    register_leaf_module_type(module_type)
    return pruner


def unregister_layer_pruner(module_type: type[nn.Module]) -> None:
    LAYER_PRUNERS.unregister(module_type)
    unregister_leaf_module_type(module_type)


def layer_pruner_for(module: nn.Module) -> LayerPruner | None:
    """The pruner of the nearest class along ``type(module)``'s MRO; None when no class has one."""
    for cls in type(module).__mro__:
        pruner = LAYER_PRUNERS.get(cls)
        if pruner is not None:
            return pruner
    return None


def weight_layer_type_names() -> frozenset[str]:
    """Class names a prune config can apply to: the registered layers that own weights with channels
    (producers and consumers; the passes decide which of them can really be pruned)."""
    return frozenset(cls.__name__ for cls, pruner in LAYER_PRUNERS.items() if pruner.flow in (PRODUCER, CONSUMER))


# the torch.nn layers are capture leaves already: registered in the table only
for _conv in CONV_TYPES:
    LAYER_PRUNERS.register(_conv, ConvPruner(leads_groups=_conv is nn.Conv2d))
for _conv in CONV_TRANSPOSE_TYPES:
    LAYER_PRUNERS.register(_conv, ConvTransposePruner())
LAYER_PRUNERS.register(nn.Linear, LinearPruner())
for _bn in BN_TYPES:
    LAYER_PRUNERS.register(_bn, BatchNormPruner())


# ---------------------------------------------------------------------- slicing helpers


def keep_indices(size: int, removed: set[int]) -> list[int]:
    """The indices of ``range(size)`` that stay; every removed one must exist, and one must stay."""
    bad = sorted(i for i in removed if not 0 <= i < size)
    if bad:
        raise IndexError(f"channel index {bad[0]} is out of range for {size} channels")
    if len(removed) >= size:
        raise ValueError(f"cannot remove all {size} channels")
    return [i for i in range(size) if i not in removed]


def new_parameter(old: nn.Parameter, value: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(value.clone().contiguous(), requires_grad=old.requires_grad)


def per_group(removed: set[int], size: int, groups: int) -> list[set[int]]:
    """Split absolute indices into per-group local indices; every group must lose as many."""
    length = size // groups
    local = [{i - g * length for i in removed if g * length <= i < (g + 1) * length} for g in range(groups)]
    if len({len(part) for part in local}) > 1:
        raise ValueError(f"the {groups} conv groups would lose different channel counts {[len(p) for p in local]}")
    return local


def _slice_weight_and_bias(module: nn.Module, keep: list[int]) -> None:
    """Keep these rows (output channels) of ``weight`` and entries of ``bias``."""
    module.weight = new_parameter(module.weight, module.weight.detach()[keep])
    if module.bias is not None:
        module.bias = new_parameter(module.bias, module.bias.detach()[keep])


def _is_depthwise(conv: nn.Module) -> bool:
    return conv.groups > 1 and conv.groups == conv.in_channels
