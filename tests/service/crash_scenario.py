"""Kill something in the middle of a training job and watch the job resume from its checkpoint.

Three scenarios, shared by the tests (one trial each) and bench/recovery.py (N trials):
- `kill_and_resume`: SIGKILL a Celery worker's whole process group, start another worker;
- `kill_engine_and_resume`: SIGKILL only the engine child under a live worker (it retries the job);
- `kill_embedded_worker_and_resume`: SIGKILL the worker of a real `amct serve` (it restarts it).
`trial_summary` says whether a trial succeeded, resumed, trained a step twice or left the job queued.
Also a private redis-server that a test may kill and restart without touching the Redis other tests use.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import select

from core.db.models import JobEvent
from tests.service.support import QUANT_CFG, ROOT, Api, Worker, wait_until
from worker.fork_server import job_marker

# Recovery in seconds, not minutes: a lost lease is noticed after 3 s, the reaper looks every second.
FAST_RECOVERY = {
    "lease_s": 3.0,
    "heartbeat_s": 0.5,
    "reap_interval_s": 1.0,
    "requeue_after_s": 3.0,
    "checkpoint_every_steps": 0,
}
TERMINAL = ("succeeded", "failed", "cancelled")


class RedisServer:
    """A `redis-server` of our own on a free port, without persistence: kill() loses every message."""

    def __init__(self, folder: Path) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.folder = folder
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.folder),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.exceptions.ConnectionError:
                assert self.proc.poll() is None, (self.folder / "redis.log").read_text()
                return False

        wait_until(up, 20, interval=0.05, what=f"redis-server on port {self.port}")
        client.close()

    def kill(self) -> None:
        """A crash: SIGKILL, nothing saved."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def job_events(api: Api, job_id: str) -> list[dict]:
    """The job's events so far, straight from the database (the SSE stream waits for the end)."""
    return _events(api.client.app.state.sessions, job_id)


def _events(sessions, job_id: str) -> list[dict]:
    with sessions() as session:
        rows = session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.seq)).all()
        return [{"seq": e.seq, "ts": e.ts, "type": e.type, **e.payload} for e in rows]


def get_job(api: Api, job_id: str) -> dict:
    return api.client.get(f"/v1/jobs/{job_id}").json()


def wait_terminal(api: Api, job_id: str, timeout: float) -> dict:
    return wait_until(
        lambda: (j := get_job(api, job_id))["status"] in TERMINAL and j,
        timeout,
        interval=0.2,
        what=f"job {job_id} finished",
    )


def engine_processes(job_id: str) -> list[int]:
    """Pids of engine children still working on the job: their folder is named after it, or they were started
    warm in `<scratch>/warm-<pid>-<token>`, which became the job's `<scratch>/job-<id>-<token>` (worker/warm.py),
    or they were forked by a fork server whose job marker names the job (worker/fork_server.py)."""
    pids, servers = [], set()
    for pid, (_parent, _group, cmdline) in processes().items():
        if b"job_process.main" not in cmdline:
            continue
        if f"job-{job_id}-".encode() in cmdline or _warm_folder_of(cmdline, job_id):
            pids.append(pid)
        elif b"--fork-server" in cmdline and b"bwrap" not in cmdline.split(b"\0")[0] and _serves(cmdline, job_id):
            servers.add(pid)
    # A forked job's child has its server's command line: it is the server's child (so are the ranks it starts).
    return pids + [pid for pid, (parent, _group, _cmd) in processes().items() if parent in servers]


def _serves(cmdline: bytes, job_id: str) -> bool:
    args = cmdline.decode(errors="replace").split("\0")
    slot = Path(args[args.index("job_process.main") + 1])
    try:
        return job_marker(slot).read_text() == job_id
    except OSError:
        return False


def _warm_folder_of(cmdline: bytes, job_id: str) -> bool:
    for arg in cmdline.decode(errors="replace").split("\0"):
        folder = Path(arg)
        if folder.name.startswith("warm-") and folder.name.count("-") >= 2:
            token = folder.name.rsplit("-", 1)[1]
            if (folder.parent / f"job-{job_id}-{token}").exists():
                return True
    return False


