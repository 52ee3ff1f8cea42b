"""A BERT-class classifier through one service job (issue 38, item 6): attention heads and FFN neurons pruned,
INT8 everywhere, trained against its FP32 self mixed with the labels (distill_outputs, distill_alpha 0.5).

A small random-config BertModel + a linear head over the mask-mean of its tokens, trained here on a keyword
task (which of three keyword tokens a row of random tokens holds), traced with `input_ids` and
`attention_mask` whose sequence axis is dynamic, goes through `amct jobs submit` to the live embedded server
(`python -m service serve`); the deploy ONNX it returns has half the heads and half the FFN neurons gone from
its weights, runs at three sequence lengths, and its report states size, speed at the dataset's length and at
128 tokens, held-out accuracy, agreement and the pruned counts (docs/service.md, "A transformer in one job").
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from service.client import AmctClient, ApiError
from tests.service.test_cli import amct

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

HIDDEN, HEADS, LAYERS, FFN, CLASSES, SEQ = 32, 4, 2, 64, 3, 24
TOKENS = [
    {"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64"},
    {"name": "attention_mask", "shape": ["batch", "seq"], "dtype": "int64"},
]
PRUNE = "balanced_l2_norm_filter_prune {{ prune_ratio: 0.5 ascend_optimized: false{} }}"
# Half the FFN neurons (the global filter prune: in a BERT layer only the intermediate Linear's channels form a
# prunable group), half the heads of every attention block (HEAD granularity on its q/k/v, by the layer names
# of the traced file), every Linear INT8.
CFG = (
    f"prune_config {{ filter_pruner {{ {PRUNE.format('')} }} }}\n"
    + "".join(
        f'override_layer_configs {{ layer_name: "bert.encoder.layer.{layer}.attention.self.{projection}" '
        f"prune_config {{ filter_pruner {{ {PRUNE.format(' granularity: HEAD')} }} }} }}\n"
        for layer in range(LAYERS)
        for projection in ("query", "key", "value")
    )
    + "retrain_data_quant_config { ulq_quantize { dst_type: INT8 } }\n"
    + "retrain_weight_quant_config { arq_retrain { channel_wise: true dst_type: INT8 } }\n"
)


class TinyBertClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        config = transformers.BertConfig(
            vocab_size=100,
            hidden_size=HIDDEN,
            num_attention_heads=HEADS,
            num_hidden_layers=LAYERS,
            intermediate_size=FFN,
            max_position_embeddings=160,  # 128 tokens fit: the report times the files there too
            attn_implementation="sdpa",
        )
        self.bert = transformers.BertModel(config)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
        return self.head((tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1e-9))


def keyword_rows(n: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random tokens 10-99 with keyword token 1 + label at two places in the unpadded part; every third row
    padded (id 0, mask 0) over its last third."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 100, (n, length), generator=gen)
    mask = torch.ones(n, length, dtype=torch.long)
    labels = torch.randint(0, CLASSES, (n,), generator=gen)
    used = torch.full((n,), length)
    used[::3] = length - length // 3
    for row in range(n):
        ids[row, torch.randint(0, int(used[row]), (2,), generator=gen)] = 1 + labels[row]
        ids[row, used[row] :], mask[row, used[row] :] = 0, 0
    return ids, mask, labels


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """The trained FP32 classifier, its TorchScript trace, the cfg and a labelled dataset of 24-token rows."""
    folder = tmp_path_factory.mktemp("transformer-job")
    torch.manual_seed(0)
    model = TinyBertClassifier()
    ids, mask, labels = keyword_rows(512, SEQ, seed=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(40):
        rows = torch.arange(step * 32, step * 32 + 32) % len(labels)
        loss = F.cross_entropy(model(ids[rows], mask[rows]), labels[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        torch.jit.trace(model, (ids[:2], mask[:2]), strict=False).save(str(folder / "bert.pt"))
    (folder / "compressed.cfg").write_text(CFG)
    job_ids, job_mask, job_labels = keyword_rows(192, SEQ, seed=2)
    np.savez(
        folder / "tokens.npz",
        input_ids=job_ids.numpy(),
        attention_mask=job_mask.numpy(),
        labels=job_labels.numpy(),
    )
    np.savez(folder / "unlabelled.npz", input_ids=job_ids.numpy(), attention_mask=job_mask.numpy())
    return model, folder


def _weight_shapes(path) -> dict[str, tuple[int, ...]]:
    """The 2-D initializers of an ONNX file by name: its embedding tables and Linear weights."""
    return {t.name: tuple(t.dims) for t in onnx.load(str(path)).graph.initializer if len(t.dims) == 2}


def test_a_bert_classifier_loses_heads_and_ffn_neurons_in_one_compressed_retrain_job(live_server, task, tmp_path):
    model, folder = task
    server = ["--server", live_server.base_url, "--data-dir", live_server.data_dir]
    submitted = amct(
        "jobs",
        "submit",
        "--model",
        folder / "bert.pt",
        "--inputs",
        json.dumps(TOKENS),
        "--cfg",
        folder / "compressed.cfg",
        "--data",
        folder / "tokens.npz",
        "--kind",
        "compressed_retrain",
        "--objective",
        "distill_outputs",
        "--distill-alpha",
        0.5,
        "--temperature",
        2,
        "--epochs",
        2,
        "--batch-size",
        16,
        "--lr",
        1e-3,
        "--eval-fraction",
        0.25,
        *server,
    )
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.stdout.strip()

    with AmctClient(live_server.base_url, live_server.api_key) as client:
        job = client.get(job_id)
        assert job["params"]["distill_alpha"] == 0.5 and job["params"]["objective"] == "distill_outputs"
        # The KD + CE mix needs labels to mix in, and a weight in [0, 1]: refused at submit, the field named.
        unlabelled = client.upload_dataset(folder / "unlabelled.npz")
        for dataset, alpha in ((unlabelled["id"], 0.5), (job["dataset_id"], 1.5)):
            with pytest.raises(ApiError) as refused:
                client.submit(
                    "compressed_retrain",
                    job["model_id"],
                    job["config_id"],
                    dataset,
                    objective="distill_outputs",
                    distill_alpha=alpha,
                )
            assert refused.value.status == 422 and refused.value.field == "distill_alpha", refused.value

    watched = amct("jobs", "watch", job_id, *server)
    assert watched.exit_code == 0, watched.output
    kinds = ("--kind", "deploy", "--kind", "fp32_onnx", "--kind", "report")
    fetched = amct("jobs", "download", job_id, *kinds, "--out", tmp_path, *server)
    assert fetched.exit_code == 0, fetched.output
    report = json.loads((tmp_path / "report.json").read_text())
    deploy = next(tmp_path.glob("*deploy*.onnx"))

    # Half the heads left every attention block physically: q/k/v keep 2 heads of 8 features, the output
    # projection takes 16 features; the FFN keeps 32 of 64 neurons. (MatMul layout: [in, out].)
    fp32_shapes = Counter(_weight_shapes(next(tmp_path.glob("fp32*.onnx"))).values())
    assert fp32_shapes[(HIDDEN, HIDDEN)] == 4 * LAYERS and fp32_shapes[(HIDDEN, FFN)] == LAYERS, fp32_shapes
    shapes = _weight_shapes(deploy)  # the quantised export keeps the layers' names
    for layer in range(LAYERS):
        prefix = f"bert.encoder.layer.{layer}."
        for projection in ("query", "key", "value"):
            assert shapes[f"{prefix}attention.self.{projection}.weight"] == (HIDDEN, HIDDEN // 2)
        assert shapes[f"{prefix}attention.output.dense.weight"] == (HIDDEN // 2, HIDDEN)
        assert shapes[f"{prefix}intermediate.dense.weight"] == (HIDDEN, FFN // 2)
        assert shapes[f"{prefix}output.dense.weight"] == (FFN // 2, HIDDEN)
    assert report["pruning"]["heads"] == {"groups": LAYERS, "before": LAYERS * HEADS, "after": LAYERS * HEADS // 2}
    assert report["pruning"]["channels"] == {"groups": LAYERS, "before": LAYERS * FFN, "after": LAYERS * FFN // 2}

    # The deploy file runs at lengths other than the dataset's, agreeing with the FP32 model on held-out rows.
    session = ort.InferenceSession(str(deploy), providers=["CPUExecutionProvider"])
    agreement = {}
    for length, batch in ((7, 1), (SEQ, 16), (128, 4)):
        ids, mask, labels = keyword_rows(64, length, seed=100 + length)
        runs = [
            session.run(None, {"input_ids": ids[i : i + batch].numpy(), "attention_mask": mask[i : i + batch].numpy()})
            for i in range(0, 64, batch)
        ]
        logits = np.concatenate([outputs[0] for outputs in runs])
        assert logits.shape == (64, CLASSES)
        with torch.no_grad():
            agreement[length] = float((logits.argmax(1) == model(ids, mask).argmax(1).numpy()).mean())
    assert min(agreement.values()) >= 0.8, agreement

    # The report: bytes, speed at the dataset's 24 tokens and at 128, task accuracy and agreement, the recipe.
    assert 0 < report["size_ratio"] < 0.7, report["onnx_size_bytes"]
    latency = report["latency_ms"]
    assert latency["lengths"] == {"seq": SEQ} and latency["speedup"] > 0
    at_128 = {row["batch"]: row for row in latency["other_lengths"]}
    assert set(at_128) == {2, 8} and all(r["size"] == 128 and r["dataset_size"] == SEQ for r in at_128.values())
    assert all(r["speedup"] > 0 and r["deploy"]["median"] > 0 for r in at_128.values())
    accuracy = report["accuracy"]
    assert report["eval"] == {"split": "held_out", "samples": 48}
    assert accuracy["fp32"] >= 0.9 and accuracy["deploy"] >= accuracy["fp32"] - 0.15, accuracy
    assert report["agreement_with_original"]["deploy"]["top1_agreement"] >= 0.8
    assert report["training"]["objective"] == "distill_outputs" and report["training"]["distill_alpha"] == 0.5
    assert report["training"]["distill_loss"] == {"output": "kl"}
    print(
        f"\ntiny BERT compressed_retrain: size {report['size_ratio']:.3f}x, accuracy {accuracy['fp32']:.3f} -> "
        f"{accuracy['deploy']:.3f}, speed-up seq {SEQ} {latency['speedup']:.2f}x / seq 128 "
        f"{at_128[2]['speedup']:.2f}x (batch 2), agreement at 7/24/128 tokens {agreement}"
    )
