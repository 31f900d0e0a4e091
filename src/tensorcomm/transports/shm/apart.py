"""Members of a domain that wait for each other on one core, found and moved apart.

Linux places a process woken from a sleep near the one that woke it, so two ranks that wait for
each other in turn can end up on one core while other busy processes (a data loader, another
job) hold the rest. The load balancer counts runnable processes, not who waits for whom, and
sees nothing wrong: from then on every step of every call waits for the other rank's turn on the
core (measured beside two busy processes on a 2-core VM, 8-byte all_reduce at 2 ranks: about
20 µs a call on one core, 8 µs apart; quiet, 4 µs). It happened in about half of the runs,
often from the job's start.

So a wait that is about to give its core away (``Slots._block``) first writes the core it runs on
into its line, and reads the one the peer it waits for wrote last: when they match, it moves
itself to another core it may use, by leaving the current one out of its thread's CPU mask for a
moment (the mask is set back at once; the thread stays where the kernel moved it). It does so
only where the domain's members have a core each (with more members than cores, sharing is the
rule, not a mistake), at most every ``MOVE_SECONDS``, and never where the thread may run on one
core only (a launcher's or the user's binding is kept). Linux only (``sched_getcpu``); elsewhere,
and once a sandbox refuses the mask, ``Apart.enabled`` is False.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

MOVE_SECONDS = 0.005  # the least time between two moves of one thread

_getcpu: Callable[[], int] | None
try:
    _getcpu = ctypes.CDLL(None).sched_getcpu
except (OSError, AttributeError):  # pragma: no cover - not glibc/musl on Linux
    _getcpu = None


def usable_cores() -> int:
    """The cores this thread may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class Apart:
    """One member's side: its word for the core it waits on and the words of its peers.

    Attributes:
        enabled: whether this member checks at all (Linux, and a core for each member).
        moves: how many times this member moved itself.
    """

    def __init__(self, words: memoryview, word_of: tuple[int, ...], rank: int) -> None:
        self._words = words
        self._word_of = word_of  # per member: its word for 1 + the core it last waited on
        self._mine = word_of[rank]
        self.enabled = _getcpu is not None and len(word_of) <= usable_cores()
        self._moved = -MOVE_SECONDS
        self.moves = 0

    def check(self, peer: int, now: float) -> None:
        """Before yielding the core to wait for ``peer``: note this member's core, and move to
        another if ``peer`` last waited on this one (at ``now``, ``time.monotonic()``)."""
        if not self.enabled:
            return
        cpu = _getcpu()  # type: ignore[misc]  # set where enabled
        words = self._words
        if words[self._word_of[peer]] == cpu + 1 and now >= self._moved + MOVE_SECONDS:
            self._moved = now
            cpu = self._move(cpu)
        words[self._mine] = cpu + 1

    def _move(self, cpu: int) -> int:
        """Move this thread off core ``cpu`` if its mask allows another; return where it runs."""
        try:
            mask = os.sched_getaffinity(0)
            if len(mask) < 2 or cpu not in mask:
                return cpu
            try:
                os.sched_setaffinity(0, mask - {cpu})
            finally:
                os.sched_setaffinity(0, mask)
        except OSError:  # not allowed here (a sandbox): wait as before, and stop checking
            self.enabled = False
            return cpu
        self.moves += 1
        return _getcpu()  # type: ignore[misc]
