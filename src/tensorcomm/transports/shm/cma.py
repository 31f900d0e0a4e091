"""Cross-memory attach (CMA): copy straight between two processes' memory, one copy per byte.

Owns the calls into libc (``process_vm_readv``, ``process_vm_writev``, ``prctl``), the check of
whether the kernel lets this process read its peers (Yama's ``ptrace_scope``, seccomp), and the
grant that lets them read it. Imports the standard library only; ``domain.py`` uses it and names
the ranks in errors.

The kernel lets process A read or write process B's memory with these calls when A may ptrace B
(``PTRACE_MODE_ATTACH_REALCREDS``): the same user, B not made undumpable, and, under the Yama
security module, ``/proc/sys/kernel/yama/ptrace_scope``:

    0  any process of the same user: nothing to grant
    1  only B's descendants, or a process B named with ``prctl(PR_SET_PTRACER, pid)`` and that
       process's descendants: ``grant`` names the peer of a group of two, else the members'
       common parent (the launcher that started them: ``tensorcomm run``, torchrun, mpiexec).
       Never ``PR_SET_PTRACER_ANY``.
    2, 3  only a process with ``CAP_SYS_PTRACE`` (2) or none at all (3): CMA is off

A seccomp filter (containers) may refuse the calls outright. Whatever the settings say, the
members also read a few bytes of each other before they rely on it (``domain.settle``).
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Sequence

YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
PR_SET_PTRACER = 0x59616D61  # "Yama"


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_IOV = ctypes.POINTER(_Iovec)
_readv: Callable[..., int] | None = None
_writev: Callable[..., int] | None = None
_prctl: Callable[..., int] | None = None
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _readv, _writev, _prctl = _libc.process_vm_readv, _libc.process_vm_writev, _libc.prctl
    for _fn in (_readv, _writev):
        _fn.argtypes = [ctypes.c_int, _IOV, ctypes.c_ulong, _IOV, ctypes.c_ulong, ctypes.c_ulong]
        _fn.restype = ctypes.c_ssize_t
    _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    _prctl.restype = ctypes.c_int
except (OSError, AttributeError):  # pragma: no cover - a libc without them (not glibc/musl on Linux)
    _readv = _writev = _prctl = None


class CmaError(OSError):
    """A cross-memory copy moved fewer bytes than asked (``moved``), or none (``errno`` says why)."""

    def __init__(self, code: int, moved: int, nbytes: int) -> None:
        reason = os.strerror(code) if code else "the other process's memory ended early"
        super().__init__(code, f"{reason} (moved {moved} of {nbytes} bytes)")
        self.moved = moved


def available() -> bool:
    """Whether libc offers the calls (Linux with glibc or musl)."""
    return _readv is not None


def _copy(fn: Callable[..., int] | None, pid: int, local: int, remote: int, nbytes: int) -> None:
    if fn is None:
        raise CmaError(errno.ENOSYS, 0, nbytes)
    here, there = _Iovec(local, nbytes), _Iovec(remote, nbytes)
    moved = fn(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)
    if moved != nbytes:
        raise CmaError(ctypes.get_errno() if moved < 0 else 0, max(moved, 0), nbytes)


def read(pid: int, local: int, remote: int, nbytes: int) -> None:
    """Copy ``nbytes`` from address ``remote`` of process ``pid`` to ``local`` here.

    Raises:
        CmaError: not every byte was copied (a short read is a failure, never a result).
    """
    _copy(_readv, pid, local, remote, nbytes)


def write(pid: int, local: int, remote: int, nbytes: int) -> None:
    """Copy ``nbytes`` from ``local`` here to address ``remote`` of process ``pid``.

    Raises:
        CmaError: not every byte was copied.
    """
    _copy(_writev, pid, local, remote, nbytes)


def yama_scope() -> int | None:
    """Yama's ``ptrace_scope`` (0-3), or None where Yama is not loaded."""
    try:
        with open(YAMA_SCOPE, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def seccomp_mode() -> int:
    """This process's seccomp mode (0 none, 1 strict, 2 filter), from ``/proc/self/status``."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Seccomp:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (``/proc/<pid>/stat``), or None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descends(pid: int, ancestor: int, parent: Callable[[int], int | None] = parent_of) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its descendants (Yama's rule for a named ptracer)."""
    seen = 0
    while pid > 1 and seen < 4096:
        if pid == ancestor:
            return True
        pid, seen = parent(pid) or 0, seen + 1
    return pid == ancestor


def ptracer(scope: int | None, me: int, pids: Sequence[int],
            parent: Callable[[int], int | None] = parent_of) -> tuple[int | None, str | None]:
    """Whom this process (pid ``me``, one of the members' ``pids``) must name with
    ``PR_SET_PTRACER`` so that the other members may read it: ``(pid, None)``; ``(None, None)``
    when nothing needs granting; ``(None, reason)`` when they cannot be let in.

    The narrowest that covers them: the one peer of a group of two; else the members' common
    parent (their launcher), never init (pid 1), whose descendants are every process.
    """
    if not scope:
        return None, None
    if scope >= 2:
        return None, (f"Yama's ptrace_scope is {scope}: only processes with CAP_SYS_PTRACE"
                      if scope == 2 else "Yama's ptrace_scope is 3: no process") + \
            " may read another's memory"
    others = [pid for pid in pids if pid != me]
    if len(others) == 1:
        return others[0], None
    parents = {parent(pid) for pid in pids}
    if len(parents) == 1 and None not in parents and 1 not in parents:
        return parents.pop(), None
    return None, ("Yama's ptrace_scope is 1 and the members have no common parent (a launcher) "
                  "to name as the process whose descendants may read them")


_granted: int | None = None  # the pid this process named with PR_SET_PTRACER


def grant(pids: Sequence[int]) -> str | None:
    """Let the other members (``pids``, this process's included) read this process, as narrowly
    as Yama allows (``ptracer``); None when they may, else why not.

    A process names one ptracer at a time: a later group whose members do not all descend from
    the one named is refused (its reason says so) and keeps the slot path.
    """
    global _granted
    if not available():
        return "this libc has no process_vm_readv"
    if seccomp_mode() == 1:
        return "this process runs under strict seccomp"
    me = os.getpid()
    named = _granted
    if named is not None and all(descends(pid, named) for pid in pids if pid != me):
        return None
    target, reason = ptracer(yama_scope(), me, pids)
    if reason is not None or target is None:
        return reason
    if named is not None:
        return (f"this process already named pid {named} with PR_SET_PTRACER (one process at a "
                f"time), and this group's members do not all descend from it")
    assert _prctl is not None
    if _prctl(PR_SET_PTRACER, target, 0, 0, 0) != 0:
        return f"prctl(PR_SET_PTRACER, {target}) failed: {os.strerror(ctypes.get_errno())}"
    _granted = target
    return None


def refusal(code: int) -> str:
    """Why a probing read failed with ``code``, in words: the likely setting behind it."""
    if not code:
        return "it copied fewer bytes than asked"
    text = os.strerror(code)
    if code in (errno.EPERM, errno.EACCES):
        scope, mode = yama_scope(), seccomp_mode()
        if mode == 2:
            return f"{text} (a seccomp filter is active: a container's profile may refuse the call)"
        if scope:
            return f"{text} (Yama's ptrace_scope is {scope})"
        return f"{text} (another user, or a process made undumpable)"
    if code == errno.ENOSYS:
        return f"{text} (the kernel or a seccomp filter refuses process_vm_readv)"
    return text
