"""Run through the sandbox by test_sandbox.py: what can a child see and reach? One JSON line on stdout.

TorchScript cannot open a socket, so the network is probed with plain Python through the same
command line the job process and model validation start with (job_host/sandbox.py).
`python -m tests.service.sandbox_probe PORT PATH...`: connect to 127.0.0.1:PORT and to an address
off this machine (TEST-NET-1: it never answers, but a route to it exists outside), open a raw packet
socket, read each PATH, write next to each PATH.
"""

import ctypes
import json
import os
import platform
import socket
import sys

from job_host.sandbox import limit_self


def attempt(fn) -> str:
    try:
        fn()
    except OSError as e:
        return f"{type(e).__name__}: errno {e.errno}"
    return "ok"


def new_user_namespace() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER (os.unshare is Python 3.12+)
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def session_keyring() -> None:
    """keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING): any process may; the seccomp filter says EPERM."""
    libc = ctypes.CDLL(None, use_errno=True)
    number = {"x86_64": 250, "aarch64": 219}[platform.machine()]
    if libc.syscall(number, 0, -3, 0) < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def autogroup() -> str | None:
    """This process's scheduling group, "/autogroup-N nice K", where the kernel has them."""
    try:
        return open("/proc/self/autogroup").read().strip() or None
    except OSError:
        return None


def main(port: int, paths: list[str]) -> dict:
    def read(path):
        with open(path, "rb") as f:
            f.read(64)

    def write(path):
        with open(path + ".planted", "wb") as f:
            f.write(b"X")

    return {
        "uid": os.getuid(),
        "nice": os.nice(0),
        "autogroup": autogroup(),
        "root": sorted(os.listdir("/")),
        "environ": sorted(os.environ),
        "passwd": open("/etc/passwd").read(),
        "connect": attempt(lambda: socket.create_connection(("127.0.0.1", port), timeout=2).close()),
        "connect_outside": attempt(lambda: socket.create_connection(("192.0.2.1", 80), timeout=2).close()),
        "packet_socket": attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()),
        "unshare": attempt(new_user_namespace),
        "keyctl": attempt(session_keyring),
        "read": {p: attempt(lambda p=p: read(p)) for p in paths},
        "write": {p: attempt(lambda p=p: write(p)) for p in paths},
        "write_own_folder": attempt(lambda: write(os.path.join(os.getcwd(), "own"))),
    }


if __name__ == "__main__":
    limit_self()
    print(json.dumps(main(int(sys.argv[1]), sys.argv[2:])), flush=True)
