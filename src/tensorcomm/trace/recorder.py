"""The flight recorder: each rank keeps its last calls and writes them to a file when one fails.

Every call of every group passes ``start`` (or ``issue`` then ``started`` when it is queued) and
``end``. Each makes or updates one ``Call`` in a ring of ``TENSORCOMM_FLIGHT_CALLS`` entries
(default ``config.FLIGHT_CALLS``; 0 turns the recorder off), with its state, its times and the
caller's file and line: the first frame outside tensorcomm (and torch.distributed), found by a
walk up the stack that looks each code object up in a dictionary. A failed call writes the ring
to ``<dir>/rank<R>.json`` (``dump``), as does SIGUSR1 where the handler could be installed
(``install_signal_handler``). ``tensorcomm trace analyze`` reads those files (``analyze.py``).
docs/tracing.md has the file format and the measured cost.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from ..config import FLIGHT_CALLS

if TYPE_CHECKING:
    from ..algorithms.base import Plan, Team

log = logging.getLogger("tensorcomm.trace")

ISSUED, STARTED, COMPLETED, FAILED = "issued", "started", "completed", "failed"
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_FOREIGN_INTERNAL = (os.sep + os.path.join("torch", "distributed") + os.sep,
                     os.sep + os.path.join("torch", "nn", "parallel") + os.sep)


class Call:
    """One recorded call: what it was, where it was made, and how far it got.

    Times are ``time.time_ns()``; ``seq`` is None until a queued call starts.
    """

    __slots__ = ("index", "state", "seq", "team", "plan_label", "signature", "algorithm",
                 "issued", "started_at", "ended", "code", "offset", "error")

    index: int
    state: str
    seq: int | None
    team: Team
    plan_label: str
    signature: Any
    algorithm: str
    issued: int
    started_at: int
    ended: int
    code: CodeType | None
    offset: int  # of the caller's current instruction in ``code``
    error: str | None

    def to_json(self) -> dict[str, Any]:
        """The call as a JSON object (see docs/tracing.md)."""
        team = self.team
        code = self.code
        sig = self.signature
        state = self.state
        return {
            "index": self.index, "state": self.state, "seq": self.seq,
            "group": team.group_name, "group_id": team.group_id, "ranks": list(team.ranks),
            "collective": self.plan_label.split(" ", 1)[0], "call": sig.describe(),
            "signature": list(sig), "algorithm": self.algorithm, "transport": transport_name(team),
            "issued_ns": self.issued, "started_ns": None if state == ISSUED else self.started_at,
            "ended_ns": self.ended if state in (COMPLETED, FAILED) else None,
            "site": None if code is None
            else f"{code.co_filename}:{_line(code, self.offset)} ({code.co_name})",
            "error": self.error if state == FAILED else None,
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
_now = time.time_ns
_getframe = sys._getframe
# The ring's entries are made once and overwritten in place: a call allocates nothing the
# garbage collector tracks. A call holds its entry by index; ``index % _size`` finds it, and an
# entry whose ``index`` differs has been reused since (that call's updates are dropped).
_ring: list[Call] = []  # made below, by _empty_ring
_counter = itertools.count()
_internal: dict[CodeType, bool] = {}  # code object -> whether it belongs to tensorcomm (or torch.distributed)
_lock = threading.RLock()  # RLock: a SIGUSR1 dump may interrupt a dump on the main thread
_dir: str | None = None
_dumps: list[dict[str, Any]] = []  # why and when this process dumped, newest last
# Called with each finished call while a timeline is being written (chrome.py), else None.
sink: Callable[[Call], None] | None = None


def _empty_ring(size: int) -> list[Call]:
    ring = []
    for _ in range(size):
        call = Call()
        call.index = -1
        ring.append(call)
    return ring


_ring = _empty_ring(_size)


def configure(calls: int, directory: str | None = None) -> None:
    """Keep the last ``calls`` calls (0: record nothing) and dump them into ``directory``
    (None: ``dump_dir()``'s default). Forgets what was recorded.

    Raises:
        ValueError: ``calls`` is negative.
    """
    global _size, _ring, _dir
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
        raise ValueError(f"flight recorder: calls must be an int >= 0, got {calls!r}")
    with _lock:
        _size, _ring, _dir = calls, _empty_ring(calls), directory


def dump_dir() -> str:
    """Where ``dump`` writes: the configured directory, else ``<tempdir>/tensorcomm-flight-<uid>``."""
    if _dir:
        return _dir
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(tempfile.gettempdir(), f"tensorcomm-flight-{uid}")


def _is_internal(code: CodeType) -> bool:
    name = code.co_filename
    inside = _internal[code] = name.startswith(_PACKAGE) or any(part in name for part in _FOREIGN_INTERNAL)
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
        code = frame.f_code
        inside = internal.get(code)
        if not (_is_internal(code) if inside is None else inside):
            _depth = depth - 1
            return frame
        frame = frame.f_back
        depth += 1
    return None


_depth = 2  # how far above _caller_frame the last call's innermost tensorcomm frame was


def issue(team: Team, plan: Plan, seq: int | None = None) -> int:
    """Record a call about to run (``seq`` given: it runs now) or to be queued (``seq`` None);
    return its index for ``started`` and ``end`` (-1 when the recorder is off)."""
    size = _size
    if not size:
        return -1
    index = next(_counter)
    call = _ring[index % size]
    call.index = -1  # half-written: a dump skips it
    call.team = team
    call.plan_label = plan.label
    call.signature = plan.signature
    call.algorithm = plan.algorithm
    frame = _caller_frame()
    if frame is None:
        call.code, call.offset = None, 0
    else:  # the line is found from the instruction offset when dumped: f_lineno costs more
        call.code, call.offset = frame.f_code, frame.f_lasti
    call.issued = call.started_at = _now()  # a queued call's start is set by started()
    if seq is None:
        call.state, call.seq = ISSUED, None
    else:
        call.state, call.seq = STARTED, seq
    call.index = index
    return index


def started(index: int, seq: int) -> None:
    """The queued call ``index`` starts with sequence number ``seq``."""
    ring = _ring
    if index >= 0 and ring:
        call = ring[index % len(ring)]
        if call.index == index:
            call.seq = seq
            call.started_at = _now()
            call.state = STARTED


def end(index: int, error: BaseException | None = None) -> None:
    """The call ``index`` finished; a failed one (``error``) dumps the ring (``dump``)."""
    if index < 0:
        return
    ring = _ring
    call = ring[index % len(ring)] if ring else None
    if call is None or call.index != index:
        return
    call.ended = _now()
    if error is None:
        call.state = COMPLETED
    else:
        call.error = f"{type(error).__name__}: {error}"
        call.state = FAILED
    if sink is not None:
        sink(call)
    if error is not None:
        global _failure_dumped
        now = time.monotonic()
        if now - _failure_dumped >= FAILURE_DUMP_INTERVAL:  # the first of a cascade tells most
            _failure_dumped = now
            dump(f"{call.plan_label} (step {call.seq}) failed: {call.error}")


FAILURE_DUMP_INTERVAL = 1.0  # seconds: failed calls closer together than this dump once
_failure_dumped = -FAILURE_DUMP_INTERVAL


def calls() -> list[Call]:
    """The recorded calls, oldest first."""
    with _lock:
        kept = [call for call in _ring if call.index >= 0]
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
    process id); return the path, or None if the recorder is off or writing failed (logged)."""
    if not _size:
        return None
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
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            handle, temporary = tempfile.mkstemp(prefix=f".{name}.", dir=directory)  # never a link
            try:
                with os.fdopen(handle, "w") as out:
                    json.dump(record, out, indent=1)
                os.replace(temporary, path)
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError as exc:
            log.warning("tensorcomm: could not write the flight record to %s: %s", path, exc)
            return None
    log.warning("tensorcomm: flight record of rank %s written to %s (%s)", rank, path, reason)
    return path


def _on_signal(signum: int, frame: FrameType | None) -> None:
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
