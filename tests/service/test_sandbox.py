"""Issue 16, items 1-2: hostile models in the real bubblewrap sandbox, at upload validation and in a job.

Each hostile model (tests/service/hostile.py) is first shown to work without the sandbox, in this
process: it really reads the secret, really creates the file. Then it goes through the service's
own paths (an HTTP upload through the embedded app; the job process through the launcher) and the
secret must not come back, the file must not appear. Targets: the host's /etc/passwd, the service's
api-key and SQLite database in its data folder, and another job's folder.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.db.models import Model
from job_host import bubblewrap, sandbox
from job_host.errors import EXCERPT_CHARS, MAX_CHARS, describe, scrub
from job_host.launcher import ChildProcess
from job_host.protocol import ERROR_FILE, SPEC_FILE
from tests.service import hostile
from tests.service.support import QUANT_CFG, ROOT, Api, make_settings, open_api
from tests.service.test_api import assert_problem
from worker.runner import JobRunner

HOST_PASSWD = Path("/etc/passwd").read_bytes()[:10]  # "root:x:0:0"
OTHER_JOB_SECRET = b"OTHER-JOB-SECRET-5f1c9e"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The embedded API (SQLite): its data folder holds amct.db and the first start's api-key; and a
    folder of another job, with a secret in it, next to where this test's checks and jobs run."""
    settings = make_settings(tmp_path_factory.mktemp("sandboxed"))
    with open_api(settings) as client:
        other = settings.tmp_dir / "other-attempt"
        other.mkdir(parents=True)
        (other / "model.pt").write_bytes(OTHER_JOB_SECRET)
        yield Api(client, settings)


def targets(settings) -> dict[str, tuple[str, bytes]]:
    """name -> (path, the bytes at its start a model would steal)."""
    key = (settings.data_dir / "api-key").read_bytes()[:40]
    database = settings.data_dir / "amct.db"
    assert key.startswith(b"amct_") and database.read_bytes()[:15] == b"SQLite format 3"
    return {
        "passwd": ("/etc/passwd", HOST_PASSWD),
        "api_key": (str(settings.data_dir / "api-key"), key),
        "database": (str(database), b"SQLite format 3"),
        "other_job": (str(settings.tmp_dir / "other-attempt" / "model.pt"), OTHER_JOB_SECRET),
    }


def steals_without_the_sandbox(model_path, secret: bytes) -> None:
    """The control: loaded here, unsandboxed, the model does raise the secret."""
    with pytest.raises(Exception) as raised:  # torch.jit.Error, for the model's RuntimeError  # noqa: PT011
        torch.jit.load(str(model_path))(torch.zeros(1, 1, 28, 28))
    assert secret.decode() in str(raised.value)


def job_folder(settings, name: str, model_path, assets):
    """A job folder as worker/inputs.py lays it out: every input inside it."""
    folder = settings.tmp_dir / f"attempt-{name}"  # not job-*: the reaper removes those of jobs not running
    folder.mkdir(parents=True)
    shutil.copy(model_path, folder / "model.pt")
    (folder / "job.cfg").write_bytes(QUANT_CFG)
    shutil.copy(assets / "small.npz", folder / "dataset.npz")
    spec = {
        "kind": "quant_retrain",
        "device": "cpu",
        "input_shape": [1, 1, 28, 28],
        "input_dtype": "float32",
        "params": {"epochs": 1, "batch_size": 64, "lr": 1e-3, "eval_fraction": 0.1, "seed": 0, "deploy_format": "onnx"},
        "dataset_format": "npz",
        "checkpoint_every_steps": 0,
        **{k: str(folder / n) for k, n in (("model", "model.pt"), ("cfg", "job.cfg"), ("dataset", "dataset.npz"))},
    }
    (folder / SPEC_FILE).write_text(json.dumps(spec))
    return folder


def run_job(folder) -> tuple[int, ChildProcess]:
    with ChildProcess(folder) as child:
        list(child)
        return child.wait(), child


def test_the_suite_runs_in_the_real_sandbox():
    """Every service test that uploads a model or runs a job goes through bwrap, not the opt-out."""
    assert os.environ.get(bubblewrap.UNSAFE_ENV) is None
    state = bubblewrap.state()
    assert state.mode == "bubblewrap", state.detail
    assert state.seccomp  # libseccomp is there (a dependency of bubblewrap itself)


# -- reading host files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["passwd", "api_key", "database", "other_job"])
def test_an_upload_that_reads_a_host_file_gets_none_of_it_back(service, tmp_path, target):
    path, secret = targets(service.settings)[target]
    model = hostile.save(hostile.Exfiltrate(path, len(secret)), tmp_path / "exfil.pt")
    steals_without_the_sandbox(model, secret)
    body = assert_problem(service.upload_model(model), 422, "file")
    assert body["stage"] == "forward" and "the model raised RuntimeError in forward" in body["detail"], body
    assert secret.decode() not in json.dumps(body) and secret[:6].decode() not in body["detail"]
    if target == "passwd":  # the sandbox has an /etc/passwd: its own, one user
        assert "EXFIL[amct:x:100" in body["detail"]
    else:  # the file is not there at all: the read fails before the model can raise what it read
        assert "EXFIL[" not in body["detail"], body


