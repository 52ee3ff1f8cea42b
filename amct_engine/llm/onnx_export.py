"""``amct.export_onnx``: a converted LLM as an ONNX file ONNX Runtime runs (docs/spec/llm.md §6).

Route: every quantised module is swapped, for the trace only, for a float stand-in (its dequantised
weight, its input multiplier as a Mul); torch.onnx's dynamo exporter writes the float graph (it handles
Llama's RMSNorm, rotary embedding and SDPA at opset 18); then each stand-in's MatMul, found through the
module path the exporter records on every node (``pkg.torch.onnx.name_scopes``) and checked against its
weight, is replaced by MatMulNBits (weight-only) or int8 nodes (W8A8) built from the module's own codes,
so ORT computes what ``convert`` computes.

A causal LM (a model with a ``config.vocab_size``) is wrapped to map ``input_ids`` to the prefill
``logits`` without a KV cache.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from torch import nn

from amct_engine.export.deploy_target import detect_deploy_target
from amct_engine.llm.onnx_nodes import (
    MS_DOMAIN,
    matmulnbits_node,
    w8a8_qdq_nodes,
    w8a8_static_nodes,
    w8a8_token_nodes,
)
from amct_engine.llm.quant_linear import W8A8Linear, WeightOnlyLinear

OPSET = 18
# MatMulNBits' accuracy_level, chosen by measurement for the CPU that exports (the service measures the file on the
# machine that wrote it): 0 = float32 activations, each weight tile dequantised into MLAS's SGEMM (exactly convert's
# maths); 4 = activations quantised to int8 per block for MLAS's int8 dot-product kernels. Prefill CPU time on one
# thread, ratio to the FP32 file, SmolLM2-135M RTN int4 g32, ORT 1.32 (bench/llm_quant.py; docs/spec/llm.md §7):
# - AMD EPYC, AVX2 without VNNI: 512 tokens 0.98x at level 0 vs 1.04x at level 4 (int8 weight-only: 1.11x vs 1.35x);
#   128 tokens 1.03x at both. One MatMulNBits (K 576, N 1536, block 32/128) at 512 rows: level 0 1.00-1.02x SGEMM,
#   level 4 1.08-1.13x: without VNNI the int8 products (vpmaddubsw) and a float rescale every block do not beat the
#   FMA SGEMM; at 1 row (a decode step) level 4 is 3.4x faster than level 0, but this file is prefill-only.
# - AMD EPYC, AVX-512 VNNI: 512 tokens 0.97x at level 4 vs 1.02x at level 0.
# - Intel Xeon with AMX-INT8 (and AVX-512 VNNI): 512 tokens 1.30x at level 4 vs 0.99x at level 0; one MatMulNBits
#   (K 576, N 1536, block 32) at 512 rows 1.68x vs 1.01x SGEMM (bench/matmulnbits_zero_points.py): two 512-bit FMA
#   units make its SGEMM the faster path (ORT 1.32's int4 kernels do not use AMX).
# So: level 0 on x86 without VNNI and on AMX CPUs, else 4 (ARM unmeasured here: ORT's own quantiser's choice).
ACCURACY_LEVEL_FLOAT = 0
ACCURACY_LEVEL_INT8_DOT = 4
# Static W8A8 as QDQ (ORT fuses it into its uint8 x int8 MatMul: 0.70x FP32 prefill with AVX-512 VNNI) except on x86
# without VNNI, where that kernel (vpmaddubsw) saturates at int16 (a tiny Llama's logits off by 0.2): there it is
# QuantizeLinear + MatMulInteger (int8 x int8, exact; 3x SGEMM's time on one MatMul at 512 rows on AVX2).
EXTERNAL_DATA_BYTES = 1 << 30  # files with more initialiser bytes keep them in `<file>.data` (protobuf's 2 GiB cap)


class _FloatStandIn(nn.Module):
    """What the exporter traces in place of a quantised module: same maths in float."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        if isinstance(module, WeightOnlyLinear):
            weight = module.dequantized_weight()
        else:
            weight = module.weight_codes.float() * module.weight_scale.unsqueeze(1)
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.bias = None if module.bias is None else nn.Parameter(module.bias.clone(), requires_grad=False)
        self.multiplier = module.input_multiplier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.multiplier is not None:
            x = x * self.multiplier
        return nn.functional.linear(x, self.weight, self.bias)


