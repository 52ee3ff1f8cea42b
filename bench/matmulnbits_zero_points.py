"""What float zero points cost an int4 MatMulNBits in onnxruntime (issue 41; docs/spec/llm.md §7).

ORT's HQQ quantiser stores float zero points (its ranges need not contain 0) and is lossless on SmolLM2's
Q4_1-sourced weights, where our integer zero points (docs/spec/llm.md §3.1) are not. This measures the speed
side of that choice on one SmolLM2-sized MatMul (512 tokens × 576 inputs × 1536 outputs, group 32), one
thread, interleaved:

- FP32: a float MatMul;
- uint8 zero points (ours), accuracy level 4 (int8 compute) and 0 (dequantise + SGEMM);
- float zero points (HQQ's form), levels 4 and 0;
- "rounded + correction": the float zero points' exact equivalent with integer zero points, ``zp = round(z) +
  r``: ``MatMulNBits(x; round(z)) - groupsum(x) @ (r · scale)``, a second MatMul 1/32 the size.

Each file's output is checked against numpy's product of the dequantised weight. Prints CPU time per run and its
ratio to FP32's, with the CPU's ISA flags.

    .venv/bin/python bench/matmulnbits_zero_points.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import interleaved_cpu_time, isa_flags  # noqa: E402

TOKENS, K, N, BLOCK = 512, 576, 1536, 32


def _pack4(codes: np.ndarray) -> np.ndarray:
    """Two 4-bit codes per byte, the lower one first (MatMulNBits' layout)."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def _model(nodes, inits, domains=("com.microsoft",)):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [TOKENS, K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [TOKENS, N])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets)


def _nbits(inputs, level: int, out: str = "Y"):
    from onnx import helper

    return helper.make_node(
        "MatMulNBits", inputs, [out], domain="com.microsoft", K=K, N=N, bits=4, block_size=BLOCK, accuracy_level=level
    )


def build(folder: Path, seed: int = 0) -> tuple[dict[str, str], np.ndarray, dict[str, np.ndarray]]:
    """The files, the input and each file's expected output (numpy, float64)."""
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    blocks = K // BLOCK
    codes = rng.integers(0, 16, size=(N, blocks, BLOCK), dtype=np.uint8)
    scales = (rng.random((N, blocks)) * 0.01 + 1e-3).astype(np.float32)
    zero_float = (rng.integers(0, 16, size=(N, blocks)) + rng.random((N, blocks)) - 0.5).astype(np.float32)
    zero_int = np.clip(np.round(zero_float), 0, 15).astype(np.uint8)
    x = rng.standard_normal((TOKENS, K)).astype(np.float32)

    def expected(zero):
        weight = (codes.astype(np.float64) - zero[..., None]) * scales[..., None]
        return x.astype(np.float64) @ weight.reshape(N, K).T

    b, s = numpy_helper.from_array(_pack4(codes), "B"), numpy_helper.from_array(scales.reshape(-1), "S")
    z_u8 = numpy_helper.from_array(_pack4(zero_int).reshape(-1), "Z")
    z_f = numpy_helper.from_array(zero_float.reshape(-1), "Z")
    float_weight = numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), "W")
    correction = (-(zero_float - zero_int) * scales).T.astype(np.float32)  # (blocks, N)
    grouped = numpy_helper.from_array(np.array([TOKENS, blocks, BLOCK], dtype=np.int64), "grouped")
    last = numpy_helper.from_array(np.array([-1], dtype=np.int64), "last")
    corrected = [
        helper.make_node("Reshape", ["X", "grouped"], ["Xg"]),
        helper.make_node("ReduceSum", ["Xg", "last"], ["Xsum"], keepdims=0),
        helper.make_node("MatMul", ["Xsum", "C"], ["Yc"]),
        helper.make_node("Add", ["Yi", "Yc"], ["Y"]),
    ]
    models = {
        "FP32 MatMul": (_model([helper.make_node("MatMul", ["X", "W"], ["Y"])], [float_weight], ()), None),
        "uint8 zero points, level 4": (_model([_nbits(["X", "B", "S", "Z"], 4)], [b, s, z_u8]), zero_int),
        "uint8 zero points, level 0": (_model([_nbits(["X", "B", "S", "Z"], 0)], [b, s, z_u8]), zero_int),
        "float zero points, level 4": (_model([_nbits(["X", "B", "S", "Z"], 4)], [b, s, z_f]), zero_float),
        "float zero points, level 0": (_model([_nbits(["X", "B", "S", "Z"], 0)], [b, s, z_f]), zero_float),
    }
    for level in (4, 0):
        inits = [b, s, z_u8, numpy_helper.from_array(correction, "C"), grouped, last]
        nodes = [_nbits(["X", "B", "S", "Z"], level, "Yi"), *corrected]
        models[f"rounded + correction, level {level}"] = (_model(nodes, inits), zero_float)
    paths, expect = {}, {}
    for name, (model, zero) in models.items():
        path = folder / f"{len(paths)}.onnx"
        onnx.save(model, path)
        paths[name] = str(path)
        if zero is not None:
            expect[name] = expected(zero)
    return paths, x, expect


def run(rounds: int = 10) -> list[dict]:
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="amct-bench-mnb-") as tmp:
        paths, x, expect = build(Path(tmp))
        rows = []
        for name, path in paths.items():
            row: dict = {"file": name}
            if name in expect:
                y = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
                ref = expect[name]
                row["max_rel_error"] = float(np.abs(y - ref).max() / np.abs(ref).max())
            rows.append(row)
        feeds = {name: {"X": x} for name in paths}
        cpu = interleaved_cpu_time(paths, TOKENS, rounds=rounds, per_round=3, feeds=feeds)
    base = cpu["FP32 MatMul"]["min"]
    for row in rows:
        row["cpu_ms"] = cpu[row["file"]]["min"] * 1e3
        row["vs_fp32"] = cpu[row["file"]]["min"] / base
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    print(f"CPU ISA flags: {' '.join(isa_flags())}; {TOKENS} x {K} @ {K} x {N}, int4 group {BLOCK}, one thread")
    print("\n| file | one-thread CPU ms (min) | vs FP32 | max relative error |")
    print("|---|---|---|---|")
    for row in run(args.rounds):
        error = f"{row['max_rel_error']:.1e}" if "max_rel_error" in row else "–"
        print(f"| {row['file']} | {row['cpu_ms']:.2f} | {row['vs_fp32']:.2f}× | {error} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
