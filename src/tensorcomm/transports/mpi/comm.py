"""mpi4py for the MPI transport: loading it, waiting on MPI within a deadline, ending a failed job.

Every wait on MPI here polls a non-blocking request (``MPI_Idup``, ``MPI_Ibcast``...) against
tensorcomm's deadline, so a rank that never arrives is a ``RendezvousError`` naming the step,
not a process stuck inside MPI.

Ending a failed job: after a peer stopped answering, ``MPI_Finalize`` (which mpi4py calls at
exit) waits for it forever. So once this process saw the job fail (``failed``), and unless a
later ``destroy()`` heard every peer's goodbye (``recovered``), it ends the job at exit with
``MPI_Abort`` (exit code 1, every rank killed by the launcher) and says so on stderr. Imports
``errors`` (and numpy); mpi4py is imported on first use.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from types import ModuleType
from typing import Any

import numpy as np

from ...errors import RendezvousError

INSTALL_HINT = ("backend='mpi' needs mpi4py built against the MPI that starts the job: "
                "pip install 'tensorcomm[mpi]' (with mpicc on PATH; on Debian/Ubuntu "
                "apt-get install mpich libmpich-dev first)")
SPIN_POLLS = 10  # a wait polls MPI this many times back to back, then yields the core
YIELD_SECONDS = 0.002  # a wait polls MPI and yields the core this long, then sleeps between polls
MAX_PAUSE = 1e-3  # the longest sleep between two polls of a wait

_failure: str | None = None
_guarded = False


def load() -> ModuleType:
    """``mpi4py.MPI`` (initialising MPI on first use).

    Raises:
        ImportError: mpi4py is not installed; the message says how to install it.
        RuntimeError: MPI runs at a thread level below ``MPI_THREAD_SERIALIZED``.
    """
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc
    if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
        raise RuntimeError("backend='mpi': MPI was initialised below MPI_THREAD_SERIALIZED, but "
                           "tensorcomm calls MPI from its worker threads (async_op) too; leave "
                           "mpi4py.rc.thread_level at its default ('multiple') or 'serialized'")
    return MPI


class Backoff:
    """How a wait paces its polls of MPI.

    The first ``SPIN_POLLS`` polls follow each other at once; then, up to ``YIELD_SECONDS``
    into the wait, each poll is followed by ``sched_yield`` (cheap when ranks have cores of their
    own, and it hands the core over when they share one), as the shared-memory waits do
    (``transports/shm/slots.py``); then by sleeps that double up to ``MAX_PAUSE``, so a long
    wait leaves the cores to ranks doing work. MPI offers no wake-up to sleep on, so a long wait
    ends up to ``MAX_PAUSE`` late.
    """

    __slots__ = ("started", "polls", "slept")

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.polls = 0
        self.slept = 0.0

    def pause(self, now: float) -> None:
        """Pause after a poll that found the wait unfinished at ``now``."""
        self.polls += 1
        if self.polls <= SPIN_POLLS:
            return
        if now - self.started < YIELD_SECONDS:
            os.sched_yield()
            return
        self.slept = min(max(self.slept * 2, 10e-6), MAX_PAUSE)
        time.sleep(self.slept)


def wait(request: Any, timeout: float, what: str) -> None:
    """Wait for an MPI request within ``timeout`` seconds.

    Raises:
        RendezvousError: not complete in time; ``what`` names the step.
    """
    backoff = Backoff()
    while not request.Test():
        now = time.monotonic()
        if now - backoff.started > timeout:
            failed(f"{what} did not complete")
            raise RendezvousError(f"backend='mpi': {what} did not complete within {timeout:g} s: "
                                  "some ranks of the MPI job have not called tensorcomm.init()")
        backoff.pause(now)


def duplicate(timeout: float) -> Any:
    """A private copy of ``MPI_COMM_WORLD`` (errors returned, not fatal), made within ``timeout``."""
    MPI = load()
    comm, request = MPI.COMM_WORLD.Idup()
    wait(request, timeout, "duplicating MPI_COMM_WORLD")
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    return comm


def broadcast(comm: Any, data: bytes, timeout: float, what: str) -> bytes:
    """Rank 0's ``data`` on every rank of ``comm`` (others pass anything), within ``timeout``."""
    length = np.array([len(data)], np.int64)
    wait(comm.Ibcast(length, 0), timeout, what)
    buffer = bytearray(data) if comm.Get_rank() == 0 else bytearray(int(length[0]))
    wait(comm.Ibcast(buffer, 0), timeout, what)
    return bytes(buffer)


def failed(reason: str) -> None:
    """Note that the MPI job failed here: at exit, end it with ``MPI_Abort`` (see above)."""
    global _failure, _guarded
    if _failure is None:
        _failure = reason
    if not _guarded:
        _guarded = True
        atexit.register(_end_failed_job)


def recovered() -> None:
    """Every peer said goodbye: ``MPI_Finalize`` will not wait for a lost rank."""
    global _failure
    _failure = None


def _end_failed_job() -> None:
    if _failure is None:
        return
    from mpi4py import MPI

    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    sys.stderr.write(f"tensorcomm: ending the MPI job with MPI_Abort: {_failure}; MPI_Finalize "
                     "would wait for ranks that stopped answering\n")
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(1)
