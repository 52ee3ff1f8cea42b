"""Shared real-data fixtures: Fashion-MNIST and one FP32 CNN trained once per test session."""

from __future__ import annotations

import copy

import pytest
import torch

from examples.fashion_mnist import fashion_mnist_available, load_fashion_mnist
from examples.models import SmallFashionCnn
from job_process.training import make_loader, train_epochs

FP32_LR, BATCH, SEED = 2e-3, 128, 0


def pytest_addoption(parser):
    parser.addoption(
        "--long", action="store_true", help="also run the `long` tests (a full service job each: 5-20 minutes)"
    )


def pytest_collection_modifyitems(config, items):
    """`long` tests run only with --long (`make test-long`): beyond CI's 30 minutes on 2 cores, not beyond a
    release check."""
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="a long test: run with --long (make test-long)")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def fashion_data():
    """(x_train, y_train, x_test, y_test); skips when the Debian package is absent."""
    if not fashion_mnist_available():
        pytest.skip("Fashion-MNIST missing: apt-get install dataset-fashion-mnist")
    x_train, y_train = load_fashion_mnist("train")
    x_test, y_test = load_fashion_mnist("test")
    return x_train, y_train, x_test, y_test


@pytest.fixture(scope="session")
def _fashion_fp32_trained(fashion_data):
    x_train, y_train = fashion_data[0], fashion_data[1]
    torch.manual_seed(SEED)
    model = SmallFashionCnn()
    train_epochs(model, make_loader(x_train, y_train, BATCH, seed=SEED), 1, FP32_LR)
    return model.eval()


@pytest.fixture
def fashion_fp32(_fashion_fp32_trained):
    """SmallFashionCnn after one FP32 epoch (Adam 2e-3, batch 128, seed 0); a fresh copy per test."""
    return copy.deepcopy(_fashion_fp32_trained)
