"""Fixtures for the service tests: real SQLite and PostgreSQL, real Redis, real Celery workers.

Each test session gets its own PostgreSQL database, Redis queue names and data folders, so runs
never collide. Tests skip, saying why, when Fashion-MNIST, PostgreSQL or Redis is missing.
"""

from __future__ import annotations

import numpy as np
import pytest

from examples.fashion_mnist import fashion_mnist_available
from tests.service.support import PG_ADMIN_URL, QUANT_CFG, REDIS_URL, RUN_ID, Api, make_settings, open_api

# -- data and model ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def assets(tmp_path_factory):
    """A TorchScript SmallFashionCnn trained 1 epoch on 3,000 images, a quant cfg, and job datasets.

    The job datasets are images the base model never saw (train[3000:4200]).
    """
    if not fashion_mnist_available():
        pytest.skip("Fashion-MNIST is missing: apt-get install dataset-fashion-mnist")
    import torch

    from examples.fashion_mnist import load_fashion_mnist
    from examples.models import SmallFashionCnn
    from job_process.training import make_loader, train_epochs

    folder = tmp_path_factory.mktemp("assets")
    x, y = load_fashion_mnist("train", limit=4200)
    torch.manual_seed(0)
    model = SmallFashionCnn()
    train_epochs(model, make_loader(x[:3000], y[:3000], 64, seed=0), 1, 2e-3)
    model.eval()
    torch.jit.script(model).save(str(folder / "cnn.pt"))
    (folder / "quant.cfg").write_bytes(QUANT_CFG)
    np.savez(folder / "fmnist.npz", inputs=x[3000:4200].numpy(), labels=y[3000:4200].numpy())
    np.savez(folder / "small.npz", inputs=x[3000:3400].numpy(), labels=y[3000:3400].numpy())
    np.savez(folder / "unlabelled.npz", inputs=x[3000:3100].numpy())
    return folder


# -- databases ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_url():
    """A throwaway PostgreSQL database for this test session, dropped at the end."""
    psycopg = pytest.importorskip("psycopg")
    name = f"amct_test_{RUN_ID}"
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        pytest.skip(f"PostgreSQL is not reachable at {PG_ADMIN_URL}: {e}")
    admin.execute(f'CREATE DATABASE "{name}"')
    yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    from core.db.session import engine_for

    engine_for.cache_clear()
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


@pytest.fixture(scope="session")
def redis_url():
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as e:
        pytest.skip(f"Redis is not reachable at {REDIS_URL}: {e}")
    yield REDIS_URL
    client.close()


# -- processes ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def live_server(tmp_path_factory):
    """One real `python -m service serve` (embedded: SQLite, filesystem queue, a Celery worker) per session,
    shared by the CLI and browser tests; its first start wrote the admin key to `<data_dir>/api-key`."""
    from tests.service.live_server import LiveServer

    server = LiveServer(tmp_path_factory.mktemp("live-server"))
    yield server
    server.stop()


# -- the API in process, on each database -----------------------------------------------------------


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def api(request, tmp_path_factory):
    """The API on SQLite and on a real PostgreSQL; the broker is a filesystem queue nobody consumes."""
    data_dir = tmp_path_factory.mktemp(f"api-{request.param}")
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else None
    settings = make_settings(data_dir, database_url=url)
    with open_api(settings) as client:
        yield Api(client, settings)


@pytest.fixture(scope="module")
def uploaded(api, assets):
    """One ready model, a quant cfg and a labelled dataset, uploaded once per database."""
    model = api.upload_model(assets / "cnn.pt")
    assert model.status_code == 201, model.text
    config = api.upload_config(QUANT_CFG)
    assert config.status_code == 201, config.text
    dataset = api.upload_dataset((assets / "small.npz").read_bytes())
    assert dataset.status_code == 201, dataset.text
    return {
        "model_id": model.json()["id"],
        "config_id": config.json()["id"],
        "dataset_id": dataset.json()["id"],
        "model": model.json(),
    }
