"""Timelines: every rank writes each finished call to ``<dir>/rank<R>.trace.json`` in the Chrome
trace event format (what Perfetto and chrome://tracing open).

``start`` is collective over the world: the ranks run ``SYNC_ROUNDS`` barriers and each notes
its clock as it leaves each one; those stamps go into the file's ``tensorcomm`` header, and
``merge.py`` lines the ranks' clocks up by them. Calls are buffered as tuples and written every
``FLUSH_EVERY`` calls and at ``stop`` (``destroy()`` calls it). A file cut short by a crash is
still read by ``merge`` (the closing brackets are added).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from . import recorder

SYNC_ROUNDS = 7
FLUSH_EVERY = 4096
FORMAT = "tensorcomm-trace-1"

_lock = threading.Lock()
_out: IO[str] | None = None
_pending: list[tuple[Any, ...]] = []
_prefixes: dict[tuple[Any, ...], str] = {}  # per kind of call: its event's fixed part (_event)
_rank = 0


def _collect(call: recorder.Call) -> None:
    pending = _pending
    plan = call.plan
    pending.append((call.started_at, call.ended, call.seq, plan.label,
                    plan.signature, call.team.group_name, call.team.group_id, plan.algorithm,
                    recorder.transport_name(call.team), call.state))
    if len(pending) >= FLUSH_EVERY:
        _flush()


def _event(row: tuple[Any, ...], prefixes: dict[tuple[Any, ...], str]) -> str:
    """One call as a JSON object (a complete event, ``ph: X``); what is the same for every call
    of a plan is formatted once (``prefixes``)."""
    start, end, seq, label, sig, group, group_id, algorithm, transport, state = row
    key = (label, sig, group, group_id, algorithm, transport, state)
    prefix = prefixes.get(key)
    if prefix is None:
        from ..signature import SUPPORTED_DTYPES

        dtype = SUPPORTED_DTYPES[sig.dtype - 1] if 0 < sig.dtype <= len(SUPPORTED_DTYPES) else None
        nbytes = None if dtype is None or sig.elements < 0 else sig.elements * dtype.itemsize
        args = json.dumps({"call": sig.describe(), "dtype": None if dtype is None else dtype.name,
                           "bytes": nbytes, "group": group, "algorithm": algorithm,
                           "transport": transport, "state": state})
        prefix = prefixes[key] = (
            f'{{"name": {json.dumps(label.split(" ", 1)[0])}, "cat": "collective", "ph": "X", '
            f'"pid": {_rank}, "tid": {group_id}, "args": {args[:-1]}, "seq": ')
    return f'{prefix}{seq}}}, "ts": {start / 1000:.3f}, "dur": {max(0, end - start) / 1000:.3f}}},\n'


def _flush() -> None:
    with _lock:
        rows = _pending[:]
        del _pending[:len(rows)]
        if _out is None or not rows:
            return
        _out.write("".join([_event(row, _prefixes) for row in rows]))
        _out.flush()


def active() -> bool:
    """Whether this process is writing a timeline."""
    return _out is not None


def start(directory: str | os.PathLike[str]) -> str:
    """Start writing this rank's timeline into ``directory``; return the file's path.

    Collective: every rank of the world calls it (``TENSORCOMM_TRACE`` makes ``init()`` call
    it). It runs a few barriers on the world to measure the ranks' clock offsets. A timeline
    already being written is finished first.

    The directory is made (mode 0700) if missing; one that is a link, or that another user owns
    or may write in, is refused (docs/security.md). The file is new (mode 0600): a link or
    another user's file at its name is replaced, never followed.

    Raises:
        RuntimeError: tensorcomm is not initialised.
        PermissionError: the directory is not this user's alone to write in (the message says why).
    """
    barrier, rank, size = _world
    if barrier is None or rank is None:
        raise RuntimeError("tensorcomm.trace.start: call tensorcomm.init() first")
    stop()
    stamps = []
    for _ in range(SYNC_ROUNDS):
        barrier()
        stamps.append(time.time_ns())
    global _out, _rank
    from ..rendezvous import private

    file_name = f"rank{rank}.trace.json"
    path = os.path.join(os.fspath(directory), file_name)
    dir_fd = private.trusted_dir(os.fspath(directory), create=True, what="timeline directory")
    try:  # a new file of ours: a link or a stranger's file at that name is replaced, not followed
        fd = private.create_replacing(dir_fd, file_name)
    finally:
        os.close(dir_fd)
    header = {"format": FORMAT, "rank": rank, "world_size": size, "pid": os.getpid(),
              "clock_sync_ns": stamps}
    with _lock:
        _rank = rank
        _prefixes.clear()
        _out = os.fdopen(fd, "w")
        name = {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}
        _out.write('{"tensorcomm": ' + json.dumps(header) + ',\n"traceEvents": [\n')
        _out.write(json.dumps(name) + ",\n")
    recorder.sink = _collect
    return path


def joined(barrier: Callable[[], object] | None, rank: int | None, world_size: int | None) -> None:
    """The world ``start`` synchronises on: a barrier over it, this rank, its size (None: none)."""
    global _world
    _world = (barrier, rank, world_size)


_world: tuple[Callable[[], object] | None, int | None, int | None] = (None, None, None)


def stop() -> None:
    """Finish this rank's timeline (a no-op when none is being written)."""
    global _out
    if recorder.sink is _collect:
        recorder.sink = None
    _flush()
    with _lock:
        out, _out = _out, None
        if out is not None:
            end = {"name": "trace end", "ph": "i", "s": "p", "pid": _rank, "ts": time.time_ns() / 1000}
            out.write(json.dumps(end) + "\n]}\n")
            out.close()
