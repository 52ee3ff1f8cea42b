"""A stand-in fork server (tests/service/test_fork_server.py): what does each forked job see, and leave?

`python -m tests.service.fork_probe SLOT --fork-server FD`, started by worker/fork_server.py in the real
sandbox: job_process/zygote.py's own server loop, with a warm-up that only imports torch and a job that
follows its spec.json: `plant` leaves files in every shared writable place and a process that outlives it;
`look` reports what it sees of the sandbox, of the server, and of any earlier job; `crash` exits with 3.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from job_host.protocol import FORK_SERVER_FLAG, RESULT_FILE, emit
from job_host.sandbox import limit_self
from job_process.zygote import serve


def _try(action) -> str:
    try:
        return f"ok: {action()!r}"[:200]
    except OSError as e:
        return f"{type(e).__name__}: errno {e.errno}"


def _listing(path: str) -> list[str] | str:
    try:
        return sorted(os.listdir(path))
    except OSError as e:
        return f"{type(e).__name__}: errno {e.errno}"


def look(folder: Path) -> dict:
    server = os.getppid()
    fds = {fd: _try(lambda fd=fd: os.readlink(f"/proc/self/fd/{fd}")) for fd in _listing("/proc/self/fd")}
    return {
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "self": os.getpid(),
        "server": server,
        "tmp": _listing("/tmp"),
        "shm": _listing("/dev/shm"),
        "slot": _listing(str(folder.parent)),
        "server_mem": _try(lambda: open(f"/proc/{server}/mem", "rb").close()),
        "server_fd": _try(lambda: os.readlink(f"/proc/{server}/fd/0")),
        "server_environ": _try(lambda: open(f"/proc/{server}/environ", "rb").read()),
        "own_fds": fds,
        "stdin": os.readlink("/proc/self/fd/0"),
        "cwd": os.getcwd(),
    }


def job(folder: Path) -> int:
    spec = json.loads((folder / "spec.json").read_text())
    emit("log", level="info", message=f"probe {spec['action']}")
    if spec["action"] == "crash":
        return 3
    seen = look(folder) if spec["action"] == "look" else {}
    if spec["action"] == "plant":
        Path("/tmp/planted-dir").mkdir()
        for place in ("/tmp/planted", "/tmp/planted-dir/inner", "/dev/shm/planted", str(folder.parent / "planted")):
            Path(place).write_text("left by an earlier job")
        # A process in a session of its own, not waited for: it would outlive the job.
        subprocess.Popen(
            ["sleep", "300"],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        print('{"type": "exit", "code": 0}', flush=True)  # a forged server message, on its stdout
    (folder / RESULT_FILE).write_text(json.dumps({"metrics": seen, "artifacts": []}))
    return 0


def warm_up() -> None:
    import torch  # noqa: F401


if __name__ == "__main__":
    limit_self()
    sys.exit(serve(int(sys.argv[sys.argv.index(FORK_SERVER_FLAG) + 1]), warm_up, job))
