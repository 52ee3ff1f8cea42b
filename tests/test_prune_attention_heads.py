"""Attention-head pruning (docs/spec/engine.md §4.4 "Attention heads"): a small random BertModel and a
hand-written attention block lose whole heads through the prune API, physically, and the exported ONNX
runs at several sequence lengths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import amct_engine.prune_retrain as amct
from amct_engine.config.errors import ConfigError
from amct_engine.prune.report import PRUNED

transformers = pytest.importorskip("transformers")

HIDDEN, HEADS, LAYERS, HEAD_DIM = 64, 4, 2, 16
PROJECTIONS = ("query", "key", "value")


def _head_cfg(tmp_path, layers: list[str], ratio: float = 0.5) -> str:
    entries = "".join(
        f"""override_layer_configs {{
    layer_name: "{name}"
    prune_config {{ filter_pruner {{ balanced_l2_norm_filter_prune {{
        prune_ratio: {ratio} ascend_optimized: false granularity: HEAD }} }} }}
}}
"""
        for name in layers
    )
    path = tmp_path / "heads.cfg"
    path.write_text(entries)
    return str(path)


def _bert() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_hidden_layers=LAYERS,
        intermediate_size=128,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    return transformers.BertModel(config).eval()


def _tokens(length: int, batch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(0, 100, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, length - length // 3 :] = 0  # padding in the second sentence
    return ids, mask


def _qkv(layer: int) -> list[str]:
    return [f"encoder.layer.{layer}.attention.self.{p}" for p in PROJECTIONS]


def _removed_heads(original: nn.Module, pruned: nn.Module, layer: int) -> list[int]:
    """The heads of ``layer`` whose query rows are gone (the kept rows are the original's, in order)."""
    before = original.get_submodule(_qkv(layer)[0]).weight.detach()
    after = pruned.get_submodule(_qkv(layer)[0]).weight.detach()
    kept = [h for h in range(HEADS) if any(torch.equal(before[h * HEAD_DIM], row) for row in after)]
    return [h for h in range(HEADS) if h not in kept]


def _masked_reference(model: nn.Module, removed: dict[int, list[int]], inputs) -> torch.Tensor:
    """The original model with the removed heads' context zeroed before the output projection: what a
    model without those heads computes."""
    handles = []
    for layer, heads in removed.items():
        dense = model.get_submodule(f"encoder.layer.{layer}.attention.output.dense")
        keep = torch.ones(HIDDEN)
        for h in heads:
            keep[h * HEAD_DIM : (h + 1) * HEAD_DIM] = 0
        handles.append(dense.register_forward_pre_hook(lambda _m, args, k=keep: (args[0] * k,)))
    try:
        with torch.no_grad():
            return model(*inputs).last_hidden_state
    finally:
        for handle in handles:
            handle.remove()


@pytest.fixture(scope="module")
def pruned_bert(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("heads")
    original = _bert()
    layers = [name for layer in range(LAYERS) for name in _qkv(layer)]
    record = tmp_path / "record.txt"
    pruned = amct.create_prune_retrain_model(original, _tokens(16), _head_cfg(tmp_path, layers), str(record))
    return original, pruned.eval(), tmp_path


def test_half_the_heads_leave_the_weights(pruned_bert):
    original, pruned, _ = pruned_bert
    for layer in range(LAYERS):
        for name in _qkv(layer):
            assert tuple(pruned.get_submodule(name).weight.shape) == (HIDDEN // 2, HIDDEN)
            assert tuple(pruned.get_submodule(name).bias.shape) == (HIDDEN // 2,)
        dense = pruned.get_submodule(f"encoder.layer.{layer}.attention.output.dense")
        assert tuple(dense.weight.shape) == (HIDDEN, HIDDEN // 2)
        assert len(_removed_heads(original, pruned, layer)) == HEADS // 2
    groups = [g for g in pruned.amct_prune_report.groups if g.status == PRUNED]
    assert sorted((g.channels, g.kept) for g in groups) == [(HEADS, HEADS // 2)] * LAYERS


def test_pruned_model_equals_the_original_with_those_heads_masked(pruned_bert):
    original, pruned, _ = pruned_bert
    removed = {layer: _removed_heads(original, pruned, layer) for layer in range(LAYERS)}
    for length in (5, 16, 40):
        inputs = _tokens(length)
        with torch.no_grad():
            got = pruned(*inputs)
        got = got["last_hidden_state"] if isinstance(got, dict) else got[0]
        want = _masked_reference(original, removed, inputs)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_exported_graph_runs_at_several_lengths(pruned_bert):
    original, pruned, tmp_path = pruned_bert
    removed = {layer: _removed_heads(original, pruned, layer) for layer in range(LAYERS)}
    paths = amct.save_prune_retrain_model(
        pruned,
        str(tmp_path / "bert"),
        _tokens(16),
        input_names=["input_ids", "attention_mask"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
    )
    session = ort.InferenceSession(paths["deploy"], providers=["CPUExecutionProvider"])
    for length in (5, 16, 40):
        ids, mask = _tokens(length)
        got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
        want = _masked_reference(original, removed, (ids, mask)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_restore_replays_the_removed_heads(pruned_bert):
    _, pruned, tmp_path = pruned_bert
    torch.save(pruned.state_dict(), tmp_path / "pruned.pth")
    restored = amct.restore_prune_retrain_model(
        _bert(), _tokens(16), str(tmp_path / "record.txt"), str(tmp_path / "heads.cfg"), str(tmp_path / "pruned.pth")
    ).eval()
    for length in (5, 40):
        inputs = _tokens(length)
        with torch.no_grad():
            assert torch.equal(restored(*inputs)["last_hidden_state"], pruned(*inputs)["last_hidden_state"])


class HandAttention(nn.Module):
    """Self-attention written out: literal head counts in the views, F.scaled_dot_product_attention."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.ffn = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, self.heads, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        context = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, self.heads * self.head_dim)
        return self.ffn(x + self.out(context))


def test_hand_written_attention_loses_heads_and_keeps_running(tmp_path):
    torch.manual_seed(1)
    model = HandAttention().eval()
    x = torch.randn(2, 7, 32)
    pruned = amct.create_prune_retrain_model(
        model, x, _head_cfg(tmp_path, ["q", "k", "v"], ratio=0.25), str(tmp_path / "r.txt")
    )
    assert [tuple(pruned.get_submodule(n).weight.shape) for n in ("q", "k", "v", "out")] == [
        (24, 32),
        (24, 32),
        (24, 32),
        (32, 24),
    ]
    assert pruned.heads == 3  # its forward reshapes with the attribute
    x = torch.randn(3, 11, 32)
    with torch.no_grad():
        assert tuple(pruned(x).shape) == (3, 11, 32)
    torch.save(pruned.state_dict(), tmp_path / "p.pth")
    restored = amct.restore_prune_retrain_model(
        HandAttention(), x, str(tmp_path / "r.txt"), str(tmp_path / "heads.cfg"), str(tmp_path / "p.pth")
    ).eval()
    with torch.no_grad():
        assert torch.equal(restored(x), pruned(x))


def test_literal_head_counts_of_a_traced_graph_become_inferred(tmp_path):
    torch.manual_seed(2)
    traced = torch.fx.symbolic_trace(HandAttention().eval())  # view(b, s, 4, 8), reshape(b, s, 32)
    x = torch.randn(2, 7, 32)
    pruned = amct.create_prune_retrain_model(
        traced, x, _head_cfg(tmp_path, ["q", "k", "v"], ratio=0.5), str(tmp_path / "r.txt")
    )
    sizes = [n.args[1:] for n in pruned.graph.nodes if n.target in ("view", "reshape")]
    assert [s[2:] for s in sizes] == [(-1, 8)] * 3 + [(-1,)]
    assert tuple(pruned.get_submodule("out").weight.shape) == (32, 16)
    with torch.no_grad():
        assert tuple(pruned(torch.randn(3, 11, 32)).shape) == (3, 11, 32)


class HeadClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block, self.fc = HandAttention(), nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.block(x).mean(dim=1))


@pytest.mark.parametrize("importance", ["group_l2", "taylor"])
def test_other_criteria_rank_whole_heads(tmp_path, importance):
    torch.manual_seed(3)
    cfg = Path(_head_cfg(tmp_path, [f"block.{p}" for p in "qkv"]))
    cfg.write_text(cfg.read_text().replace("granularity: HEAD", f'granularity: HEAD importance: "{importance}"'))
    data = [(torch.randn(4, 7, 32), torch.randint(0, 5, (4,))) for _ in range(2)]  # taylor's gradients
    pruned = amct.create_prune_retrain_model(
        HeadClassifier().eval(), torch.randn(2, 7, 32), str(cfg), str(tmp_path / "r.txt"), calibration_data=data
    )
    assert (pruned.block.heads, tuple(pruned.block.out.weight.shape)) == (2, (32, 16))
    (group,) = [g for g in pruned.amct_prune_report.groups if "block.q" in g.producers]
    assert (group.status, group.importance) == (PRUNED, importance)


def test_head_granularity_on_a_layer_outside_attention_is_reported(tmp_path):
    model = HandAttention().eval()
    pruned = amct.create_prune_retrain_model(
        model, torch.randn(2, 7, 32), _head_cfg(tmp_path, ["ffn"]), str(tmp_path / "r.txt")
    )
    assert pruned.get_submodule("ffn").weight.shape[0] == 32
    reasons = [g.reason for g in pruned.amct_prune_report.groups if "ffn" in g.producers]
    assert any("HEAD granularity" in r for r in reasons)


def test_unknown_granularity_is_a_config_error(tmp_path):
    path = tmp_path / "bad.cfg"
    path.write_text(
        "prune_config { filter_pruner { balanced_l2_norm_filter_prune { prune_ratio: 0.5 granularity: ROW } } }\n"
    )
    with pytest.raises(ConfigError, match="granularity"):
        amct.create_prune_retrain_model(HandAttention(), torch.randn(2, 7, 32), str(path), str(tmp_path / "r.txt"))
