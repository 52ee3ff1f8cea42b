"""Modern transformer ops through capture, PTQ and ONNX export (issue 38 item 1, docs/spec/engine.md §5.3).

RMSNorm (`nn.RMSNorm`, transformers' own), rotary position embeddings, `scaled_dot_product_attention` with a
padding mask and with grouped-query heads, GELU (erf and tanh), SwiGLU, GeGLU, relu² and an LM head tied to
the embedding, in a Llama model built from a transformers config and in a module written here; each as an
nn.Module and as a TorchScript trace with int64 `input_ids` + `attention_mask` (a named `seq` axis).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import amct_engine as amct
from amct_engine.export.qdq.fusion_report import deploy_report, optimized_ops
from amct_engine.export.save import export_onnx
from amct_engine.graph.errors import GraphCaptureError

NAMES = ["input_ids", "attention_mask"]
DYNAMIC = {"input_ids": {0: "n", 1: "seq"}, "attention_mask": {0: "n", 1: "seq"}, "logits": {0: "n"}}
LENGTHS = (7, 32, 100)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of [B, H, S, D] (the half-split form Llama uses)."""
    d = x.shape[-1]
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    freqs = torch.outer(torch.arange(x.shape[-2], dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


class Block(nn.Module):
    """Pre-norm block: RMSNorm, attention with RoPE (grouped-query heads when `kv_heads` < `heads`), and a
    feed-forward of kind swiglu / geglu (GELU tanh) / relu2 / gelu (erf)."""

    def __init__(self, d: int, heads: int, kv_heads: int, ffn: int, kind: str):
        super().__init__()
        self.heads, self.kv_heads, self.kind, self.head_dim = heads, kv_heads, kind, d // heads
        self.norm1, self.norm2 = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d)  # eps None: torch's default
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, 2 * ffn if kind in ("swiglu", "geglu") else ffn)
        self.down = nn.Linear(ffn, d)
        self.gelu_tanh = nn.GELU(approximate="tanh")

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(
            rotate(q), rotate(k), v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads
        )
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        h = self.up(self.norm2(x))
        if self.kind == "swiglu":
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        elif self.kind == "geglu":
            gate, value = h.chunk(2, dim=-1)
            h = self.gelu_tanh(gate) * value
        elif self.kind == "relu2":
            h = F.relu(h).square()
        else:
            h = F.gelu(h)
        return x + self.down(h)