def verify_artifacts(api: Api, job_id: str) -> dict[str, bool]:
    """Every artifact's bytes, downloaded through the API, against its recorded sha256 and size."""
    checks = {}
    for a in api.client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]:
        body = api.client.get(a["content_url"]).content
        checks[a["kind"]] = hashlib.sha256(body).hexdigest() == a["sha256"] and len(body) == a["size_bytes"]
    return checks


@dataclass
class Trial:
    job: dict
    events: list[dict]
    killed_after: dict  # the last checkpoint event recorded before the kill
    recover_s: float  # from the kill to the new attempt's `resumed` event
    finish_s: float  # from the kill to `succeeded`
    orphans: list[int]
    artifacts: dict[str, bool] = field(default_factory=dict)
    old_worker_group: list[int] = field(default_factory=list)  # the embedded scenario: what was killed
    max_queued_s: float = 0.0  # the embedded/engine scenarios: the longest wait from requeued to claimed

    @property
    def resumed(self) -> dict | None:
        return next((e for e in self.events if e["type"] == "resumed"), None)


def queued_waits(events: list[dict]) -> list[float]:
    """Seconds from each `requeued` state event to the claim that followed it (inf if none followed)."""
    waits, since = [], None
    for e in events:
        if e["type"] == "state" and e.get("edge") == "requeued":
            since = e["ts"]
        elif e["type"] == "state" and e.get("edge") == "claimed" and since is not None:
            waits.append((e["ts"] - since).total_seconds())
            since = None
    return waits + ([float("inf")] if since is not None else [])


def trial_summary(trial: Trial, queued_limit_s: float = 30.0) -> dict[str, bool]:
    """succeeded; resumed from the checkpoint stored before the kill; a training step run twice (a
    step at or before the resume point trained again, or two attempts' steps interleaved); left
    queued (a wait from requeued to the next claim longer than `queued_limit_s`, or never claimed)."""
    resumed, killed = trial.resumed, trial.killed_after
    steps = (
        [e["step"] for e in trial.events[trial.events.index(resumed) :] if e["type"] == "progress" and "step" in e]
        if resumed
        else []
    )
    return {
        "succeeded": trial.job["status"] == "succeeded",
        "resumed": resumed is not None and (resumed["epoch"], resumed["step"]) == (killed["epoch"], killed["step"]),
        "ran_twice": resumed is None or any(s <= killed["step"] for s in steps) or steps != sorted(steps),
        "left_queued": any(w > queued_limit_s for w in queued_waits(trial.events)),
    }


