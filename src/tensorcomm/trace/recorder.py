"""The flight recorder: each rank keeps its last calls and writes them to a file when one fails.

The recorder observes calls; it runs none. The group tells it of every call: ``begin`` (a call
that starts at once on the calling thread) or ``issue`` then ``started`` (a queued call), then
``done`` or ``end`` (with the error of a failed call). A call costs one tuple in a ring of
``TENSORCOMM_FLIGHT_CALLS`` entries (default ``config.FLIGHT_CALLS``; 0 turns the recorder off)
and one end time; its state is read from them when dumped. The caller's file and line (the first
frame outside tensorcomm and torch.distributed) are found by walking the stack only where that
costs nothing per call: for a failed call, as it fails; for the call in flight when SIGUSR1
dumps; for a queued call; or for every call after ``configure(sites=True)``. A failed call
writes the ring to ``<dir>/rank<R>.json`` (``dump``), as does SIGUSR1 where the handler could be
installed (``install_signal_handler``). ``tensorcomm trace analyze`` reads those files
(``analyze.py``). docs/tracing.md has the file format and the measured cost."""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from ..config import FLIGHT_CALLS
from ..transports.threads import on_worker

if TYPE_CHECKING:
    from ..algorithms.base import Plan, Team

log = logging.getLogger("tensorcomm.trace")

ISSUED, STARTED, COMPLETED, FAILED = "issued", "started", "completed", "failed"
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_FOREIGN_INTERNAL = (os.sep + os.path.join("torch", "distributed") + os.sep,
                     os.sep + os.path.join("torch", "nn", "parallel") + os.sep)


Failure = tuple[str, "CodeType | None", int]  # a failed call's error, and its caller's code and offset


class Call:
    """One recorded call as ``calls()`` and a timeline's ``sink`` see it: what it was, where it
    was made (``code`` None: not recorded), and how far it got. Times are ``time.time_ns()``."""

    __slots__ = ("index", "state", "seq", "team", "plan", "issued", "started_at", "ended", "code",
                 "offset", "error")

    def __init__(self, entry: tuple[Any, ...], ended: int, failed: Failure | None) -> None:
        self.index, self.seq, self.team, self.plan, self.started_at = entry[:5]
        sited = len(entry) == _SITED
        self.issued, self.code, self.offset = entry[5:] if sited else (self.started_at, None, 0)
        self.ended = ended
        self.error = None
        if self.seq is None:
            self.state = ISSUED
        elif ended < self.started_at:  # the slot's previous call's end
            self.state = STARTED
        elif failed is not None:
            self.state = FAILED
            self.error = failed[0]
            if self.code is None:
                self.code, self.offset = failed[1:]
        else:
            self.state = COMPLETED

    def to_json(self) -> dict[str, Any]:
        """The call as a JSON object (see docs/tracing.md)."""
        team, plan, code, state = self.team, self.plan, self.code, self.state
        sig = plan.signature
        return {
            "index": self.index, "state": state, "seq": self.seq,
            "group": team.group_name, "group_id": team.group_id, "ranks": list(team.ranks),
            "collective": plan.label.split(" ", 1)[0], "call": sig.describe(),
            "signature": list(sig), "algorithm": plan.algorithm, "transport": transport_name(team),
            "issued_ns": self.issued, "started_ns": None if state == ISSUED else self.started_at,
            "ended_ns": self.ended if state in (COMPLETED, FAILED) else None,
            "site": None if code is None
            else f"{code.co_filename}:{_line(code, self.offset)} ({code.co_name})",
            "error": self.error,
        }


def _line(code: CodeType, offset: int) -> int:
    """The source line of the instruction at ``offset`` in ``code``."""
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return line or 0
    return 0


def transport_name(team: Team) -> str:
    """What carries a team's calls: ``shm``, ``tcp``, ``mpi``, ``loopback``, or ``hier`` (shared
    memory within hosts and the transport between them)."""
    if team.shm is not None:
        return "shm"
    if team.hier is not None:
        return "hier"
    return type(team.transport).__name__.removesuffix("Transport").lower()


