"""The channel dependency graph's data: channel groups and their members (docs/spec/engine.md §4.4 records).

``dependency.build_channel_groups`` fills these from the captured graph; BCP, physical removal, the
record and the report all read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Member kinds: which tensors of a layer lose the group's channels (the layer-pruner flow that
# gives each is in layer_pruners.py).
OUT = "out"  # producer: weight rows (Cout / out_features) and bias
IN = "in"  # consumer: weight input channels (Cin / in_features)
NORM = "norm"  # pass-through layer (BatchNorm): its per-channel parameters and statistics
DEPTHWISE = "depthwise"  # depthwise conv: its channels in and out, and groups
OP = "op"  # an add / concat node: nothing to change, listed in the record as AMCT does


@dataclass(frozen=True)
class Member:
    """One place a group's channels live: a layer (by module path) and a range of its channel dim."""

    name: str  # module path; for OP members the fx node name
    kind: str  # OUT | IN | NORM | DEPTHWISE | OP
    begin: int  # range of the member's own channel (or feature) dimension covered by the group
    end: int
    op_type: str  # ONNX op type, as AMCT writes it into the record ("Conv", "Gemm", …)
    block: int = 1  # features per group channel (a Linear after flatten: H·W)
    group: int = 1  # conv groups of the layer, when > 1

    @property
    def is_producer(self) -> bool:
        return self.kind == OUT

    def indices(self, channels: list[int]) -> list[int]:
        """Absolute indices in the member's dimension of the given group channels."""
        if self.block == 1:
            return [self.begin + c for c in channels]
        return [self.begin + c * self.block + k for c in channels for k in range(self.block)]


@dataclass
class ChannelGroup:
    """Channels that every member loses together; ``disabled`` says why they cannot be pruned."""

    id: int
    size: int  # channels in the group
    members: list[Member]
    divisions: int = 1  # contiguous equal parts that must each lose the same count (grouped convs)
    disabled: list[str] = field(default_factory=list)

    @property
    def producers(self) -> list[Member]:
        return [m for m in self.members if m.is_producer]

    @property
    def consumers(self) -> list[Member]:
        return [m for m in self.members if not m.is_producer]

    @property
    def producer_names(self) -> list[str]:
        return list(dict.fromkeys(m.name for m in self.producers))

    @property
    def layer_names(self) -> list[str]:
        return list(dict.fromkeys(m.name for m in self.members if m.kind != OP))


@dataclass
class ChannelDependencies:
    """The dependency graph: every channel group, and the prunable layers that lead none (and why)."""

    groups: list[ChannelGroup]
    not_prunable: dict[str, str]
    output_shapes: list[tuple[int, ...]] = field(default_factory=list)  # of the model, before pruning

    def groups_of(self, layer: str) -> list[ChannelGroup]:
        return [g for g in self.groups if any(m.name == layer for m in g.members)]
