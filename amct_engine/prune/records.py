"""Prune records in the record file (docs/spec/engine.md §2.3): written at create, replayed at restore.

Filter-prune record: one ``prune_record`` per pruned channel group, with a ``producer`` node per
producer and a ``consumer`` node per BN / conv / linear input / add / concat (any layer of the
layer-pruner table, which also gives the node's ``type``). Each node carries
``type`` (ONNX op type), ``begin`` / ``end`` (the range of its channel dimension the group covers;
concat inputs keep their offsets), ``group`` (conv groups, when > 1), ``block`` (features per
channel for a Linear after flatten, our extension; AMCT gives up there) and ``prune_index`` (the
absolute indices removed from that dimension).

Selective record: ``prune_record { selective_prune { name attr{mask_shape} attr{selective_mask} } }``,
the mask bit-packed big-endian (``numpy.packbits``), zero-padded to a multiple of 8 bytes and read as
little-endian int64 words.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from google.protobuf import text_format
from torch import nn

from amct_engine.proto import basic_info_pb2
from amct_engine.proto import scale_offset_record_pytorch_pb2 as record_pb2
from amct_engine.prune.apply import GroupCut, PrunePlan
from amct_engine.prune.channel_groups import OUT
from amct_engine.prune.layer_pruners import layer_pruner_for
from amct_engine.prune.op_vocabulary import OP_NODE_TYPES
from amct_engine.record import RecordFile

_Attr = basic_info_pb2.AttrProto


def filter_prune_record(cut: GroupCut) -> record_pb2.PruneRecord:
    record = record_pb2.PruneRecord()
    channels = list(cut.channels)
    for member in cut.group.members:
        node = (record.producer if member.is_producer else record.consumer).add(name=member.name)
        node.attr.add(name="type", type=_Attr.STRING, s=member.op_type.encode())
        node.attr.add(name="begin", type=_Attr.INT, i=member.begin)
        node.attr.add(name="end", type=_Attr.INT, i=member.end)
        if member.group > 1:
            node.attr.add(name="group", type=_Attr.INT, i=member.group)
        if member.block > 1:
            node.attr.add(name="block", type=_Attr.INT, i=member.block)
        node.attr.add(name="prune_index", type=_Attr.INTS, ints=member.indices(channels))
    return record


def pack_mask(mask: torch.Tensor) -> list[int]:
    """(mask != 0) → packbits (big-endian bits) → zero-pad to 8-byte words → int64 (docs/spec/engine.md §2.3)."""
    packed = np.packbits(mask.detach().cpu().numpy().reshape(-1) != 0)
    packed = np.pad(packed, (0, (-packed.size) % 8))
    return packed.view("<i8").tolist()


def unpack_mask(words: Sequence[int], shape: Sequence[int]) -> torch.Tensor:
    count = int(np.prod(shape))
    bits = np.unpackbits(np.asarray(words, dtype="<i8").view(np.uint8))
    if bits.size < count:
        raise ValueError(f"selective_mask holds {bits.size} bits, the weight shape {list(shape)} needs {count}")
    return torch.from_numpy(bits[:count].astype(bool)).reshape(tuple(shape))


def selective_prune_record(layer: str, mask: torch.Tensor) -> record_pb2.PruneRecord:
    record = record_pb2.PruneRecord()
    node = record.selective_prune
    node.name = layer
    node.attr.add(name="mask_shape", type=_Attr.INTS, ints=list(mask.shape))
    node.attr.add(name="selective_mask", type=_Attr.INTS, ints=pack_mask(mask))
    return record


def write_prune_records(record: RecordFile, prune_records: Iterable[record_pb2.PruneRecord]) -> None:
    """Replace the file's prune records, keeping its quantisation entries."""
    message = record.read()
    del message.prune_record[:]
    message.prune_record.extend(prune_records)
    _write(record.path, message)


def update_selective_records(record: RecordFile, masks: dict[str, torch.Tensor]) -> None:
    """Insert or replace the selective records of these layers."""
    message = record.read()
    kept = [r for r in message.prune_record if not (r.HasField("selective_prune") and r.selective_prune.name in masks)]
    del message.prune_record[:]
    message.prune_record.extend(kept + [selective_prune_record(n, m) for n, m in masks.items()])
    _write(record.path, message)


def _write(path: str, message: record_pb2.ScaleOffsetRecord) -> None:
    # the same atomic write as RecordFile: a crash mid-write never leaves half a record
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text_format.MessageToString(message))
    os.replace(tmp, path)


# ---------------------------------------------------------------------- reading back (restore)


def _attrs(node: record_pb2.PruneNode) -> dict[str, basic_info_pb2.AttrProto]:
    return {a.name: a for a in node.attr}


def read_prune_records(record_file: str | os.PathLike) -> list[record_pb2.PruneRecord]:
    path = os.fspath(record_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"record_file not found: {path} (pass the record written by create_*)")
    return list(RecordFile(path).read().prune_record)


def plan_from_records(records: Iterable[record_pb2.PruneRecord], model: nn.Module, path: str) -> PrunePlan:
    """The removal plan a record file describes, checked against ``model``'s modules."""
    modules = dict(model.named_modules())
    plan: PrunePlan = {}
    for i, record in enumerate(records):
        nodes = [(n, True) for n in record.producer] + [(n, False) for n in record.consumer]
        for node, is_producer in nodes:
            attrs = _attrs(node)
            where = f"{path}: prune_record[{i}] node '{node.name}'"
            op_type = attrs["type"].s.decode() if "type" in attrs else ""
            if node.name not in modules:
                if op_type in OP_NODE_TYPES:
                    continue  # an add / concat: nothing to remove
                raise ValueError(
                    f"{where}: the model has no module of that name; was the record written for another model?"
                )
            if "prune_index" not in attrs:
                raise ValueError(f"{where}: no prune_index attribute; was the record written before pruning?")
            kind = OUT if is_producer else _consumer_kind(modules[node.name], where)
            plan.setdefault(node.name, {}).setdefault(kind, set()).update(attrs["prune_index"].ints)
    return plan


def _consumer_kind(module: nn.Module, where: str) -> str:
    """The member kind a consumer node of the record has: its layer pruner says (IN, NORM, DEPTHWISE)."""
    pruner = layer_pruner_for(module)
    if pruner is None:
        raise ValueError(f"{where}: a {type(module).__name__} cannot lose channels")
    return pruner.input_kind(module)


def selective_masks_from_records(records: Iterable[record_pb2.PruneRecord], path: str) -> dict[str, torch.Tensor]:
    masks = {}
    for i, record in enumerate(records):
        if not record.HasField("selective_prune"):
            continue
        node = record.selective_prune
        attrs = _attrs(node)
        if "mask_shape" not in attrs or "selective_mask" not in attrs:
            raise ValueError(
                f"{path}: prune_record[{i}] selective_prune '{node.name}' lacks mask_shape or selective_mask"
            )
        masks[node.name] = unpack_mask(attrs["selective_mask"].ints, attrs["mask_shape"].ints)
    return masks


def filter_records(records: Iterable[record_pb2.PruneRecord]) -> list[record_pb2.PruneRecord]:
    return [r for r in records if len(r.producer)]
