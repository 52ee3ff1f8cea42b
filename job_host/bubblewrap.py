"""The bubblewrap command line every child that touches a user model runs under (docs/security.md).

A TorchScript file is code (PyTorch's SECURITY.md): `torch.from_file` alone reads and writes any path
the process can. So the child gets its own user, mount, PID, IPC, UTS, cgroup and network namespaces
(`--unshare-all`, no network at all), a root file system that holds only the Python install, the
engine's packages (read-only), a generated /etc with one user, a private /tmp, a minimal /proc and
/dev, and its own job folder (writable, at the same path as on the host, so the paths in spec.json and
result.json mean the same on both sides). Nothing of the service's data folder (database, api-key,
artifacts, other jobs) is mounted. No capabilities, a seccomp filter (seccomp.py), `--die-with-parent`
and `--new-session` (no TIOCSTI into the service's terminal).

Without bwrap the service refuses to run user models unless the operator sets UNSAFE_ENV, loudly.
Torch-free: the API builds this command line too.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from job_host import seccomp

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]  # the repo: its packages are mounted one by one
UNSAFE_ENV = "AMCT_UNSAFE_NO_SANDBOX"  # "1": run user models without bubblewrap (never on a shared host)
BWRAP_ENV = "AMCT_BWRAP"  # the bwrap binary; default: `bwrap` on PATH
SANDBOX_UID = SANDBOX_GID = 1000
SANDBOX_HOME = "/tmp"  # the private tmpfs: torch's caches land there and vanish with the sandbox
# Read-only from the host: the system's programs and libraries (no secrets, needed by Python and torch).
_SYSTEM_DIRS = ("/usr", "/sys/devices/system/cpu")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf")
_MERGED_USR = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Accelerators the job may use (cuda, npu); none of them exist on a cpu host.
_DEVICE_GLOBS = ("/dev/nvidia*", "/dev/dri", "/dev/davinci*", "/dev/devmm_svm", "/dev/hisi_hdc")
_ACCELERATOR_INFO = ("/proc/driver/nvidia", "/sys/bus/pci", "/sys/devices", "/sys/class")
_PASSWD = f"amct:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:{SANDBOX_HOME}:/usr/sbin/nologin\n"
_GROUP = f"amct:x:{SANDBOX_GID}:\n"
_HOSTS = "127.0.0.1 localhost\n"


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces here, and the operator did not opt out."""


@dataclass(frozen=True)
class State:
    """What GET /readyz, /v1/meta and the start-up log say about the sandbox."""

    mode: str  # "bubblewrap", "unsafe-no-sandbox" (the operator's opt-out) or "unavailable"
    detail: str
    seccomp: bool = False
    bwrap: str | None = None

    @property
    def usable(self) -> bool:
        return self.mode != "unavailable"

    def as_dict(self) -> dict:
        return {"mode": self.mode, "detail": self.detail, "seccomp": self.seccomp}


@dataclass
class Command:
    """argv to start, and the file descriptors (generated /etc files, the seccomp program) it reads."""

    argv: list[str]
    pass_fds: list[int] = field(default_factory=list)

    def close_fds(self) -> None:
        for fd in self.pass_fds:
            os.close(fd)
        self.pass_fds = []


def unsafe_opt_out() -> bool:
    return os.environ.get(UNSAFE_ENV, "").strip().lower() in ("1", "true", "yes")


def state() -> State:
    """The sandbox as it is on this host (bwrap probed once per process: a container may forbid it)."""
    probed = _probe(os.environ.get(BWRAP_ENV) or shutil.which("bwrap"))
    if probed.usable or not unsafe_opt_out():
        return probed
    return State("unsafe-no-sandbox", f"{UNSAFE_ENV}=1: user models run WITHOUT isolation ({probed.detail})")


