"""Schemathesis against the app's own OpenAPI, in process: no 5xx, and every response as documented.

Cases come from the schema (valid and invalid bodies, query strings, headers, path ids, requests
without the key) and are sent with an admin key of a project that owns a model, a cfg, a dataset,
a cancelled job with an artifact and a spare key: half the generated path ids are swapped for
those, so the id-taking routes also run past their 404. Checked: no 5xx; status codes, content
types, headers and bodies as the OpenAPI document says. Bounded (`MAX_EXAMPLES` per operation and
phase): a smoke run of the contract in CI, not a long search.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service import auth
from service.app import create_app
from tests.service.support import Api, make_settings
from tests.service.tenants import Tenant, keyed_client, populate

pytestmark = pytest.mark.slow  # 20-40 s on 2 busy cores; CI runs it

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
MAX_EXAMPLES = 12
# Built at import: `schema.parametrize` needs the operations at collection. (`schemathesis.pytest.
# from_fixture` would defer it, but 4.32.5's lazy schema reads a pytest attribute pytest 9 removed.)
DATA_DIR = Path(tempfile.mkdtemp(prefix="amct-schemathesis-"))
APP = create_app(make_settings(DATA_DIR))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
IDS: dict[str, str] = {}  # ids that exist in the caller's project, filled by the `key` fixture
CALLS: list[tuple[str, int]] = []  # (operation, status) of every case sent


@schema.hook
def flatmap_path_parameters(context, path_parameters):
    """Half the cases get ids that exist, so the routes run past their 404."""
    real = {name: IDS[name] for name in path_parameters or {} if name in IDS}
    return st.sampled_from([path_parameters, {**path_parameters, **real}]) if real else st.just(path_parameters)


@pytest.fixture(scope="module")
def key():
    from fastapi.testclient import TestClient

    try:
        with TestClient(APP):  # the lifespan: migrations and the project
            sessions, settings_ = APP.state.sessions, APP.state.settings
            _id, secret = auth.create_key(sessions, settings_.project, ["admin"], "schemathesis")
            spare_key, _ = auth.create_key(sessions, settings_.project, ["read"], "spare: cases may revoke it")
            tenant = Tenant(settings_.project, Api(keyed_client(APP, secret), settings_), spare_key)
            IDS.update(populate(tenant).ids)
            yield secret
    finally:
        shutil.rmtree(DATA_DIR, ignore_errors=True)
        ok = sum(status < 300 for _op, status in CALLS)
        print(f"\nschemathesis ran {len(CALLS)} cases over {len({op for op, _ in CALLS})} operations, {ok} of them 2xx")


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_contract(case, key):
    response = case.call_and_validate(headers={"Authorization": f"Bearer {key}"}, checks=CHECKS)
    CALLS.append((case.operation.label, response.status_code))
