"""The seccomp filter bwrap loads before it starts the child (`bwrap --seccomp FD`).

Built with libseccomp (Debian `libseccomp2`, a dependency of bubblewrap itself) through ctypes: its
Python binding is not on PyPI for our interpreter, and four C calls are all it takes. A deny list, as
Flatpak's: everything a PyTorch job needs stays allowed; the kernel surfaces a sandbox escape goes
through are refused with EPERM (namespaces and mounts, kernel keyrings, BPF, perf, userfaultfd,
io_uring, modules, handle-based opens, ptrace of the sandbox's own processes, sockets of any family
but AF_UNIX, AF_INET(6) and AF_NETLINK, which the empty network namespace already makes useless).
Without libseccomp the sandbox still runs (namespaces are the wall); GET /v1/meta says `seccomp: false`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import tempfile

_ALLOW = 0x7FFF0000  # SCMP_ACT_ALLOW
_DENY = 0x00050000 | errno.EPERM  # SCMP_ACT_ERRNO(EPERM)
_SCMP_CMP_EQ, _SCMP_CMP_GT = 4, 6  # enum scmp_compare
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
_FAMILIES = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)
DENIED = (
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "open_by_handle_at",
    "name_to_handle_at",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "syslog",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "settimeofday",
    "clock_settime",
    "adjtimex",
    "iopl",
    "ioperm",
    "quotactl",
    "fanotify_init",
    "lookup_dcookie",
    "vhangup",
)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


@functools.cache
def _lib():
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def available() -> bool:
    return program() is not None


@functools.cache
def program() -> bytes | None:
    """The compiled BPF program (a few hundred bytes), or None without libseccomp."""
    lib = _lib()
    if lib is None:
        return None
    ctx = lib.seccomp_init(_ALLOW)
    if not ctx:
        return None
    try:
        for name in DENIED:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number >= 0 and lib.seccomp_rule_add_array(ctx, _DENY, number, 0, None) != 0:
                return None
        if not _deny_socket_families(lib, ctx):
            return None
        return _export(lib, ctx)
    finally:
        lib.seccomp_release(ctx)


def _deny_socket_families(lib, ctx) -> bool:
    """socket(domain, …) refused for every domain but AF_UNIX, AF_INET(6) and AF_NETLINK (libraries ask
    netlink about interfaces; the empty network namespace answers 'lo'): raw packets, bluetooth, vsock…"""
    number = lib.seccomp_syscall_resolve_name(b"socket")
    rules = [(_SCMP_CMP_GT, AF_NETLINK)] + [(_SCMP_CMP_EQ, f) for f in range(AF_NETLINK) if f not in _FAMILIES]
    return all(
        lib.seccomp_rule_add_array(ctx, _DENY, number, 1, ctypes.byref(_ArgCmp(0, op, value, 0))) == 0
        for op, value in rules
    )


def _export(lib, ctx) -> bytes | None:
    with tempfile.TemporaryFile() as f:
        if lib.seccomp_export_bpf(ctx, f.fileno()) != 0:
            return None
        f.seek(0)
        return f.read()