@functools.cache
def _probe(bwrap: str | None) -> State:
    if bwrap is None:
        return State("unavailable", "bubblewrap (bwrap) is not installed; install the Debian package `bubblewrap`")
    command = wrap(["/usr/bin/true"], Path("/"), bwrap=bwrap, writable=False)
    try:
        done = subprocess.run(command.argv, pass_fds=command.pass_fds, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return State("unavailable", f"{bwrap} does not start: {e}")
    finally:
        command.close_fds()
    if done.returncode != 0:
        return State(
            "unavailable",
            f"{bwrap} cannot create its namespaces here (in a container: see "
            f"docs/security.md): {done.stderr.strip()[-300:]}",
        )
    return State("bubblewrap", f"{bwrap}: namespaces, read-only system, job folder only", seccomp.available(), bwrap)


def require() -> State:
    """The state, or SandboxUnavailable when user models must not run here."""
    current = state()
    if not current.usable:
        raise SandboxUnavailable(
            f"refusing to run a user model without a sandbox: {current.detail}; "
            f"set {UNSAFE_ENV}=1 only on a single-user machine (docs/security.md)"
        )
    return current


def log_state(who: str) -> State:
    """At start-up: say how user models will run; an error or a loud warning when not isolated."""
    current = state()
    if current.mode == "bubblewrap":
        log.info("%s: user models run in bubblewrap (seccomp %s)", who, "on" if current.seccomp else "off")
    elif current.mode == "unsafe-no-sandbox":
        log.warning(
            "%s: SECURITY: %s. Any uploaded model can read and write what this process can, "
            "including the database and the api-key.",
            who,
            current.detail,
        )
    else:
        log.error("%s: user models will be refused: %s", who, current.detail)
    return current


def wrap(
    inner: Sequence[str],
    workdir: Path,
    read_only: Iterable[Path] = (),
    *,
    bwrap: str,
    writable: bool = True,
    packages: Iterable[str] = (),
    share_net: bool = False,
) -> Command:
    """bwrap argv running `inner` with `workdir` as its only writable folder and `read_only` files visible.

    `share_net`: the host's network instead of an empty namespace, for the ranks of a job across several
    nodes only, which the operator enables (docs/security.md, "Distributed jobs")."""
    fds: list[int] = []
    argv = [
        bwrap,
        "--unshare-all",
        *(["--share-net"] if share_net else []),
        "--unshare-user",
        *_if_supported(bwrap, "--disable-userns"),
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_GID),
        "--hostname",
        "sandbox",
    ]
    argv += _system_mounts()
    for name, text in (("passwd", _PASSWD), ("group", _GROUP), ("hosts", _HOSTS)):
        fds.append(_data_fd(text.encode()))
        argv += ["--ro-bind-data", str(fds[-1]), f"/etc/{name}"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    devices = sorted(d for pattern in _DEVICE_GLOBS for d in glob.glob(pattern))
    for device in devices:
        argv += ["--dev-bind", device, device]
    if devices:  # CUDA's and the NPU driver's libraries read their driver's /proc and PCI topology in /sys
        argv += [arg for path in _ACCELERATOR_INFO if os.path.exists(path) for arg in ("--ro-bind", path, path)]
    for path in _python_dirs(packages):
        argv += ["--ro-bind", path, path]
    if writable:
        argv += ["--bind", str(workdir), str(workdir)]
    for file in read_only:
        argv += ["--ro-bind", str(file), str(file)]
    if (program := seccomp.program()) is not None:
        fds.append(_data_fd(program))
        argv += ["--seccomp", str(fds[-1])]
    argv += ["--chdir", str(workdir), "--", *inner]
    return Command(argv, fds)


@functools.cache
def _if_supported(bwrap: str, flag: str) -> list[str]:
    """[flag] when this bwrap knows it (--disable-userns: 0.8.0, Debian 12; seccomp denies unshare anyway)."""
    try:
        usage = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [flag] if flag in usage else []


def _system_mounts() -> list[str]:
    argv: list[str] = []
    for path in _SYSTEM_DIRS + _SYSTEM_FILES:
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    for path in _MERGED_USR:  # Debian's /bin -> usr/bin and friends, as links or as folders
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return argv


def _python_dirs(packages: Iterable[str]) -> list[str]:
    """The interpreter's install, the venv, and the repo's packages (never the repo root: `var/` lives there)."""
    dirs = {
        os.path.realpath(sys.base_prefix),
        os.path.realpath(sys.prefix),
        sys.prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
    }
    dirs |= {str(ROOT / p) for p in package_dirs(packages) if (ROOT / p).exists()}
    # /usr is mounted already; a folder inside another one in the list comes with it.
    return sorted(d for d in dirs if not any(d.startswith(other + "/") for other in dirs | {"/usr"}))


def package_dirs(modules: Iterable[str] = ()) -> set[str]:
    """The repo's top-level packages the child imports: the engine, the job process, extra job kinds,
    the package of the module it runs (tests run stand-ins from tests/)."""
    from job_host.kinds import MODULES_ENV

    extra = [*modules, *os.environ.get(MODULES_ENV, "").split(",")]
    return {"amct_engine", "job_host", "job_process"} | {m.strip().split(".")[0] for m in extra if m.strip()}


def _data_fd(data: bytes) -> int:
    """A pipe holding `data` (bwrap reads it whole at start-up); the read end, to pass to the child."""
    read, write = os.pipe()
    try:
        if len(data) > 60_000:  # a pipe buffer holds 64 KiB; more would block here
            raise ValueError("sandbox data too large for a pipe")
        os.write(write, data)
    finally:
        os.close(write)
    return read


def exit_code(returncode: int) -> int:
    """bwrap reports a child killed by signal N as 128 + N; the same negative code Popen gives without it."""
    return -(returncode - 128) if 128 < returncode < 160 else returncode
