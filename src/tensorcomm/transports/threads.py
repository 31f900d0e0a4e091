"""Which kind of thread runs the current call: an engine's worker marks itself, transports read it.

A wait on a worker thread should give the GIL up at once rather than spin or yield in Python:
the thread that issued the call is usually running Python beside it (the rest of a backward
pass, the next forward). Each ``sched_yield`` drops the GIL and retakes it before that thread,
woken, can take it, and every such hand-over it misses restarts its wait for the GIL, so it
could wait out whole switch intervals (5 ms by default) while the worker merely waits.
"""

from __future__ import annotations

import threading

_local = threading.local()


def mark_worker() -> None:
    """Mark the calling thread as an engine worker (for as long as it lives)."""
    _local.worker = True


def on_worker() -> bool:
    """Whether the calling thread is an engine worker."""
    return getattr(_local, "worker", False)