_size = FLIGHT_CALLS
_sites = False  # whether every call records its caller's site (configure); else only some (below)
_now = time.time_ns
_getframe = sys._getframe
_get_ident = threading.get_ident
# The ring: one tuple per call, stored in one operation: ``(index, seq, team, plan, started,
# thread)`` for a call recorded as it starts (``begin``; ``thread``: the ident of the thread that
# runs it), ``(index, seq, team, plan, started, issued, code, offset)`` for a queued call or one
# whose site is kept (``code``, ``offset``: the caller's code object and instruction; ``seq`` None
# and ``started`` = ``issued`` until a queued call starts). A call's
# slot is ``index % _size``; a slot holding another index has been reused (that call's updates
# are dropped). ``_ended[slot]`` is when the slot's call ended: a time before its start is its
# predecessor's, so a new call need not clear it. ``_failed``: a failed call's error and site by
# index. A blocking call records no site (walking the stack costs more than the rest of the
# recorder): a failed one takes it when it fails, the call in flight when SIGUSR1 dumps.
_EMPTY = (-1,)  # a slot no call has used
_BEGUN, _SITED = 6, 8  # the lengths of the two kinds of entries
_ring: list[tuple[Any, ...]] = [_EMPTY] * _size
_ended: list[int] = [0] * _size
_failed: dict[int, Failure] = {}
_counter = itertools.count()
_internal: dict[CodeType, bool] = {}  # code object -> whether it belongs to tensorcomm (or torch.distributed)
_lock = threading.RLock()  # RLock: a SIGUSR1 dump may interrupt a dump on the main thread
_dir: str | None = None
_dumps: list[dict[str, Any]] = []  # why and when this process dumped, newest last
# Called with each finished call while a timeline is being written (chrome.py), else None.
sink: Callable[[Call], None] | None = None


def configure(calls: int, directory: str | None = None, sites: bool = False) -> None:
    """Keep the last ``calls`` calls (0: record nothing) and dump them into ``directory``
    (None: ``dump_dir()``'s default); ``sites``: record every call's caller, not only a failed
    or queued call's (it costs about half a microsecond per call). Forgets what was recorded.

    Raises:
        ValueError: ``calls`` is negative.
    """
    global _size, _ring, _ended, _dir, _sites
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
        raise ValueError(f"flight recorder: calls must be an int >= 0, got {calls!r}")
    with _lock:
        _size, _ring, _ended, _dir, _sites = calls, [_EMPTY] * calls, [0] * calls, directory, sites
        _failed.clear()


def dump_dir() -> str:
    """Where ``dump`` writes: the configured directory, else ``flight`` in this user's private
    directory (``private.user_dir``: ``$XDG_RUNTIME_DIR/tensorcomm/flight``, else
    ``~/.cache/tensorcomm/flight``; under /tmp only for a user without a private home)."""
    if _dir:
        return _dir
    from ..rendezvous import private

    return private.user_dir("flight")


def _is_internal(code: CodeType) -> bool:
    inside = _internal.get(code)
    if inside is None:
        name = code.co_filename
        inside = name.startswith(_PACKAGE) or any(part in name for part in _FOREIGN_INTERNAL)
        _internal[code] = inside
    return inside


def _caller_frame() -> FrameType | None:
    """The innermost frame outside tensorcomm (the caller's) above ``issue``'s caller.

    Tries the depth found last time first: materialising two frames is cheaper than walking
    every one (Python makes a frame object for each frame a walk passes).
    """
    internal = _internal
    global _depth
    try:
        inner = _getframe(_depth)  # 0: this function, 1: issue, 2: issue's caller
    except ValueError:
        inner = None
    outer = None if inner is None else inner.f_back
    if inner is not None and outer is not None and internal.get(inner.f_code) is True \
            and internal.get(outer.f_code) is False:
        return outer
    frame: FrameType | None = _getframe(2)
    depth = 2
    while frame is not None:
        if not _is_internal(frame.f_code):
            _depth = depth - 1
            return frame
        frame = frame.f_back
        depth += 1
    return None


_depth = 2  # how far above _caller_frame the last call's innermost tensorcomm frame was


def begin(team: Team, plan: Plan, seq: int) -> int:
    """Record a call that starts now as step ``seq`` on the calling thread, without its caller's
    site (found only if it fails, or SIGUSR1 dumps while it runs) unless ``configure(sites=True)``;
    return its index for ``done`` and ``end`` (-1 when the recorder is off)."""
    size = _size
    if not size:
        return -1
    if _sites:
        return issue(team, plan, seq)
    index = next(_counter)
    _ring[index % size] = (index, seq, team, plan, _now(), _get_ident())
    return index


def _site(frame: FrameType | None) -> tuple[CodeType, int] | None:
    """The code and instruction offset of the first frame outside tensorcomm from ``frame``
    outward: the caller of the call running there. None on an engine's worker thread, where no
    caller waits (the queued call's site was recorded when it was issued)."""
    if on_worker():
        return None
    while frame is not None:
        if not _is_internal(frame.f_code):
            return frame.f_code, frame.f_lasti
        frame = frame.f_back
    return None


def issue(team: Team, plan: Plan, seq: int | None = None) -> int:
    """Record a call, with its caller's site, that starts now as step ``seq`` or (``seq`` None)
    is queued; return its index for ``started`` and ``end`` (-1 when the recorder is off)."""
    size = _size
    if not size:
        return -1
    index = next(_counter)
    frame = _caller_frame()
    now = _now()
    _ring[index % size] = (index, seq, team, plan, now, now, *((None, 0) if frame is None else
                                                               (frame.f_code, frame.f_lasti)))
    return index


