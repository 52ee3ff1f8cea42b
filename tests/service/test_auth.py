"""API keys, scopes, project isolation and the job quota (SQLite; the queries are the same on PostgreSQL).

Project A and project B share one app. For every route that takes an id, B's key must get 404 for
A's id (the same answer as for an id that never existed), and B's lists must show none of A's items.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from core.db.models import ApiKey, Job
from service import auth
from service.admin_cli import admin_app
from service.app import create_app
from tests.service.support import QUANT_CFG, make_settings, open_api
from tests.service.tenants import keyed_client, make_tenant, populate, tiny_model_bytes
from tests.service.test_api import assert_problem

WIRING = (
    "DATABASE_URL",
    "BROKER_URL",
    "ARTIFACT_STORE",
    "AMCT_DATABASE_URL",
    "AMCT_BROKER_URL",
    "AMCT_ARTIFACT_STORE",
    "AMCT_AUTH",
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("auth"))
    with open_api(settings) as client:
        app = client.app
        model = tiny_model_bytes()
        a = populate(make_tenant(app, settings, "proj-a"), model)
        b = populate(make_tenant(app, settings, "proj-b"))  # B's model row is written directly: faster
        yield {"app": app, "settings": settings, "a": a, "b": b}


# -- keys and scopes ---------------------------------------------------------------------------------------


def test_a_key_is_shown_once_and_only_its_hash_is_stored(world):
    a = world["a"]
    created = a.api.client.post("/v1/keys", json={"scopes": ["read"], "name": "ci"})
    assert created.status_code == 201, created.text
    secret, key_id = created.json()["secret"], created.json()["id"]
    assert re.fullmatch(r"amct_[A-Za-z0-9_-]{43}", secret)
    assert secret.startswith(created.json()["prefix"]) and len(created.json()["prefix"]) < 16
    listed = a.api.client.get("/v1/keys")
    assert key_id in [k["id"] for k in listed.json()["items"]] and secret not in listed.text
    with world["app"].state.sessions() as session:
        row = session.get(ApiKey, key_id)
        assert row.key_hash == hashlib.sha256(secret.encode()).hexdigest()
        assert secret not in repr([getattr(row, c.key) for c in ApiKey.__table__.columns])
    me = keyed_client(world["app"], secret).get("/v1/me")
    assert me.json() == {"project": "proj-a", "scopes": ["read"], "key_id": key_id}


def test_no_key_or_an_unknown_key_is_401_with_www_authenticate(world):
    app = world["app"]
    for client in (keyed_client(app, None), keyed_client(app, "amct_" + "x" * 43), keyed_client(app, "hunter2")):
        response = client.get("/v1/jobs")
        assert_problem(response, 401, "Authorization")
        assert response.headers["www-authenticate"].startswith("Bearer")
    basic = keyed_client(app, None).get("/v1/jobs", headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert_problem(basic, 401, "Authorization")
    # Probes stay open: a load balancer has no key.
    assert keyed_client(app, None).get("/healthz").status_code == 200
    assert keyed_client(app, None).get("/readyz").status_code == 200


@pytest.mark.parametrize("scope", ["read", "write", "admin"])
def test_scopes_nest_read_write_admin(world, scope):
    app, a = world["app"], world["a"]
    _id, secret = auth.create_key(app.state.sessions, "proj-a", [scope], f"{scope} only")
    client = keyed_client(app, secret)
    # (request, the scope it needs, its status when allowed)
    calls = [
        (lambda: client.get(f"/v1/models/{a.ids['model_id']}"), "read", 200),
        (lambda: client.get("/v1/jobs"), "read", 200),
        (
            lambda: client.post("/v1/configs", files={"file": ("q.cfg", QUANT_CFG)}, data={"kind": "retrain"}),
            "write",
            201,
        ),
        (lambda: client.post("/v1/jobs/no-such-job/cancel"), "write", 404),
        (lambda: client.get("/v1/keys"), "admin", 200),
        (lambda: client.post("/v1/keys", json={"scopes": ["read"]}), "admin", 201),
    ]
    granted = {"read": {"read"}, "write": {"read", "write"}, "admin": {"read", "write", "admin"}}[scope]
    for call, needs, ok in calls:
        response = call()
        if needs in granted:
            assert response.status_code == ok, (scope, needs, response.text)
        else:
            assert assert_problem(response, 403, "Authorization")["required_scope"] == needs


def test_a_revoked_key_is_401_at_once(world):
    app, a = world["app"], world["a"]
    key_id, secret = auth.create_key(app.state.sessions, "proj-a", ["write"], "to revoke")
    client = keyed_client(app, secret)
    assert client.get("/v1/jobs").status_code == 200
    revoked = a.api.client.post(f"/v1/keys/{key_id}/revoke")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert_problem(client.get("/v1/jobs"), 401, "Authorization")
    assert_problem(a.api.client.post("/v1/keys/nope/revoke"), 404, "key_id")


def test_last_used_at_is_recorded(world):
    app = world["app"]
    key_id, secret = auth.create_key(app.state.sessions, "proj-a", ["read"], "usage")
    assert next(k for k in auth.list_keys(app.state.sessions, "proj-a") if k.id == key_id).last_used_at is None
    keyed_client(app, secret).get("/v1/me")
    assert next(k for k in auth.list_keys(app.state.sessions, "proj-a") if k.id == key_id).last_used_at is not None


# -- project isolation ----------------------------------------------------------------------------------


def _id_routes(app) -> list[tuple[str, str]]:
    return [(method.upper(), path) for path, ops in app.openapi()["paths"].items() if "{" in path for method in ops]


def test_every_route_with_an_id_answers_404_to_another_project(world):
    app, a, b = world["app"], world["a"], world["b"]
    routes = _id_routes(app)
    assert len(routes) >= 9, routes
    for method, path in routes:
        names = re.findall(r"{(\w+)}", path)
        assert all(n in a.ids for n in names), f"{method} {path}: give project A a {names} in tenants.populate"
        url_a = path.format(**a.ids)
        body = assert_problem(b.api.client.request(method, url_a), 404)
        assert body["field"] in names and a.ids[body["field"]] in body["detail"]
        # The same request with A's own key is not a 404: the route exists and A may use it.
        if method == "GET":
            assert a.api.client.request(method, url_a).status_code == 200, (method, path)
    assert a.api.client.get("/v1/me").status_code == 200  # B's revoke did not touch A's key


def test_another_projects_queued_job_cannot_be_cancelled(world):
    a, b = world["a"], world["b"]
    job_id = a.api.submit(**a.job_body(seed=7)).json()["id"]
    assert_problem(b.api.client.post(f"/v1/jobs/{job_id}/cancel"), 404, "job_id")
    job = a.api.client.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "queued" and not job["cancel_requested"]
    assert a.api.client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202


def test_another_projects_inputs_cannot_be_submitted(world):
    a, b = world["a"], world["b"]
    for name in ("model_id", "config_id", "dataset_id"):
        assert_problem(b.api.submit(**b.job_body(**{name: a.ids[name]})), 404, name)


def test_lists_show_only_the_callers_project(world):
    app, a, b = world["app"], world["a"], world["b"]
    lists = [
        path
        for path, ops in app.openapi()["paths"].items()
        if "{" not in path and path.startswith("/v1/") and "get" in ops and path not in ("/v1/me", "/v1/meta")
    ]
    assert {"/v1/jobs", "/v1/keys"} <= set(lists)
    for path in lists:
        mine, theirs = a.api.client.get(path), b.api.client.get(path)
        assert mine.status_code == theirs.status_code == 200, (path, theirs.text)
        for id_ in a.ids.values():
            assert id_ not in theirs.text, (path, id_)
        assert any(id_ in mine.text for id_ in a.ids.values()), path


def test_artifact_content_of_another_project_is_never_streamed(world):
    a, b = world["a"], world["b"]
    url = f"/v1/artifacts/{a.ids['artifact_id']}/content"
    assert a.api.client.get(url).content == b'{"accuracy": 0.5}'
    response = b.api.client.get(url)
    assert response.status_code == 404 and b"accuracy" not in response.content


# -- quota --------------------------------------------------------------------------------------------------


def test_quota_counts_queued_and_running_jobs_and_answers_429_with_retry_after(world, monkeypatch):
    app, settings, b = world["app"], world["settings"], world["b"]

    def active_jobs(project: str) -> int:
        with app.state.sessions() as session:
            return session.scalar(
                select(func.count())
                .select_from(Job)
                .where(Job.project_id == project, Job.status.in_(("queued", "running")))
            )

    active = active_jobs("proj-b")
    monkeypatch.setattr(settings, "max_active_jobs", active + 1)
    assert active_jobs("proj-a") < active + 1  # so A's submit below tests that B's jobs do not count for A
    monkeypatch.setattr(settings, "quota_retry_after_s", 17)
    first = b.api.submit(headers={"Idempotency-Key": "quota-1"}, **b.job_body(seed=1))
    assert first.status_code == 202, first.text
    over = b.api.submit(**b.job_body(seed=2))
    body = assert_problem(over, 429, "max_active_jobs")
    assert over.headers["retry-after"] == "17"
    assert (body["limit"], body["active"]) == (active + 1, active + 1)
    # A replay of a job that exists is not a new job: no 429.
    replay = b.api.submit(headers={"Idempotency-Key": "quota-1"}, **b.job_body(seed=1))
    assert replay.status_code == 202 and replay.json()["id"] == first.json()["id"]
    # Another project's quota is its own.
    assert world["a"].api.submit(**world["a"].job_body(seed=3)).status_code == 202
    # A finished (cancelled) job frees its slot.
    assert b.api.client.post(f"/v1/jobs/{first.json()['id']}/cancel").status_code == 202
    assert b.api.submit(**b.job_body(seed=2)).status_code == 202


# -- open mode, the embedded bootstrap, the admin CLI ----------------------------------------------------


def test_open_mode_acts_as_the_local_project_from_localhost_only(tmp_path, caplog):
    from fastapi.testclient import TestClient

    settings = make_settings(tmp_path, auth="open", project="local")
    app = create_app(settings)
    with caplog.at_level("WARNING", logger="amct.auth"), TestClient(app, client=("127.0.0.1", 5000)) as local:
        assert local.get("/v1/me").json() == {"project": "local", "scopes": ["admin", "read", "write"], "key_id": None}
        assert local.get("/v1/jobs").status_code == 200
        remote = TestClient(app, client=("203.0.113.9", 5000), raise_server_exceptions=False)
        assert_problem(remote.get("/v1/jobs"), 403, "Authorization")
    assert "NO AUTHENTICATION" in caplog.text
    assert not (tmp_path / "api-key").exists()


def test_embedded_first_start_writes_one_admin_key_0600(tmp_path, capfd):
    from fastapi.testclient import TestClient

    settings = make_settings(tmp_path)
    with TestClient(create_app(settings)) as client:
        key_file = tmp_path / "api-key"
        secret = key_file.read_text().strip()
        assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
        assert client.get("/v1/me", headers={"Authorization": f"Bearer {secret}"}).json()["scopes"] == [
            "admin",
            "read",
            "write",
        ]
    printed = capfd.readouterr().err
    assert secret in printed and "shown only this once" in printed and str(key_file) in printed
    # A restart finds the key: no second key, nothing printed, the file untouched.
    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/me", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
        keys = auth.list_keys(client.app.state.sessions, settings.project)
    assert len(keys) == 1 and key_file.read_text().strip() == secret
    assert secret not in capfd.readouterr().err


def test_admin_cli_creates_projects_and_keys_and_revokes_them(tmp_path, monkeypatch):
    for name in WIRING:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AMCT_DATA_DIR", str(tmp_path))
    runner = CliRunner()
    assert runner.invoke(admin_app, ["create-project", "vision", "--name", "Vision team"]).exit_code == 0
    again = runner.invoke(admin_app, ["create-project", "vision"])
    assert again.exit_code == 1 and "already exists" in again.output
    assert runner.invoke(admin_app, ["create-project", "Bad Id!"]).exit_code == 1
    made = runner.invoke(admin_app, ["create-key", "vision", "--scope", "write", "--name", "ci"])
    assert made.exit_code == 0, made.output
    secret = made.stdout.strip().splitlines()[-1]
    assert secret.startswith("amct_")
    assert runner.invoke(admin_app, ["create-key", "nobody"]).exit_code == 1
    assert runner.invoke(admin_app, ["create-key", "vision", "--scope", "root"]).exit_code != 0

    from core.db.session import read_engine
    from core.settings import Settings

    engine = read_engine(Settings().resolved_database_url)
    with engine.connect() as connection:
        caller = auth.authenticate(connection, secret)
    assert caller.project == "vision" and caller.scopes == {"read", "write"}
    listed = runner.invoke(admin_app, ["list-keys", "vision"])
    assert caller.key_id in listed.output and secret[:12] in listed.output and secret not in listed.output
    assert runner.invoke(admin_app, ["revoke-key", caller.key_id]).exit_code == 0
    with engine.connect() as connection:
        assert auth.authenticate(connection, secret) is None
    assert runner.invoke(admin_app, ["revoke-key", "no-such-key"]).exit_code == 1
