"""Fashion-MNIST loader (Debian package dataset-fashion-mnist) and the shared training helpers."""

from __future__ import annotations

import gzip
import shutil

import pytest
import torch

from examples.fashion_mnist import (
    ENV_VAR,
    fashion_mnist_available,
    fashion_mnist_dir,
    load_fashion_mnist,
    read_idx,
)
from examples.models import SmallFashionCnn
from job_process.training import evaluate_accuracy, make_loader, train_epochs

needs_data = pytest.mark.skipif(
    not fashion_mnist_available(),
    reason=f"Fashion-MNIST absent from {fashion_mnist_dir()} (apt-get install dataset-fashion-mnist)",
)

TRAIN_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")


@pytest.fixture
def data_copy(tmp_path):
    """A writable copy of the dataset folder (the two train files are enough for split='train')."""
    for name in TRAIN_FILES + ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(fashion_mnist_dir() / name, tmp_path / name)
    return tmp_path


@needs_data
def test_train_split_shapes_dtypes_and_normalisation():
    x, y = load_fashion_mnist("train")
    assert x.shape == (60000, 1, 28, 28) and x.dtype == torch.float32
    assert y.shape == (60000,) and y.dtype == torch.int64
    # mean 0.2860 / std 0.3530 are the train statistics, so the result is ~standardised
    assert abs(float(x.mean())) < 1e-3
    assert abs(float(x.std()) - 1.0) < 1e-3
    assert float(x.min()) == pytest.approx((0 - 0.2860) / 0.3530, abs=1e-5)
    assert float(x.max()) == pytest.approx((1 - 0.2860) / 0.3530, abs=1e-5)


@needs_data
def test_train_split_has_6000_images_per_class():
    _, y = load_fashion_mnist("train")
    assert torch.bincount(y, minlength=10).tolist() == [6000] * 10


@needs_data
def test_test_split_and_limit():
    x, y = load_fashion_mnist("test", limit=500)
    assert x.shape == (500, 1, 28, 28) and y.shape == (500,)
    full_x, full_y = load_fashion_mnist("test")
    assert full_x.shape[0] == 10000
    assert torch.equal(x, full_x[:500]) and torch.equal(y, full_y[:500])
    assert torch.bincount(full_y, minlength=10).tolist() == [1000] * 10


@needs_data
def test_returned_tensors_do_not_alias_the_cache():
    x, _ = load_fashion_mnist("test", limit=10)
    x.zero_()
    again, _ = load_fashion_mnist("test", limit=10)
    assert float(again.abs().sum()) > 0


def test_unknown_split_is_rejected():
    with pytest.raises(ValueError, match="split must be"):
        load_fashion_mnist("valid")


def test_missing_folder_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere"))
    assert not fashion_mnist_available()
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist("train")


@needs_data
def test_env_var_points_the_loader_at_another_folder(data_copy, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(data_copy))
    assert fashion_mnist_dir() == data_copy
    x, y = load_fashion_mnist("train", limit=3)
    assert x.shape == (3, 1, 28, 28) and y.shape == (3,)


@needs_data
def test_truncated_gz_raises_value_error_naming_the_file(data_copy):
    labels = data_copy / TRAIN_FILES[1]
    raw = labels.read_bytes()
    labels.write_bytes(raw[: len(raw) // 2])  # cut the gzip stream in the middle
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte.gz"):
        load_fashion_mnist("train", root=data_copy)


@needs_data
def test_short_idx_payload_raises_value_error_naming_the_file(data_copy, monkeypatch):
    labels = data_copy / TRAIN_FILES[1]
    with gzip.open(fashion_mnist_dir() / TRAIN_FILES[1], "rb") as fh:
        payload = fh.read()
    with gzip.open(labels, "wb") as fh:
        fh.write(payload[:-1])  # a valid gzip whose IDX body misses the last label
    monkeypatch.setenv(ENV_VAR, str(data_copy))
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte\.gz.*truncated or corrupt"):
        load_fashion_mnist("train")


def test_bad_magic_is_rejected(tmp_path):
    path = tmp_path / "bogus-idx1-ubyte.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(b"\x00\x00\x0d\x01" + (3).to_bytes(4, "big") + b"\x00" * 12)  # 0x0D = float32 IDX
    with pytest.raises(ValueError, match="bogus-idx1-ubyte.gz: bad IDX magic"):
        read_idx(path)


def test_idx_reader_round_trip(tmp_path):
    path = tmp_path / "tiny-idx3-ubyte.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(b"\x00\x00\x08\x03" + b"".join(n.to_bytes(4, "big") for n in (2, 3, 4)) + bytes(range(24)))
    arr = read_idx(path)
    assert arr.shape == (2, 3, 4) and arr.dtype.name == "uint8" and int(arr[1, 2, 3]) == 23


def test_small_fashion_cnn_layout():
    model = SmallFashionCnn()
    names = [name for name, _ in model.named_children()]
    assert names == ["conv1", "bn1", "relu1", "pool", "conv2", "bn2", "relu2", "fc"]
    assert sum(p.numel() for p in model.parameters()) == 20586
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_make_loader_is_deterministic_per_seed():
    x = torch.arange(10.0).unsqueeze(1)
    y = torch.arange(10)
    first = [yb.tolist() for _, yb in make_loader(x, y, batch_size=4, shuffle=True, seed=3)]
    again = [yb.tolist() for _, yb in make_loader(x, y, batch_size=4, shuffle=True, seed=3)]
    assert first == again
    assert [len(b) for b in first] == [4, 4, 2]
    assert sorted(sum(first, [])) == list(range(10))
    ordered = [yb.tolist() for _, yb in make_loader(x, y, batch_size=4, shuffle=False)]
    assert ordered == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_train_epochs_reports_progress_and_is_reproducible():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (64,), generator=gen)

    def run():
        torch.manual_seed(0)
        model = SmallFashionCnn()
        events = []
        losses = train_epochs(model, make_loader(x, y, 16, seed=1), epochs=2, lr=1e-2, progress=events.append)
        return model, losses, events

    model, losses, events = run()
    _, losses_again, _ = run()
    assert len(losses) == 8 and losses == losses_again
    assert events[0] == {"epoch": 0, "step": 1, "total_steps": 8, "loss": losses[0]}
    assert events[-1]["epoch"] == 1 and events[-1]["step"] == 8
    assert losses[-1] < losses[0]
    model.train()
    evaluate_accuracy(model, x, y)
    assert model.training, "evaluate_accuracy restores the previous mode"


@pytest.mark.slow
@needs_data
def test_one_epoch_of_small_cnn_reaches_87_percent():
    x, y = load_fashion_mnist("train")
    x_test, y_test = load_fashion_mnist("test")
    torch.manual_seed(0)
    model = SmallFashionCnn()
    train_epochs(model, make_loader(x, y, batch_size=128, shuffle=True, seed=0), epochs=1, lr=2e-3)
    assert evaluate_accuracy(model, x_test, y_test) >= 0.87