class CausalLMLogits(nn.Module):
    """``input_ids`` (batch, sequence) -> prefill ``logits`` (batch, sequence, vocab), no KV cache."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def quantized_modules(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in model.named_modules() if isinstance(m, (WeightOnlyLinear, W8A8Linear))}


@contextlib.contextmanager
def _float_stand_ins(model: nn.Module, modules: dict[str, nn.Module]) -> Iterator[dict[str, _FloatStandIn]]:
    stand_ins = {name: _FloatStandIn(m) for name, m in modules.items()}

    def put(replacements: dict[str, nn.Module]) -> None:
        for name, module in replacements.items():
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, module)

    put(stand_ins)
    try:
        yield stand_ins
    finally:
        put(modules)


def _scope_of(node: onnx.NodeProto) -> list[str]:
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            return [s.strip(" '\"") for s in prop.value.strip("[]").split(",")]
    return []


def _find_matmuls(
    model: onnx.ModelProto, names: list[str], prefix: str, stand_ins: dict[str, _FloatStandIn]
) -> dict[str, onnx.NodeProto]:
    """Module path -> the MatMul the exporter wrote for it (the last scope entry that is the module; else the one
    MatMul whose constant weight is the module's, see _match_by_weight)."""
    found: dict[str, onnx.NodeProto] = {}
    wanted = {prefix + n: n for n in names}
    for node in model.graph.node:
        if node.op_type != "MatMul":
            continue
        for scope in _scope_of(node):
            if scope in wanted:
                found[wanted[scope]] = node
    missing = sorted(set(names) - set(found))
    if missing:
        found.update(_match_by_weight(model, missing, stand_ins, {id(n) for n in found.values()}))
        missing = sorted(set(names) - set(found))
    if missing:
        raise RuntimeError(f"export_onnx: no MatMul found for the quantised modules {missing[:5]}")
    return found


def _match_by_weight(
    model: onnx.ModelProto, names: list[str], stand_ins: dict[str, _FloatStandIn], taken: set[int]
) -> dict[str, onnx.NodeProto]:
    """Module path -> the one MatMul whose constant weight equals the module's stand-in weight, for modules the
    exporter recorded no scope for: a model captured from TorchScript is an fx GraphModule, whose calls of its
    Linears the exporter inlines without their module path. A weight that two MatMuls carry stays unmatched."""
    candidates = []
    for node in model.graph.node:
        if node.op_type == "MatMul" and id(node) not in taken:
            try:
                candidates.append((node, _weight_of(model, node)))
            except RuntimeError:  # an activation x activation MatMul (attention)
                continue
    found: dict[str, onnx.NodeProto] = {}
    for name in names:
        expected = stand_ins[name].weight.detach().numpy().T
        hits = [n for n, w in candidates if w.shape == expected.shape and np.array_equal(w, expected)]
        if len(hits) == 1:
            found[name] = hits[0]
    return found


def _weight_of(model: onnx.ModelProto, node: onnx.NodeProto) -> np.ndarray:
    """B of a MatMul as written: an initialiser, or a Transpose of one."""
    inits = {t.name: t for t in model.graph.initializer}
    name = node.input[1]
    if name in inits:
        return numpy_helper.to_array(inits[name])
    producer = next((n for n in model.graph.node if name in n.output), None)
    if producer is not None and producer.op_type == "Transpose" and producer.input[0] in inits:
        return numpy_helper.to_array(inits[producer.input[0]]).T
    raise RuntimeError(f"export_onnx: the weight of {node.name} is not a constant")


def _replacement(
    name: str, node: onnx.NodeProto, module: nn.Module, accuracy_level: int, w8a8_qdq: bool
) -> tuple[list, list]:
    a, out = node.input[0], node.output[0]
    if isinstance(module, WeightOnlyLinear):
        return matmulnbits_node(
            name,
            a,
            out,
            module.codes.numpy(),
            module.scales.numpy(),
            module.zero_points.numpy(),
            module.group_size,
            module.bits,
            module.symmetric,
            accuracy_level,
        )
    codes, scale = module.weight_codes.numpy(), module.weight_scale.numpy()
    if module.input_scale is None:
        return w8a8_token_nodes(name, a, out, codes, scale)
    static = w8a8_qdq_nodes if w8a8_qdq else w8a8_static_nodes
    return static(name, a, out, codes, scale, module.input_scale)


def _rewrite(
    model: onnx.ModelProto, modules: dict[str, nn.Module], stand_ins, prefix: str, accuracy_level: int, w8a8_qdq: bool
):
    matmuls = _find_matmuls(model, list(modules), prefix, stand_ins)
    position = {id(n): i for i, n in enumerate(model.graph.node)}
    new_nodes: dict[int, list] = {}
    for name, node in matmuls.items():
        expected = stand_ins[name].weight.detach().numpy().T
        written = _weight_of(model, node)
        if written.shape != expected.shape or not np.allclose(written, expected, rtol=1e-5, atol=1e-6):
            raise RuntimeError(f"export_onnx: the MatMul found for {name} does not carry its weight")
        nodes, inits = _replacement(name, node, modules[name], accuracy_level, w8a8_qdq)
        new_nodes[position[id(node)]] = nodes
        model.graph.initializer.extend(inits)
    rebuilt = []
    for i, node in enumerate(model.graph.node):
        rebuilt.extend(new_nodes.get(i, [node]))
    del model.graph.node[:]
    model.graph.node.extend(rebuilt)
    _drop_unused(model)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))


