"""train_epochs(start_step=...) continues a stopped run exactly: same batches, same weights."""

from __future__ import annotations

import io

import pytest
import torch

from examples.models import SmallFashionCnn
from job_process.training import ResumableLoader, make_loader, make_optimizer, train_epochs


class Stop(Exception):
    pass


def _data():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(40, 1, 28, 28, generator=gen), torch.randint(0, 10, (40,), generator=gen)


def _fresh():
    torch.manual_seed(0)
    model = SmallFashionCnn()
    return model, make_optimizer("adam", model.parameters(), 1e-2)


@pytest.mark.parametrize("stop_after", [5, 7, 12], ids=["epoch-end", "mid-epoch", "mid-last-epoch"])
def test_a_run_resumed_from_a_checkpoint_ends_with_the_uninterrupted_weights(stop_after):
    x, y = _data()
    loader = make_loader(x, y, 8, seed=3)  # 5 steps per epoch, 3 epochs
    uninterrupted, opt = _fresh()
    full = train_epochs(uninterrupted, loader, 3, 0.0, optimizer=opt)

    # The interrupted run: a checkpoint after `stop_after` steps, then the process "dies".
    loader = ResumableLoader(make_loader(x, y, 8, seed=3))
    model, opt = _fresh()
    saved = io.BytesIO()

    def progress(event):
        if event["step"] == stop_after:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "shuffle": loader.state()}, saved)
            raise Stop

    with pytest.raises(Stop):
        train_epochs(model, loader, 3, 0.0, optimizer=opt, progress=progress)

    # A new process: fresh objects, state from the checkpoint (loaded the safe way).
    saved.seek(0)
    state = torch.load(saved, weights_only=True)
    loader = ResumableLoader(make_loader(x, y, 8, seed=3))
    resumed, opt = _fresh()
    torch.nn.init.zeros_(resumed.fc.weight)  # proves the weights come from the checkpoint
    resumed.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    loader.restore(state["shuffle"], stop_after)
    events = []
    rest = train_epochs(resumed, loader, 3, 0.0, optimizer=opt, progress=events.append, start_step=stop_after)

    assert rest == full[stop_after:]
    assert [e["step"] for e in events] == list(range(stop_after + 1, 16))
    assert events[0]["epoch"] == stop_after // 5
    expected = uninterrupted.state_dict()
    assert all(torch.equal(value, expected[name]) for name, value in resumed.state_dict().items())


def test_start_step_needs_a_loader_with_a_length():
    model = SmallFashionCnn()
    batches = ((torch.zeros(2, 1, 28, 28), torch.zeros(2, dtype=torch.int64)) for _ in range(2))
    with pytest.raises(ValueError, match="start_step"):
        train_epochs(model, batches, 1, 1e-3, start_step=1)