def kill_and_resume(
    api: Api,
    ids: dict,
    log_dir: Path,
    *,
    epochs: int = 3,
    batch_size: int = 8,
    kill_after_epoch: int = 1,
    timeout: float = 240,
) -> Trial:
    """Submit a quant_retrain job, SIGKILL its worker's whole process group once the checkpoint of
    epoch `kill_after_epoch` is stored, start a fresh worker, and wait for the job to end."""
    log_dir.mkdir(parents=True, exist_ok=True)
    first = Worker(api.settings, log_dir / "worker-1.log", beat=True)
    second = None
    try:
        submit = api.submit(kind="quant_retrain", epochs=epochs, batch_size=batch_size, lr=5e-4, **ids)
        assert submit.status_code == 202, submit.text
        job_id = submit.json()["id"]
        checkpoint = wait_until(
            lambda: next(
                (
                    e
                    for e in reversed(job_events(api, job_id))
                    if e["type"] == "checkpoint" and e["epoch"] >= kill_after_epoch
                ),
                None,
            ),
            timeout,
            interval=0.05,
            what=f"the checkpoint of epoch {kill_after_epoch}",
        )
        os.killpg(first.proc.pid, signal.SIGKILL)  # the worker, its pool, its beat: no goodbye
        first.proc.wait()
        killed_at = time.monotonic()
        checkpoint = [e for e in job_events(api, job_id) if e["type"] == "checkpoint"][-1]
        # The engine child runs in a session of its own; the kernel ends it with its parent.
        deadline = killed_at + 10
        while (orphans := engine_processes(job_id)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in orphans:  # reported by the caller; not left behind
            with contextlib.suppress(ProcessLookupError):  # it may end between the listing and the kill
                os.kill(pid, signal.SIGKILL)
        second = Worker(api.settings, log_dir / "worker-2.log", beat=True)
        resumed_at = wait_until(
            lambda: any(e["type"] == "resumed" for e in job_events(api, job_id)) and time.monotonic(),
            timeout,
            interval=0.1,
            what="the resumed attempt",
        )
        job = wait_terminal(api, job_id, timeout)
        finish_s = time.monotonic() - killed_at
        return Trial(
            job=job,
            events=job_events(api, job_id),
            killed_after=checkpoint,
            recover_s=resumed_at - killed_at,
            finish_s=finish_s,
            orphans=orphans,
            artifacts=verify_artifacts(api, job_id),
        )
    finally:
        first.stop()
        if second is not None:
            second.stop()


# -- the engine child killed under a live worker ----------------------------------------------------


def kill_engine_at_checkpoint(api: Api, job_id: str, timeout: float) -> dict:
    """Wait for the job's first checkpoint, then SIGKILL its engine processes (not its worker); the checkpoint
    event."""
    checkpoint = wait_until(
        lambda: next((e for e in job_events(api, job_id) if e["type"] == "checkpoint"), None),
        timeout,
        interval=0.05,
        what="the checkpoint of epoch 1",
    )
    for pid in wait_until(lambda: engine_processes(job_id), 10, interval=0.05, what="the engine process"):
        with contextlib.suppress(ProcessLookupError):  # bwrap and its child: killing one may end the other
            os.kill(pid, signal.SIGKILL)
    return checkpoint


def kill_engine_and_resume(
    api: Api, ids: dict, log_dir: Path, *, epochs: int = 2, batch_size: int = 16, timeout: float = 240
) -> Trial:
    """Submit a job to a real Celery worker, SIGKILL its engine child once the checkpoint of epoch 1 is
    stored; the worker itself retries the job from that checkpoint."""
    log_dir.mkdir(parents=True, exist_ok=True)
    worker = Worker(api.settings, log_dir / "worker.log", beat=True)
    try:
        submit = api.submit(kind="quant_retrain", epochs=epochs, batch_size=batch_size, lr=5e-4, **ids)
        assert submit.status_code == 202, submit.text
        job_id = submit.json()["id"]
        kill_engine_at_checkpoint(api, job_id, timeout)
        killed_at = time.monotonic()
        checkpoint = [e for e in job_events(api, job_id) if e["type"] == "checkpoint"][-1]
        resumed_at = wait_until(
            lambda: any(e["type"] == "resumed" for e in job_events(api, job_id)) and time.monotonic(),
            timeout,
            interval=0.1,
            what="the resumed attempt",
        )
        job = wait_terminal(api, job_id, timeout)
        events = job_events(api, job_id)
        return Trial(
            job=job,
            events=events,
            killed_after=checkpoint,
            recover_s=resumed_at - killed_at,
            finish_s=time.monotonic() - killed_at,
            orphans=engine_processes(job_id),
            artifacts=verify_artifacts(api, job_id),
            max_queued_s=max(queued_waits(events), default=0.0),
        )
    finally:
        worker.stop()


# -- the embedded server's worker killed ---------------------------------------------------------------

WIRING = ("DATABASE_URL", "BROKER_URL", "ARTIFACT_STORE", "AMCT_DATABASE_URL", "AMCT_BROKER_URL", "AMCT_ARTIFACT_STORE")
FAST_RECOVERY_ENV = {f"AMCT_{k.upper()}": str(v) for k, v in FAST_RECOVERY.items()}


def processes() -> dict[int, tuple[int, int, bytes]]:
    """pid -> (parent pid, process group, command line) of every process now."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                found[int(entry)] = (int(stat[1]), int(stat[2]), Path(f"/proc/{entry}/cmdline").read_bytes())
            except (OSError, IndexError):
                continue
    return found


class EmbeddedServer:
    """A real `python -m service serve` (SQLite, filesystem queue, its embedded worker) on a free port."""

    def __init__(self, folder: Path, **env: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.folder, self.data_dir = folder, folder / "data"
        self.env = {k: v for k, v in os.environ.items() if k not in WIRING}
        self.env.update({"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2", "AMCT_BROKER_POLL_S": "0.05", **env})
        self.command = [sys.executable, "-m", "service", "serve", "--port", str(port), "--data-dir", str(self.data_dir)]
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> EmbeddedServer:
        from sqlalchemy.orm import sessionmaker

        from core.db.session import make_engine

        self.folder.mkdir(parents=True, exist_ok=True)
        self._log = open(self.folder / "serve.log", "wb")  # noqa: SIM115 - the server's whole life
        self.proc = subprocess.Popen(
            self.command, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        wait_until(self._ready, 120, interval=0.2, what="the embedded server answers /readyz")
        self.client.headers["Authorization"] = f"Bearer {(self.data_dir / 'api-key').read_text().strip()}"
        self.engine = make_engine(f"sqlite:///{self.data_dir / 'amct.db'}")
        self.sessions = sessionmaker(self.engine)
        return self

    def _ready(self) -> bool:
        try:
            return self.client.get("/readyz").status_code == 200
        except httpx.TransportError:
            assert self.proc.poll() is None, self.log_tail()
            return False

    def log_tail(self) -> str:
        return (self.folder / "serve.log").read_text(errors="replace")[-3000:]

    def worker(self) -> int | None:
        """The pid of the embedded Celery worker (the server's child)."""
        return next(
            (pid for pid, (ppid, _, cmd) in processes().items() if ppid == self.proc.pid and b"celery" in cmd), None
        )

    def upload(self, assets: Path) -> dict:
        with open(assets / "cnn.pt", "rb") as f:
            model = self.client.post(
                "/v1/models", files={"file": ("cnn.pt", f)}, data={"name": "cnn", "input_shape": "1,1,28,28"}
            )
        assert model.status_code == 201, model.text
        config = self.client.post("/v1/configs", files={"file": ("q.cfg", QUANT_CFG)}, data={"kind": "retrain"})
        dataset = self.client.post("/v1/datasets", files={"file": ("d.npz", (assets / "small.npz").read_bytes())})
        return {"model_id": model.json()["id"], "config_id": config.json()["id"], "dataset_id": dataset.json()["id"]}

    def __exit__(self, *exc) -> None:
        from job_host.sandbox import stop_group

        self.client.close()
        stop_group(self.proc, 30)
        self.engine.dispose()
        self._log.close()


def kill_embedded_worker_and_resume(
    server: EmbeddedServer, ids: dict, *, epochs: int = 2, batch_size: int = 16, timeout: float = 240
) -> Trial:
    """Submit a job, SIGKILL the embedded worker's main process once the checkpoint of epoch 1 is stored;
    the server kills what is left of its group, releases its jobs and starts a new worker."""
    client = server.client
    submit = client.post(
        "/v1/jobs", json={"kind": "quant_retrain", "epochs": epochs, "batch_size": batch_size, "lr": 5e-4, **ids}
    )
    assert submit.status_code == 202, submit.text
    job_id = submit.json()["id"]
    wait_until(
        lambda: any(e["type"] == "checkpoint" for e in _events(server.sessions, job_id)),
        timeout,
        interval=0.05,
        what="the checkpoint of epoch 1",
    )
    worker = server.worker()
    group = [pid for pid, (_, pgid, _) in processes().items() if pgid == worker]
    os.kill(worker, signal.SIGKILL)
    killed_at = time.monotonic()
    checkpoint = [e for e in _events(server.sessions, job_id) if e["type"] == "checkpoint"][-1]
    deadline = killed_at + 15  # the pool and the beat die with the worker (PR_SET_PDEATHSIG, then killpg)
    while (orphans := sorted(set(group) & set(processes()))) and time.monotonic() < deadline:
        time.sleep(0.1)
    resumed_at = wait_until(
        lambda: any(e["type"] == "resumed" for e in _events(server.sessions, job_id)) and time.monotonic(),
        timeout,
        interval=0.1,
        what="the resumed attempt",
    )
    job = wait_until(
        lambda: (j := client.get(f"/v1/jobs/{job_id}").json())["status"] in TERMINAL and j,
        timeout,
        interval=0.2,
        what=f"job {job_id} finished",
    )
    events = _events(server.sessions, job_id)
    artifacts = {}
    for a in client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]:
        body = client.get(a["content_url"]).content
        artifacts[a["kind"]] = hashlib.sha256(body).hexdigest() == a["sha256"] and len(body) == a["size_bytes"]
    return Trial(
        job=job,
        events=events,
        killed_after=checkpoint,
        recover_s=resumed_at - killed_at,
        finish_s=time.monotonic() - killed_at,
        orphans=orphans,
        artifacts=artifacts,
        old_worker_group=group,
        max_queued_s=max(queued_waits(events), default=0.0),
    )