def _drop_unused(model: onnx.ModelProto) -> None:
    """Remove initialisers (the float weights) and nodes (their Transposes) nothing reads any more."""
    while True:
        used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
        dead = [n for n in model.graph.node if not any(o in used for o in n.output)]
        for node in dead:
            model.graph.node.remove(node)
        if not dead:
            break
    used = {i for n in model.graph.node for i in n.input}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)


def accuracy_level_for_cpu(machine: str | None = None, flags: set[str] | None = None) -> int:
    """MatMulNBits' accuracy_level that prefills faster on this CPU (or the one ``machine``/``flags`` describe)."""
    target = detect_deploy_target(machine, flags)
    return ACCURACY_LEVEL_FLOAT if target in ("x86_avx2", "x86_amx") else ACCURACY_LEVEL_INT8_DOT


def _is_causal_lm(model: nn.Module) -> bool:
    return hasattr(getattr(model, "config", None), "vocab_size")


def _trace_batch(args: tuple, dynamic_axes: dict[str, dict[int, str]], input_names: list[str]) -> tuple:
    """torch.export specialises a size-1 dimension to the constant 1: trace a dynamic batch of 1 as 2 rows."""
    first = args[0]
    if isinstance(first, torch.Tensor) and first.shape[0] == 1 and 0 in dynamic_axes.get(input_names[0], {}):
        return (first.repeat(2, *([1] * (first.dim() - 1))), *args[1:])
    return args


def _save(model: onnx.ModelProto, path: Path) -> None:
    size = sum(len(t.raw_data) for t in model.graph.initializer)
    if size > EXTERNAL_DATA_BYTES:
        data = path.name + ".data"
        onnx.save_model(model, os.fspath(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data)
    else:
        onnx.save_model(model, os.fspath(path))


def export_onnx(
    model: nn.Module,
    save_path: str | os.PathLike,
    input_data: Any,
    dynamic_axes: dict[str, dict[int, str]] | None = None,
    accuracy_level: int | None = None,
    w8a8_qdq: bool | None = None,
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
) -> Path:
    """Write ``model`` (after ``amct.convert``, or a float model) to ``save_path``; returns the path.

    ``input_data``: a tensor or tuple of example inputs (``input_ids`` for a causal LM). ``dynamic_axes``
    as in ``torch.onnx.export``; for a causal LM the batch and sequence axes are dynamic by default.
    ``accuracy_level``: MatMulNBits' attribute (0: float32 activations, as convert computes; 4: int8 activations);
    None: the faster one on this CPU (``accuracy_level_for_cpu``: 0 on x86 without VNNI, else 4). ``w8a8_qdq``:
    static W8A8 as QDQ (True) or QuantizeLinear + MatMulInteger (False); None: QDQ unless on x86 without VNNI."""
    if accuracy_level is None:
        accuracy_level = accuracy_level_for_cpu()
    if w8a8_qdq is None:
        w8a8_qdq = detect_deploy_target() != "x86_avx2"
    if accuracy_level not in (0, 1, 2, 3, 4):
        raise ValueError(f"export_onnx: accuracy_level must be 0-4 (MatMulNBits), got {accuracy_level!r}")
    path = Path(save_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    args = input_data if isinstance(input_data, tuple) else (input_data,)
    causal = _is_causal_lm(model)
    module, prefix = (CausalLMLogits(model), "model.") if causal else (model, "")
    if causal:
        input_names = input_names or ["input_ids"]
        output_names = output_names or ["logits"]
        if dynamic_axes is None:
            dynamic_axes = {"input_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}}
        args = _trace_batch(args, dynamic_axes, input_names)
    modules = quantized_modules(model)
    was_training = model.training
    module.eval()  # the model, and a causal LM's wrapper (torch.onnx warns of a module in training mode)
    try:
        with _float_stand_ins(model, modules) as stand_ins, torch.no_grad():
            program = torch.onnx.export(
                module,
                args,
                dynamo=True,
                opset_version=OPSET,
                input_names=input_names,
                output_names=output_names,
                dynamic_axes=dynamic_axes,
                verbose=False,
            )
            onnx_model = program.model_proto
            if modules:
                _rewrite(onnx_model, modules, stand_ins, prefix, accuracy_level, w8a8_qdq)
    finally:
        model.train(was_training)
    _save(onnx_model, path)
    return path
