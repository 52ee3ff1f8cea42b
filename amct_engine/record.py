"""The record file (docs/spec/engine.md §2.3): a text-format `ScaleOffsetRecord` keyed by module path.

One `RecordFile` object belongs to one compressed model (AMCT keeps a process-wide singleton;
we do not, so two models in one process keep separate records).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from google.protobuf import text_format

from amct_engine.proto import scale_offset_record_pytorch_pb2 as record_pb2


@dataclass(frozen=True)
class LayerQuantRecord:
    """Quantisation factors of one layer, as the export reads them."""

    scale_d: float
    offset_d: int
    scale_w: tuple[float, ...]
    offset_w: tuple[int, ...]
    act_type: str = "INT8"
    wts_type: str = "INT8"
    fakequant_precision_mode: str = "DEFAULT"

    @property
    def act_bits(self) -> int:
        return int(self.act_type.removeprefix("INT"))

    @property
    def wts_bits(self) -> int:
        return int(self.wts_type.removeprefix("INT"))


class RecordFile:
    """Reads and writes one record file; every update rewrites the whole (small) file."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        # The parsed record and the (mtime, size) it was read at: the first eval forward writes one
        # entry per layer, and re-parsing a large record (prune records) each time costs seconds.
        self._cached: tuple[tuple[int, int], record_pb2.ScaleOffsetRecord] | None = None
        # Entries written between hold() and release(): stored with one rewrite at release.
        self._held: dict[str, LayerQuantRecord] | None = None

    def __deepcopy__(self, memo):
        return RecordFile(self.path)

    def _stamp(self) -> tuple[int, int] | None:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def create_empty(self) -> None:
        """`create_*` and `restore_*` start from an empty record (docs/spec/engine.md §1.1)."""
        self._write(record_pb2.ScaleOffsetRecord())

    def read(self) -> record_pb2.ScaleOffsetRecord:
        """A copy of the record on disk (empty when there is no file)."""
        stamp = self._stamp()
        record = record_pb2.ScaleOffsetRecord()
        if stamp is None:
            return record
        if self._cached is None or self._cached[0] != stamp:
            with open(self.path, encoding="utf-8") as f:
                text_format.Parse(f.read(), record)
            self._cached = (stamp, record)
        copy = record_pb2.ScaleOffsetRecord()
        copy.CopyFrom(self._cached[1])
        return copy

    def _write(self, record: record_pb2.ScaleOffsetRecord) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text_format.MessageToString(record))
        os.replace(tmp, self.path)  # a crash mid-write never leaves half a record
        cached = record_pb2.ScaleOffsetRecord()
        cached.CopyFrom(record)
        stamp = self._stamp()
        self._cached = (stamp, cached) if stamp is not None else None

    def hold(self) -> None:
        """Keep the entries later write_layers calls give until release() (read() does not see them).

        The layers of one model write their entries during one forward; a forward hook holds and
        releases, so the file is rewritten once per forward instead of once per layer.
        """
        if self._held is None:
            self._held = {}

    def release(self) -> None:
        """Write the held entries (one rewrite) and stop holding."""
        held, self._held = self._held, None
        if held:
            self.write_layers(held)

    def write_layers(self, layers: dict[str, LayerQuantRecord]) -> None:
        """Insert or replace the quantisation entries of these layers (held while hold() is on)."""
        if self._held is not None:
            self._held.update(layers)
            return
        record = self.read()
        entries = {entry.key: entry for entry in record.record}
        for name, layer in layers.items():
            entry = entries.get(name)
            if entry is None:
                entry = record.record.add(key=name)
            value = entry.value
            value.Clear()
            value.scale_d = layer.scale_d
            value.offset_d = layer.offset_d
            value.scale_w.extend(layer.scale_w)
            value.offset_w.extend(layer.offset_w)
            value.act_type = layer.act_type
            value.wts_type = layer.wts_type
            if layer.fakequant_precision_mode != "DEFAULT":
                value.fakequant_precision_mode = layer.fakequant_precision_mode
        self._write(record)

    def quant_layers(self) -> dict[str, LayerQuantRecord]:
        out = {}
        for entry in self.read().record:
            v = entry.value
            if not v.HasField("scale_d"):
                continue
            out[entry.key] = LayerQuantRecord(
                scale_d=v.scale_d,
                offset_d=v.offset_d,
                scale_w=tuple(v.scale_w),
                offset_w=tuple(v.offset_w),
                act_type=v.act_type,
                wts_type=v.wts_type,
                fakequant_precision_mode=v.fakequant_precision_mode,
            )
        return out
