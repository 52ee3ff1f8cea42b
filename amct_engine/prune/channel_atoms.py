"""Channel atoms: the union-find under the channel groups (docs/spec/engine.md §4.4 step 2).

An *atom* is the run of channels one producer makes. Ops that make two atoms share their channels
position by position (a residual add) merge them; a merged set of atoms is one ``ChannelGroup``.
Each atom collects its members, the equal parts grouped convs ask of it (``divisions``) and the
reasons it cannot be pruned; a merge passes them on to the root.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from amct_engine.prune.channel_groups import ChannelGroup, Member
from amct_engine.prune.channel_layout import Segment


@dataclass
class _Atom:
    size: int
    members: list[Member] = field(default_factory=list)
    divisions: int = 1
    parent: int = -1
    reasons: list[str] = field(default_factory=list)


class ChannelAtoms:
    def __init__(self) -> None:
        self._atoms: list[_Atom] = []

    def new(self, size: int, member: Member, divisions: int = 1) -> int:
        self._atoms.append(_Atom(size, [member], divisions))
        return len(self._atoms) - 1

    def add_member(self, atom: int, member: Member) -> None:
        self._atoms[atom].members.append(member)

    def find(self, a: int) -> int:
        while self._atoms[a].parent >= 0:
            a = self._atoms[a].parent
        return a

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        top, low = self._atoms[ra], self._atoms[rb]
        low.parent = ra
        top.reasons.extend(low.reasons)
        self.set_divisions(ra, low.divisions)
        return ra

    def set_divisions(self, atom: int, divisions: int) -> None:
        root = self._atoms[self.find(atom)]
        merged = math.lcm(root.divisions, divisions)
        if root.size % merged:
            root.reasons.append(f"grouped convs need {merged} equal parts of its {root.size} channels")
        else:
            root.divisions = merged

    def disable(self, segments: Iterable[Segment], reason: str) -> None:
        for seg in segments:
            if seg.atom is not None:
                self._atoms[self.find(seg.atom)].reasons.append(reason)

    def groups(self) -> list[ChannelGroup]:
        """One group per merged set of atoms, in the order their first atom was made."""
        classes: dict[int, list[int]] = {}
        for i in range(len(self._atoms)):
            classes.setdefault(self.find(i), []).append(i)
        groups = []
        for root, atoms in sorted(classes.items(), key=lambda kv: kv[1][0]):
            members = [m for a in atoms for m in self._atoms[a].members]
            members.sort(key=lambda m: not m.is_producer)  # producers first, as in AMCT's records
            top = self._atoms[root]
            groups.append(ChannelGroup(len(groups), top.size, members, top.divisions, list(dict.fromkeys(top.reasons))))
        return groups