@pytest.mark.parametrize("target", ["api_key", "database", "other_job"])
def test_a_job_whose_model_reads_a_host_file_gets_none_of_it_back(service, assets, tmp_path, target):
    path, secret = targets(service.settings)[target]
    model = hostile.save(hostile.Exfiltrate(path, len(secret)), tmp_path / "exfil.pt")
    folder = job_folder(service.settings, f"exfil-{target}", model, assets)
    code, child = run_job(folder)
    error = child.error()
    assert code == 1 and error["type"] == "engine_error", (folder / "child.log").read_text()[-2000:]
    assert error["detail"].startswith("the model raised "), error
    assert secret.decode() not in error["detail"] and secret not in (folder / "child.log").read_bytes()


def test_an_http_job_whose_model_reads_the_key_file_fails_without_the_secret(api, assets, tmp_path):
    """End to end, on SQLite and PostgreSQL: a job submitted over HTTP, run by the worker's JobRunner
    (the job folder of worker/inputs.py), whose model reads the key file; the job fails, and neither
    its error nor its events nor its log artifact holds a byte of the key. (The model row is inserted
    directly: in the sandbox, such a model does not even pass the upload check, whose graph capture
    runs `from_file` too.)"""
    key_file = api.settings.data_dir / "api-key"
    if not key_file.exists():  # PostgreSQL: no embedded first start; the operator's key file stands in
        key_file.write_text(api.client.headers["Authorization"].split()[1] + "\n")
    secret = key_file.read_bytes()[:40]
    model_path = hostile.save(hostile.Exfiltrate(str(key_file), len(secret)), tmp_path / "exfil.pt")
    blob = api.client.app.state.store.put_file(model_path)
    with api.client.app.state.sessions() as session:
        model = Model(
            project_id=api.settings.project,
            name="exfil",
            input_shape=[1, 1, 28, 28],
            status="ready",
            layers={},
            sha256=blob.sha256,
            size_bytes=blob.size_bytes,
            uri=blob.uri,
        )
        session.add(model)
        session.commit()
        model_id = model.id
    ids = {
        "model_id": model_id,
        "config_id": api.upload_config(QUANT_CFG).json()["id"],
        "dataset_id": api.upload_dataset((assets / "small.npz").read_bytes()).json()["id"],
    }
    job_id = api.submit(kind="quant_retrain", **ids).json()["id"]
    assert JobRunner(api.settings, owner="test-sandbox").run(job_id) == "failed"
    job = api.client.get(f"/v1/jobs/{job_id}").json()
    assert job["error"]["type"] == "engine_error" and job["error"]["detail"].startswith("the model raised"), job
    events = api.client.get(f"/v1/jobs/{job_id}/events").text
    log = next(a for a in api.client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"] if a["kind"] == "log")
    for text in (json.dumps(job), events, api.client.get(log["content_url"]).text):
        assert secret.decode() not in text and secret[:8].decode() not in text


# -- writing host files -------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["data_dir", "elsewhere"])
@pytest.mark.parametrize("how", ["forward", "setstate"])
def test_an_upload_that_writes_a_host_file_leaves_none(service, tmp_path, tmp_path_factory, how, where):
    outside = service.settings.data_dir if where == "data_dir" else tmp_path_factory.mktemp("victim")
    planted = outside / f"planted-{how}"
    cls = hostile.PlantInForward if how == "forward" else hostile.PlantOnLoad
    model = hostile.save(cls(str(planted)), tmp_path / "plant.pt")
    torch.jit.load(str(model))(torch.zeros(1, 1, 28, 28))  # the control: unsandboxed, it writes
    assert planted.read_bytes() == b"X" * 16
    planted.unlink()
    response = service.upload_model(model)
    # Inside the sandbox the data folder is an empty mount point on a private tmpfs: the write may
    # "succeed" there, and vanish with the sandbox. Nothing reaches the host either way.
    assert response.status_code in (201, 422), response.text
    assert not planted.exists()
    assert sorted(p.name for p in service.settings.data_dir.iterdir() if p.name.startswith("planted")) == []


def test_a_job_whose_model_writes_on_load_succeeds_and_leaves_no_file_outside(service, assets, tmp_path):
    """The issue's case: __setstate__ writes on every load, the job still succeeds; now the write stays
    inside the sandbox (a tmpfs that is gone when the job process exits)."""
    planted = service.settings.data_dir / "planted-by-job"
    model = hostile.save(hostile.PlantOnLoad(str(planted)), tmp_path / "plant.pt")
    folder = job_folder(service.settings, "plant-on-load", model, assets)
    code, child = run_job(folder)
    assert code == 0 and child.result() is not None, (folder / "child.log").read_text()[-2000:]
    assert list(service.settings.data_dir.rglob("planted*")) == []


# -- what the sandbox sees and reaches ------------------------------------------------------------------


def _probe(service, folder, port: int, paths, monkeypatch) -> dict:
    monkeypatch.setenv("DATABASE_URL", "postgresql://amct:hunter2@db/amct")  # a credential the parent holds
    done = sandbox.run("tests.service.sandbox_probe", [str(port), *map(str, paths)], cwd=folder, timeout_s=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_sandbox_has_no_network_no_host_files_and_no_credentials(service, tmp_path, monkeypatch):
    """TorchScript cannot open a socket: plain Python, through the same command line, probes the network."""
    folder = service.settings.tmp_dir / "job-probe"
    folder.mkdir()
    paths = [p for p, _ in targets(service.settings).values() if p != "/etc/passwd"]
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        control = subprocess.run(
            [sys.executable, "-m", "tests.service.sandbox_probe", str(port)],
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True,
            text=True,
        )
        unsandboxed = json.loads(control.stdout)
        assert unsandboxed["connect"] == "ok" and unsandboxed["keyctl"] == "ok"  # what the sandbox takes away
        seen = _probe(service, folder, port, paths, monkeypatch)
    # Its own loopback only (nothing listens there), and no route anywhere else: an empty network namespace.
    assert seen["connect"] == "ConnectionRefusedError: errno 111", seen
    assert seen["connect_outside"] == "OSError: errno 101", seen  # ENETUNREACH
    assert seen["packet_socket"] != "ok" and seen["unshare"] != "ok"
    assert seen["keyctl"] == "PermissionError: errno 1"  # EPERM from the seccomp filter (job_host/seccomp.py)
    assert all(result.startswith("FileNotFoundError") for result in seen["read"].values()), seen["read"]
    assert not any(os.path.exists(p + ".planted") for p in paths)
    assert seen["write_own_folder"] == "ok" and (folder / "own.planted").exists()
    assert seen["uid"] == bubblewrap.SANDBOX_UID and "root" not in seen["passwd"]
    # User code runs below the API and the workers' heartbeats (sandbox.DEFAULT_NICE).
    assert seen["nice"] == min(os.nice(0) + sandbox.DEFAULT_NICE, 19) and unsandboxed["nice"] == os.nice(0)
    if seen["autogroup"] is not None:  # a kernel that schedules sessions as groups: the child's group is niced too
        group, _, nice = seen["autogroup"].split()
        assert int(nice) == seen["nice"], seen["autogroup"]
        # Ours reads empty in the boot session's group (no setsid above us, as on the CI machine).
        own = Path("/proc/self/autogroup").read_text().split()
        assert not own or group != own[0]
    assert "DATABASE_URL" not in seen["environ"] and not any("KEY" in k or "SECRET" in k for k in seen["environ"])
    assert "var" not in seen["root"] and "home" not in seen["root"]


def test_a_bad_child_nice_value_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv(sandbox.NICE_ENV, "-5")
    with pytest.raises(ValueError, match=r"AMCT_CHILD_NICE must be an integer from 0 to 19 .*got '-5'"):
        sandbox.popen("tests.service.sandbox_probe", ["1"], cwd=tmp_path)


# -- no sandbox: refused, unless the operator opts out -----------------------------------------------


@pytest.fixture
def no_bwrap(monkeypatch, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv(bubblewrap.BWRAP_ENV, raising=False)
    monkeypatch.delenv(bubblewrap.UNSAFE_ENV, raising=False)
    return monkeypatch


def test_without_bwrap_user_models_are_refused(service, assets, no_bwrap, tmp_path):
    assert bubblewrap.state().mode == "unavailable"
    with pytest.raises(bubblewrap.SandboxUnavailable, match="bubblewrap"):
        sandbox.popen("tests.service.sandbox_probe", ["1"], cwd=tmp_path)
    body = assert_problem(service.upload_model(assets / "cnn.pt"), 503, "file")
    assert bubblewrap.UNSAFE_ENV in body["detail"]
    ready = service.client.get("/readyz")
    assert ready.status_code == 503 and "bubblewrap" in ready.json()["checks"]["sandbox"]
    assert service.client.get("/v1/meta").json()["sandbox"]["mode"] == "unavailable"


def test_the_opt_out_runs_unsandboxed_and_says_so(service, no_bwrap, tmp_path, caplog):
    no_bwrap.setenv(bubblewrap.UNSAFE_ENV, "1")
    assert bubblewrap.state().mode == "unsafe-no-sandbox"
    with socket.create_server(("127.0.0.1", 0)) as listener, caplog.at_level(logging.WARNING):
        done = sandbox.run("tests.service.sandbox_probe", [str(listener.getsockname()[1])], cwd=tmp_path, timeout_s=60)
    assert json.loads(done.stdout)["connect"] == "ok"  # really not isolated: the opt-out is no half-sandbox
    assert any("WITHOUT a sandbox" in r.getMessage() for r in caplog.records)
    assert service.client.get("/readyz").json()["checks"]["sandbox"] == "unsafe-no-sandbox"
    assert service.client.get("/v1/meta").json()["sandbox"]["mode"] == "unsafe-no-sandbox"


# -- what is left of an error ---------------------------------------------------------------------------


def test_a_user_exception_is_reduced_to_its_type_and_a_scrubbed_excerpt(tmp_path):
    class Loud(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.text = "line one\nsecret:\x1b[31m" + "A" * 5000

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError(self.text)

    scripted = hostile.save(Loud(), tmp_path / "loud.pt")
    with pytest.raises(Exception) as raised:  # noqa: PT011
        torch.jit.load(str(scripted))(torch.zeros(1))
    text = describe(raised.value, "forward")
    assert text.startswith("the model raised RuntimeError in forward: secret: [31mAAA")
    assert len(text) <= len("the model raised RuntimeError in forward: ") + EXCERPT_CHARS
    assert "\x1b" not in text and "line one" not in text and "def forward" not in text


def test_an_argument_cast_error_names_the_argument(tmp_path):
    """TorchScript's own check of a call: its last line ("Cast error details: …") names nothing; its first does."""

    class TakesACount(torch.nn.Module):
        def forward(self, x: torch.Tensor, count: int) -> torch.Tensor:
            return x * count

    scripted = hostile.save(TakesACount(), tmp_path / "count.pt")
    with pytest.raises(Exception) as raised:  # noqa: PT011
        torch.jit.load(str(scripted))(torch.zeros(2), torch.zeros(2))
    assert "Cast error details" in str(raised.value)
    assert (
        describe(raised.value, "forward") == "the model's argument 'count' takes int, not the Tensor given in forward"
    )


def test_the_parent_scrubs_what_a_child_reports_and_never_follows_its_links(tmp_path):
    """A child the model took over could forge error.json, or plant it as a link to a host secret."""
    secret = tmp_path / "api-key"
    secret.write_text("amct_secret")
    folder = tmp_path / "job"
    folder.mkdir()
    child = ChildProcess(folder)
    (folder / ERROR_FILE).write_text(json.dumps({"type": "pwned", "detail": "\x00\x07" + "B" * 100_000}))
    assert child.error() == {"type": "engine_error", "detail": scrub("B" * 100_000)}
    assert len(child.error()["detail"]) == MAX_CHARS
    (folder / ERROR_FILE).unlink()
    (folder / ERROR_FILE).symlink_to(secret)
    assert child.error() is None
    (folder / "child.log").symlink_to(secret)
    assert child.log_tail() == ""


def test_engine_errors_keep_their_own_words():
    from job_process.main import DeviceUnavailable, _device

    pytest.importorskip("torch")
    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("this machine has torch_npu")
    with pytest.raises(DeviceUnavailable) as raised:
        _device("npu")
    assert describe(raised.value, "the job").startswith("DeviceUnavailable: device 'npu' needs torch_npu")


def test_outputs_and_checkpoints_the_child_lists_are_stored_only_as_files_inside_its_folder(tmp_path):
    """A link planted in the job folder (to the api-key, or a ckpt/ folder linked to the data dir) is
    never uploaded as an artifact or a checkpoint (worker/records.py)."""
    from worker.records import _inside, _regular_inside

    secret = tmp_path / "api-key"
    secret.write_text("amct_secret")
    folder = tmp_path / "job"
    (folder / "out").mkdir(parents=True)
    (folder / "out" / "report.json").write_text("{}")
    (folder / "out" / "stolen.json").symlink_to(secret)
    (folder / "ckpt").symlink_to(tmp_path)
    assert _inside(folder, str(folder / "out" / "report.json")) == (folder / "out" / "report.json").resolve()
    for planted in (folder / "out" / "stolen.json", folder / "ckpt" / "api-key", folder / ".." / "api-key"):
        assert not _regular_inside(folder, planted)
        with pytest.raises(ValueError, match="not a file in its job folder"):
            _inside(folder, str(planted))


def test_a_worker_with_a_bad_child_nice_value_does_not_start(service, monkeypatch):
    from worker.runner import JobRunner

    monkeypatch.setenv(sandbox.NICE_ENV, "twenty")
    with pytest.raises(ValueError, match="AMCT_CHILD_NICE must be an integer from 0 to 19"):
        JobRunner(service.settings)
