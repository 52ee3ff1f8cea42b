"""all-MiniLM-L6-v2's distillation and evaluation helpers (the model and sentences: examples/minilm.py).

Shared by tests/test_distill_minilm.py and bench/minilm.py.
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from amct_engine.distillation import DistillSampleBase
from examples.minilm import (  # noqa: F401 - the tests and benchmarks import them from here
    SentenceEncoder,
    load_minilm,
    make_sentences,
    minilm_available,
    train_and_eval_sentences,
)


def tokenize(tokenizer, sentences: list[str], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), int64, padded to `max_len` so every batch has one shape."""
    encoded = tokenizer(sentences, padding="max_length", truncation=True, max_length=max_len, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]


@torch.no_grad()
def embed(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, batch: int = 64) -> torch.Tensor:
    model.eval()
    return torch.cat([model(ids[i : i + batch], mask[i : i + batch]) for i in range(0, len(ids), batch)])


# Linear layers get per-output-channel weight scales: with AMCT's per-tensor default the FFN
# output projections (weight outliers up to 175 standard deviations) keep the student at ~0.977.
LINEAR_PER_CHANNEL_CFG = """\
distill_override_layer_types: {
    layer_type: "Linear"
    distill_weight_quant_config: { arq_distill: { channel_wise: true dst_type: INT8 } }
}
"""
TRAIN_SENTENCES, EVAL_SENTENCES, BATCH, LR = 200, 64, 16, 1e-5


class TokenBatch(DistillSampleBase):
    """`(input_ids, attention_mask)` batches: both are model inputs."""

    @staticmethod
    def get_model_input_data(samples):
        return tuple(samples)


def distil_minilm(
    workdir, train_sentences: int = TRAIN_SENTENCES, eval_sentences: int = EVAL_SENTENCES, progress=None
) -> dict:
    """INT8 distillation of every Linear of MiniLM on sentences written here, labels never used.

    Returns the FP32 teacher, the distilled student, the tokenised training/evaluation sentences,
    an example input and the config path. Sentences are padded to the longest one of the set.
    """
    import amct_engine as amct

    bert, tokenizer = load_minilm()
    teacher = SentenceEncoder(bert).eval()
    train, evaluation = train_and_eval_sentences(train_sentences, eval_sentences)
    encoded = tokenizer(train + evaluation, padding="longest", return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    example = (ids[:2], mask[:2])
    cfg = os.path.join(workdir, "linear_per_channel.cfg")
    with open(cfg, "w") as handle:
        handle.write(LINEAR_PER_CHANNEL_CFG)
    config = os.path.join(workdir, "minilm_distill.json")
    amct.create_distill_config(config, teacher, example, cfg)
    student = amct.create_distill_model(config, teacher, example)
    loader = DataLoader(
        TensorDataset(ids[:train_sentences], mask[:train_sentences]),
        batch_size=BATCH,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    amct.distill(teacher, student, config, loader, epochs=1, lr=LR, sample_instance=TokenBatch(), progress=progress)
    return {
        "teacher": teacher,
        "student": student,
        "config": config,
        "example": example,
        "train": (ids[:train_sentences], mask[:train_sentences]),
        "eval": (ids[train_sentences:], mask[train_sentences:]),
    }
