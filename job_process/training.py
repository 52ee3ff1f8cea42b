"""The job process's training loop: seeded loaders, a resumable shuffle order, epochs with progress.

Shared with the tests and the benchmark, which train their base models the same way.

Nothing here sets thread counts or global seeds except where a ``seed`` argument says so:
``torch.set_num_threads`` and the seed of a model's initialisation are the caller's business.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, SequentialSampler

ProgressFn = Callable[[dict[str, Any]], None]
# A batch's model inputs: one tensor, or a tuple in the signature's input order. Its targets: class
# labels, a dict of target tensors by output name (mse / l1), or None (distill_outputs).
Inputs = torch.Tensor | tuple[torch.Tensor, ...]
Targets = torch.Tensor | dict[str, torch.Tensor] | None


def take(value, index):
    """`value[index]` through tuples and dicts of tensors (None stays None)."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple(t[index] for t in value)
    if isinstance(value, dict):
        return {k: t[index] for k, t in value.items()}
    return value[index]


def samples(x: Inputs) -> int:
    return len(x[0]) if isinstance(x, tuple) else len(x)


def forward(model: nn.Module, x: Inputs):
    return model(*x) if isinstance(x, tuple) else model(x)


def first_output(out) -> torch.Tensor:
    """The first tensor of an output structure (the one cross-entropy and top-1 are computed on)."""
    while not isinstance(out, torch.Tensor):
        out = next(iter(out.values())) if isinstance(out, dict) else out[0]
    return out


class ArraysDataset(Dataset):
    """Inputs and targets indexed together by a whole batch of indices."""

    def __init__(self, x: Inputs, y: Targets) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return samples(self.x)

    def __getitem__(self, index):
        return take(self.x, index), take(self.y, index)


def _as_is(batch):
    return batch