class ModernEncoder(nn.Module):
    """Four blocks, one per feed-forward kind (the relu² one with grouped-query attention), a final RMSNorm
    and per-token logits from an LM head tied to the embedding."""

    def __init__(self, vocab: int = 300, d: int = 64, heads: int = 4, ffn: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        kinds = (("swiglu", heads), ("geglu", heads), ("relu2", heads // 2), ("gelu", heads))
        self.blocks = nn.ModuleList(Block(d, heads, kv, ffn, kind) for kind, kv in kinds)
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        mask = attention_mask[:, None, None, :].bool()
        for block in self.blocks:
            x = block(x, mask)
        return self.lm_head(self.norm(x))


class LlamaClassifier(nn.Module):
    """transformers' LlamaForSequenceClassification (RMSNorm, RoPE, SwiGLU, grouped-query SDPA), logits only."""

    def __init__(self, use_cache: bool):
        super().__init__()
        from transformers import LlamaConfig, LlamaForSequenceClassification

        config = LlamaConfig(
            vocab_size=300,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            pad_token_id=0,
            use_cache=use_cache,
            attn_implementation="sdpa",
        )
        self.m = LlamaForSequenceClassification(config).eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=input_ids, attention_mask=attention_mask).logits


def tokens(batch: int, seq: int, seed: int, vocab: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (never the pad id 0) and a mask that pads the second row from half its length."""
    ids = torch.randint(1, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, seq // 2 :] = 0
    return ids, mask


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


class Norms(nn.Module):
    """nn.RMSNorm (eps None), F.rms_norm over two axes with a given eps, and grouped-query attention."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(32)
        self.weight = nn.Parameter(torch.rand(4, 8) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        z = F.rms_norm(y.view(*y.shape[:-1], 4, 8), [4, 8], self.weight, 1e-5).flatten(-2)
        q = z.view(z.shape[0], z.shape[1], 4, 8).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q[:, :2], q[:, :2], is_causal=True, enable_gqa=True)


def test_rms_norm_and_grouped_query_attention_export_and_fuse(tmp_path):
    torch.manual_seed(0)
    model = Norms().eval()
    path = str(tmp_path / "norms.onnx")
    export_onnx(model, path, (torch.randn(2, 16, 32),), ["x"], ["y"], {"x": {0: "n", 1: "seq"}})
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for seq in LENGTHS:
        x = torch.randn(3, seq, 32)
        with torch.no_grad():
            expected = model(x).numpy()
        np.testing.assert_allclose(session.run(None, {"x": x.numpy()})[0], expected, atol=2e-5, rtol=1e-4)
    # both norms written in the pattern ORT fuses into its RMSNorm kernel (the one over the last axis only)
    ops = [n.op_type for n in optimized_ops(onnx.load(path)).graph.node]
    assert ops.count("SimplifiedLayerNormalization") == 1
    assert "Pow" in ops  # the two-axis one stays decomposed, and still runs


MODELS = {
    # use_cache=True, transformers' default: the empty DynamicCache is dropped at capture (graph/empty_caches.py)
    "llama-module": (lambda: LlamaClassifier(use_cache=True), False, "m.model.layers.1.mlp.down_proj"),
    # a traced file with use_cache=True does not convert (docs/spec/engine.md §5.3): traced without it
    "llama-torchscript": (lambda: LlamaClassifier(use_cache=False), True, "m.model.layers.1.mlp.down_proj"),
    "modern-module": (ModernEncoder, False, "blocks.2.kv"),
    "modern-torchscript": (ModernEncoder, True, "blocks.2.kv"),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_ptq_deploy_runs_at_other_lengths(tmp_path, name):
    build, traced, a_layer = MODELS[name]
    torch.manual_seed(0)
    fp32 = build().eval()
    example = tokens(2, 16, seed=0)
    model = torch.jit.trace(fp32, example) if traced else fp32
    config, onnx_file, record = (str(tmp_path / f) for f in ("q.json", "m.onnx", "r.txt"))
    amct.create_quant_config(config, model, example, batch_num=2)
    calibration = amct.quantize_model(
        config, onnx_file, record, model, example, input_names=NAMES, output_names=["logits"], dynamic_axes=DYNAMIC
    )
    with torch.no_grad():
        for seed in (1, 2):
            calibration(*tokens(8, 24, seed))
    amct.save_model(onnx_file, record, str(tmp_path / "out"))
    deploy = str(tmp_path / "out_deploy_model.onnx")

    report = deploy_report(deploy)
    assert a_layer in report["layers"], sorted(report["layers"])  # the nn.Module's names, traced or not
    assert set(report["layers"].values()) == {"MatMulIntegerToFloat"} and not report["not_fused"]
    assert report["optimized_op_counts"]["SimplifiedLayerNormalization"] >= 5
    session = ort.InferenceSession(deploy, providers=["CPUExecutionProvider"])
    for seq in LENGTHS:
        ids, mask = tokens(3, seq, seed=seq)
        out = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
        with torch.no_grad():
            quantised, reference = calibration(ids, mask).numpy(), fp32(ids, mask).numpy()
        assert relative_error(out, quantised) < 0.01, seq  # the file computes the PyTorch quantised model
        assert relative_error(out, reference) < 0.1, seq
        assert np.mean(out.argmax(-1) == reference.argmax(-1)) >= 0.9, seq


def test_torchscript_traced_with_cache_names_the_fix(tmp_path):
    """A Llama traced with use_cache=True (its config's default) does not convert: the error says what to do."""
    torch.manual_seed(0)
    example = tokens(2, 16, seed=0)
    traced = torch.jit.trace(LlamaClassifier(use_cache=True).eval(), example)
    with pytest.raises(GraphCaptureError, match=r"use_cache=False"):
        amct.create_quant_config(str(tmp_path / "q.json"), traced, example)


def test_a_torchscript_scope_gets_the_module_path_with_the_fewest_names_inserted():
    """TorchScript's scopes leave out a ModuleList's own name (`encoder.0.output.dense`); of the module paths
    that hold those names in order, the one with the list's name only is the module, not a deeper one."""
    from amct_engine.graph.lifting import Scope
    from amct_engine.graph.torchscript import _full_path

    paths = {"encoder.layer.0.output.dense", "encoder.layer.0.attention.output.dense", "encoder.layer.0.output"}
    assert _full_path(Scope("encoder.0.output.dense", "Linear"), paths).path == "encoder.layer.0.output.dense"
    assert _full_path(Scope("encoder.0.attention.output.dense", "Linear"), paths).path == (
        "encoder.layer.0.attention.output.dense"
    )
    ambiguous = {"a.x.0.fc", "a.y.0.fc"}  # two lists at the same depth: left as TorchScript named it
    assert _full_path(Scope("a.0.fc", "Linear"), ambiguous).path == "a.0.fc"