def started(index: int, seq: int, plan: Plan) -> None:
    """The queued call ``index`` starts with sequence number ``seq``, running ``plan`` (a learned
    shape's candidate: ``algorithms/learning.py``)."""
    ring = _ring
    if ring:
        slot = index % len(ring)
        entry = ring[slot]
        if entry[0] == index:
            ring[slot] = (index, seq, entry[2], plan, _now(), *entry[5:])


def done(index: int) -> None:
    """The call ``index`` completed."""
    ring = _ring
    if ring:
        slot = index % len(ring)
        entry = ring[slot]
        if entry[0] == index:
            _ended[slot] = _now()
            if sink is not None:
                sink(Call(entry, _ended[slot], None))


def end(index: int, error: BaseException | None = None) -> None:
    """The call ``index`` finished (``done``), or failed with ``error``: then the ring is dumped
    (``dump``) with the call's site, found now if it was not recorded."""
    if error is None:
        done(index)
        return
    ring = _ring
    if not ring:
        return
    slot = index % len(ring)
    entry = ring[slot]
    if entry[0] != index:
        return
    site = _site(_getframe(1)) if len(entry) == _BEGUN else None
    text = f"{type(error).__name__}: {error}"
    failure = _failed[index] = (text, None, 0) if site is None else (text, *site)
    for stale in [i for i in _failed if i <= index - len(ring)]:
        del _failed[stale]
    _ended[slot] = _now()
    if sink is not None:
        sink(Call(entry, _ended[slot], failure))
    global _failure_dumped
    now = time.monotonic()
    if now - _failure_dumped >= FAILURE_DUMP_INTERVAL:  # the first of a cascade tells most
        _failure_dumped = now
        dump(f"{entry[3].label} (step {entry[1]}) failed: {text}")


FAILURE_DUMP_INTERVAL = 1.0  # seconds: failed calls closer together than this dump once
_failure_dumped = -FAILURE_DUMP_INTERVAL


def calls() -> list[Call]:
    """The recorded calls, oldest first."""
    with _lock:
        ring, ended, failed = list(_ring), list(_ended), dict(_failed)
    kept = [Call(entry, ended[slot], failed.get(entry[0]))
            for slot, entry in enumerate(ring) if entry is not _EMPTY]
    kept.sort(key=lambda call: call.index)
    return kept


def joined(rank: int | None, world_size: int | None) -> None:
    """This process is rank ``rank`` of ``world_size`` (None, None: it left): what ``dump``
    names the file after and records."""
    global _rank, _world_size
    _rank, _world_size = rank, world_size


_rank: int | None = None
_world_size: int | None = None


def dump(reason: str) -> str | None:
    """Write the recorded calls to ``<dump_dir()>/rank<R>.json`` (R: the global rank, else the
    process id; mode 0600); return the path, or None if the recorder is off or writing failed
    (logged; so is a directory another user owns or may write in: it is not written to)."""
    if not _size:
        return None
    from ..rendezvous import private

    rank, size = _rank, _world_size
    with _lock:
        entries = [call.to_json() for call in calls()]
        in_flight = [{key: entry[key] for key in ("group", "ranks", "seq", "call", "state")}
                     for entry in entries if entry["state"] in (ISSUED, STARTED)]
        _dumps.append({"reason": reason, "time_ns": time.time_ns(), "in_flight": in_flight})
        record = {
            "format": "tensorcomm-flight-1", "rank": rank, "world_size": size, "pid": os.getpid(),
            "host": socket.gethostname(), "dumps": list(_dumps), "calls": entries,
        }
        directory = dump_dir()
        name = f"rank{rank}.json" if rank is not None else f"pid{os.getpid()}.json"
        path = os.path.join(directory, name)
        try:  # only into a directory no one else may write in (private.py): never planted
            dir_fd = private.trusted_dir(directory, create=True, what="flight record directory")
            try:
                private.write_replacing(dir_fd, name, json.dumps(record, indent=1).encode())
            finally:
                os.close(dir_fd)
        except OSError as exc:
            log.warning("tensorcomm: could not write the flight record to %s: %s", path, exc)
            return None
    log.warning("tensorcomm: flight record of rank %s written to %s (%s)", rank, path, reason)
    return path


def _on_signal(signum: int, frame: FrameType | None) -> None:
    me = _get_ident()  # the main thread's: its call in flight, if any, gets the site it was made at
    with _lock:
        for slot, entry in enumerate(_ring):
            if len(entry) == _BEGUN and entry[5] == me and _ended[slot] < entry[4]:
                site = _site(frame)
                if site is not None:
                    _ring[slot] = (*entry[:5], entry[4], *site)
    dump(f"signal {signal.Signals(signum).name}")


def install_signal_handler() -> bool:
    """Dump on SIGUSR1: only from the main thread, and only if SIGUSR1 has no handler yet (the
    application's own stays). Return whether the handler is (now) installed."""
    usr1 = getattr(signal, "SIGUSR1", None)
    if usr1 is None or threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(usr1)
    if current is _on_signal:
        return True
    if current not in (signal.SIG_DFL, None):
        return False
    signal.signal(usr1, _on_signal)
    return True
