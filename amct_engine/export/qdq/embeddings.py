"""Embedding tables of the deploy model as int8 rows with one float scale per row (docs/spec/engine.md §5).

A `Gather` on axis 0 of a float initialiser of at least 1 MiB whose indices come from the graph (token ids)
is a lookup table: a transformer's word embeddings are half its bytes (all-MiniLM-L6-v2: 46.9 MB of a
90.4 MB FP32 file) and no quantiser covers them. The quantised PyTorch model has already rounded such a
table to int8 rows (amct_engine/quant/lookup_tables.py: the symmetric scale s_r = max|row r| / 127, the codes
round(row / s_r)), so the table lies on that grid; a table that does not (one the PyTorch model did not round)
stays float. The file keeps the codes and the scales; at run time

    Gather(codes, ids) -> Cast(float) -> Mul(Gather(scales, ids))      (scales stored [rows, 1])

gives the rounded rows the PyTorch model computes with, and the table costs a quarter of its bytes plus 4
bytes a row.

Why standard ops and not onnxruntime's `com.microsoft::GatherBlockQuantized`: in onnxruntime 1.32 its CPU
kernel takes uint8 data only (8-bit codes with zero point 128 by default, or packed 4-bit), a block size
that is a power of two ≥ 16 (so a 384-wide row needs 3 copies of its scale at block 128), and it was the
slower of the two on MiniLM's 30522 × 384 table with [32, 128] ids, one thread, best of 20 interleaved
runs (AVX-512 VNNI CPU): float Gather 0.82-1.07 ms, int8 Gather + Cast + Mul 0.94-0.98 ms,
GatherBlockQuantized 1.55-1.81 ms (block 128), 1.94-2.05 ms (block 16). The standard ops also run in any
ONNX runtime.

A tied table (one also read by something other than such a Gather: a MatMul/Gemm language-model head,
directly or through a Transpose) is skipped and stays float: the head needs the float values, and a float
copy beside the int8 table would cost more bytes than it saves (the engine's PTQ leaves a tied head float,
so its Gemm reads the table itself: tests/test_deploy_int8_embeddings.py).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from amct_engine.quant.lookup_tables import MIN_TABLE_BYTES, per_row_int8

# A table the quantised PyTorch model rounded: its values are codes * scales up to float32's rounding of the
# scale recomputed here (max|row| / 127 of a row whose maximum is already 127 * scale).
GRID_TOLERANCE = 4 * float(np.finfo(np.float32).eps)

CODES_SUFFIX, SCALES_SUFFIX = ".int8_rows", ".row_scales"


def int8_embeddings(model: onnx.ModelProto) -> list[str]:
    """Rewrite, in place, every lookup table's Gathers to read int8 rows and per-row scales; the names of
    the tables rewritten (the deploy report's `int8_embeddings`)."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in set(node.input):
            readers[name].append(node)
    produced_by_constant = {out for n in graph.node if n.op_type == "Constant" for out in n.output}
    rewritten = []
    for name, tensor in initializers.items():
        gathers = readers.get(name, [])
        if not _is_lookup_table(tensor, gathers, initializers.keys() | produced_by_constant):
            continue
        table = numpy_helper.to_array(tensor)
        codes, scales = (t.numpy() for t in per_row_int8(torch.from_numpy(table.copy())))
        if not np.allclose(codes * scales, table, rtol=GRID_TOLERANCE, atol=0):
            continue  # not rounded by the quantised model: it computes with the float table (quant/lookup_tables.py)
        graph.initializer.remove(tensor)
        graph.initializer.extend(
            [numpy_helper.from_array(codes, name + CODES_SUFFIX), numpy_helper.from_array(scales, name + SCALES_SUFFIX)]
        )
        for gather in gathers:
            _read_int8_rows(graph, gather, name)
        rewritten.append(name)
    return rewritten


def _is_lookup_table(tensor: onnx.TensorProto, readers: list[onnx.NodeProto], constants: set[str]) -> bool:
    """A float matrix of ≥ MIN_TABLE_BYTES read only as the data of axis-0 Gathers with graph-computed ids."""
    if tensor.data_type != TensorProto.FLOAT or len(tensor.dims) != 2 or not readers:
        return False
    if int(np.prod(tensor.dims)) * 4 < MIN_TABLE_BYTES:
        return False
    for node in readers:  # any other reader (a tied MatMul/Gemm head, a Transpose) keeps the table float
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if node.op_type != "Gather" or node.input[0] != tensor.name or axis != 0 or node.input[1] in constants:
            return False
    return True


def _read_int8_rows(graph: onnx.GraphProto, gather: onnx.NodeProto, table: str) -> None:
    """Replace `gather` by Gather(codes) -> Cast -> Mul(Gather(scales)), same output name, same place."""
    ids, out = gather.input[1], gather.output[0]
    base = gather.name or out
    nodes = [
        helper.make_node("Gather", [table + CODES_SUFFIX, ids], [out + "/codes"], name=base + "/int8_rows"),
        helper.make_node("Gather", [table + SCALES_SUFFIX, ids], [out + "/scales"], name=base + "/row_scales"),
        helper.make_node("Cast", [out + "/codes"], [out + "/float_codes"], name=base + "/cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", [out + "/float_codes", out + "/scales"], [out], name=base + "/dequantize"),
    ]
    index = list(graph.node).index(gather)
    graph.node.remove(gather)
    for offset, node in enumerate(nodes):
        graph.node.insert(index + offset, node)