def make_loader(
    x: Inputs,
    y: Targets,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
) -> DataLoader:
    """A ``DataLoader`` over in-memory tensors yielding ``(x_batch, y_batch)``.

    ``x`` is a tensor or a tuple of tensors (a model's inputs in order), ``y`` labels, a dict of
    targets or None; batches keep that structure.

    The shuffle order comes from a private generator seeded with ``seed``, so two loaders built with
    the same seed yield the same batches epoch by epoch, whatever the global RNG does. Batches are
    sliced whole (a ``BatchSampler`` as sampler), not collated sample by sample.
    """
    if isinstance(y, torch.Tensor) and samples(x) != len(y):
        raise ValueError(f"x has {samples(x)} samples but y has {len(y)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dataset = ArraysDataset(x, y)
    if shuffle:
        generator = torch.Generator().manual_seed(seed)
        sampler: Iterable[int] = RandomSampler(dataset, generator=generator)
    else:
        sampler = SequentialSampler(dataset)
    batches = BatchSampler(sampler, batch_size=batch_size, drop_last=drop_last)
    # batch_size=None: the dataset is indexed with a whole list of indices per step.
    return DataLoader(dataset, sampler=batches, batch_size=None, collate_fn=_as_is)


class ResumableLoader:
    """A loader that can replay its shuffle order from a checkpoint (for ``train_epochs(start_step=...)``).

    It remembers the state of the loader's shuffle generator at the start of every pass (the
    sampler draws a pass's permutation lazily, at its first batch); a checkpoint stores ``state()``,
    and ``restore(state, step)`` in a new process puts the generator where the pass of the next
    step begins. Works for ``make_loader`` loaders and any DataLoader whose (batch) sampler wraps a
    ``RandomSampler`` with its own generator; without one (no shuffle) there is nothing to replay.
    """

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        inner = getattr(loader.sampler, "sampler", loader.sampler)
        self.generator: torch.Generator | None = getattr(inner, "generator", None)
        self._pass_start: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        self._pass_start = self.generator.get_state() if self.generator is not None else None
        yield from self.loader

    def state(self) -> torch.Tensor | None:
        """The shuffle state the current pass began with."""
        return self._pass_start

    def restore(self, state: torch.Tensor | None, step: int) -> None:
        """Resume after ``step`` global steps, from the ``state()`` saved right after that step."""
        if self.generator is None or state is None:
            return
        self.generator.set_state(state)
        if step and step % len(self.loader) == 0:
            # That pass had ended: draw its indices again (no data is loaded) to reach the next pass.
            # (Replaying beats saving the state after the last batch: the sampler still draws once more
            # when the pass ends.)
            for _ in self.loader.sampler:
                pass


def make_optimizer(name: str, params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The optimizer ``train_epochs`` builds from a name (a caller that checkpoints builds it first)."""
    name = name.lower()
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    raise ValueError(f"optimizer must be 'adam', 'adamw' or 'sgd', got {name!r}")


def train_epochs(
    model: nn.Module,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    epochs: int,
    lr: float,
    optimizer: str | torch.optim.Optimizer = "adam",
    progress: ProgressFn | None = None,
    set_mode: bool = True,
    start_step: int = 0,
    loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> list[float]:
    """Train ``model`` with cross-entropy for ``epochs`` passes over ``loader``; return per-step losses.

    ``optimizer`` is ``"adam"``, ``"adamw"``, ``"sgd"`` (momentum 0.9) or a ready optimizer (then ``lr``
    is ignored). ``progress`` is called after every step with ``{epoch, step, total_steps, loss}``
    (``epoch`` counts from 0, ``step`` is global from 1). ``set_mode=False`` leaves train/eval mode
    alone, for graph modules whose mode is switched another way (e.g. torchao PT2E models).

    ``start_step`` resumes a run that stopped after that many steps: the caller has restored the
    model, the optimizer and the loader's shuffle state as they were at the start of the epoch the
    step falls in; finished epochs are not iterated, and the first batches of the partial epoch are
    drawn and skipped, so every later step sees the batch it would have seen. Only the new steps'
    losses are returned; ``step`` in ``progress`` stays global.

    ``loss_fn(model, x, y)`` replaces the cross-entropy of ``model(x)`` (e.g.
    ``amct_engine.teacher_guided.TeacherGuidedLoss``: CE + α·KD against the FP32 model).
    """
    if epochs < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs}")
    if isinstance(optimizer, str):
        optimizer = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], lr)
    steps_per_epoch = len(loader) if hasattr(loader, "__len__") else 0
    if start_step < 0 or (start_step and not steps_per_epoch):
        raise ValueError(f"start_step={start_step} needs a loader with a length and must be >= 0")
    total_steps = steps_per_epoch * epochs if steps_per_epoch else None
    cross_entropy = nn.CrossEntropyLoss()
    if set_mode:
        model.train()
    losses: list[float] = []
    first_epoch, skip = divmod(start_step, steps_per_epoch) if start_step else (0, 0)
    for epoch in range(first_epoch, epochs):
        for index, (xb, yb) in enumerate(loader):
            if epoch == first_epoch and index < skip:
                continue
            optimizer.zero_grad(set_to_none=True)
            if loss_fn is not None:
                loss = loss_fn(model, xb, yb)
            else:
                loss = cross_entropy(first_output(forward(model, xb)), yb)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            if progress is not None:
                step = start_step + len(losses)
                progress({"epoch": epoch, "step": step, "total_steps": total_steps, "loss": losses[-1]})
    return losses


@torch.no_grad()
def predict_logits(model: nn.Module, x: Inputs, batch_size: int = 1000) -> torch.Tensor:
    """Concatenated (first) model outputs over ``x`` in chunks of ``batch_size`` (no grad, mode untouched)."""
    n = samples(x)
    return torch.cat([first_output(forward(model, take(x, slice(i, i + batch_size)))) for i in range(0, n, batch_size)])


def evaluate_accuracy(
    model: nn.Module,
    x: Inputs,
    y: torch.Tensor,
    batch_size: int = 1000,
    set_mode: bool = True,
) -> float:
    """Top-1 accuracy of ``model`` on ``(x, y)``, in eval mode; the previous mode is restored.

    ``set_mode=False`` evaluates in whatever mode the model is in (see ``train_epochs``).
    """
    if samples(x) != len(y):
        raise ValueError(f"x has {samples(x)} samples but y has {len(y)}")
    if samples(x) == 0:
        raise ValueError("cannot evaluate accuracy on an empty set")
    was_training = model.training
    if set_mode:
        model.eval()
    try:
        pred = predict_logits(model, x, batch_size).argmax(dim=1)
    finally:
        if set_mode:
            model.train(was_training)
    return float((pred == y).float().mean())
