"""Futexes on words of a shared mapping (Linux, x86-64): sleep until a word changes, wake its
sleepers. ``slots.py`` sleeps on the ranks' counters, ``mailbox.py`` on a member's doorbell.
Imports the standard library only.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

_SYS_FUTEX = 202
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared (not PRIVATE): the word lives in a shared mapping


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_syscall: Callable[..., int] | None
try:
    _syscall = ctypes.CDLL(None, use_errno=True).syscall
except (OSError, AttributeError):  # pragma: no cover - every Linux libc has syscall()
    _syscall = None


def wait(address: int, expected: int, seconds: float) -> None:
    """Sleep up to ``seconds`` while the 32-bit word at ``address`` holds ``expected`` (or until
    a ``wake`` on it)."""
    if _syscall is None:
        time.sleep(min(seconds, 0.001))
        return
    whole = int(seconds)
    timeout = _Timespec(whole, int((seconds - whole) * 1e9))
    _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAIT, ctypes.c_uint32(expected),
             ctypes.byref(timeout), None, 0)


def wake(address: int) -> None:
    """Wake every sleeper on the word at ``address``."""
    if _syscall is not None:
        _syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)
