"""Small models with the signatures the service must take: two heads (a tuple output), two int64
inputs (token ids and a mask, like a transformer encoder). Shared by tests/service/test_signatures.py."""

from __future__ import annotations

import torch
from torch import nn


class TwoHeadCnn(nn.Module):
    """Fashion-MNIST images -> (class logits [n, 10], a 4-wide regression head [n, 4])."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classes = nn.Linear(16, 10)
        self.box = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.features(x)
        return self.classes(h), self.box(h)


class TinyEncoder(nn.Module):
    """(input_ids, attention_mask) int64 -> the mask-mean of token embeddings through two Linear layers."""

    def __init__(self, vocab: int = 64, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, 16)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.fc2(torch.relu(self.fc1(self.embed(input_ids))))
        mask = attention_mask.unsqueeze(-1).to(h.dtype)
        return (h * mask).sum(1) / mask.sum(1).clamp_min(1.0)


def token_data(n: int, seq: int = 12, vocab: int = 64, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, seq), generator=g)
    lengths = torch.randint(3, seq + 1, (n,), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    return {"input_ids": (ids * mask).numpy(), "attention_mask": mask.numpy()}
