"""``MPI.Request`` and ``MPI.Prequest``: handles of nonblocking and persistent operations.

A request holds a ``Pending`` operation (a point-to-point message of ``p2p.py``, a tensorcomm
``Work`` of a collective) until it completes; then it becomes ``REQUEST_NULL`` (a persistent
request becomes inactive, to be started again). Imports the MPI package's ``status`` and
``exceptions`` and ``core.work``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..core.work import Work
from ..errors import CommError, CommTimeoutError
from . import exceptions, runtime
from .status import Status


class Pending(Protocol):
    """An operation in flight, as a request sees it."""

    def done(self) -> bool:
        """Whether it has finished, moving it on without waiting."""
        ...

    def finish(self) -> Any:
        """Wait until it has finished; return its object (None for buffer operations).

        Raises:
            MPI.Exception: it failed (the error it failed with, made an ``MPI.Exception``).
        """
        ...

    def describe(self, status: Status) -> None:
        """Fill ``status`` (once finished)."""
        ...

    def cancel(self) -> bool:
        """Cancel it if it has not matched yet; whether it was."""
        ...


class WorkPending:
    """A tensorcomm ``Work`` (a nonblocking collective), with what to do once it is done."""

    __slots__ = ("work", "after", "_result", "_done")

    def __init__(self, work: Work | None, after: Callable[[], Any] | None = None) -> None:
        self.work, self.after, self._result, self._done = work, after, None, False

    def done(self) -> bool:
        return self._done or self.work is None or self.work.is_completed()

    def finish(self) -> Any:
        if not self._done:
            if self.work is not None:
                self.work.wait()
            if self.after is not None:
                self._result = self.after()
            self._done = True
        return self._result

    def describe(self, status: Status) -> None:
        status._clear()

    def cancel(self) -> bool:
        return False


def finish_pending(pending: Pending) -> Any:
    """Wait for ``pending`` to finish; its result, a tensorcomm error made an ``MPI.Exception``."""
    try:
        return pending.finish()
    except CommError as exc:
        raise exceptions.as_mpi(exc) from None


class Request:
    """A nonblocking operation's handle; ``Request()`` is ``REQUEST_NULL``."""

    __slots__ = ("_pending", "__weakref__")

    def __init__(self, request: Request | None = None) -> None:
        self._pending: Pending | None = None if request is None else request._pending

    def __bool__(self) -> bool:
        return self._pending is not None

    def _key(self) -> object:
        return self._pending

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return self._key() is other._key()

    def __hash__(self) -> int:
        return id(self._key())

    def _complete(self, status: Status | None) -> Any:
        pending = self._pending
        if pending is None:
            if status is not None:
                status._clear()
            return None
        result = finish_pending(pending)
        if status is not None:
            pending.describe(status)
        self._release()
        return result

    def _release(self) -> None:
        self._pending = None

    def Wait(self, status: Status | None = None) -> bool:
        """Wait for completion; fill ``status``."""
        self._complete(status)
        return True

    def wait(self, status: Status | None = None) -> Any:
        """Wait for completion; return the received object (None for a send)."""
        return self._complete(status)

    def Test(self, status: Status | None = None) -> bool:
        """Whether the operation has completed (completing it if so)."""
        if self._pending is not None and not self._pending.done():
            return False
        self._complete(status)
        return True

    def test(self, status: Status | None = None) -> tuple[bool, Any]:
        """``(done, object)`` without waiting."""
        if self._pending is not None and not self._pending.done():
            return False, None
        return True, self._complete(status)

    def Get_status(self, status: Status | None = None) -> bool:
        """Whether the operation has completed, without freeing the request."""
        pending = self._pending
        if pending is None:
            if status is not None:
                status._clear()
            return True
        if not pending.done():
            return False
        if status is not None:
            pending.describe(status)
        return True

    def get_status(self, status: Status | None = None) -> bool:
        """As ``Get_status``."""
        return self.Get_status(status)

    def Cancel(self) -> None:
        """Cancel a receive that has not matched yet (a no-op otherwise)."""
        if self._pending is not None:
            self._pending.cancel()

    def cancel(self) -> None:
        """As ``Cancel``."""
        self.Cancel()

    def Free(self) -> None:
        """Let the operation complete on its own and drop the handle."""
        self._pending = None

    def free(self) -> None:
        """As ``Free``."""
        self.Free()

    # -- many requests ---------------------------------------------------------------------

    @classmethod
    def Waitall(cls, requests: Sequence[Request], statuses: list[Status] | None = None) -> bool:
        """Wait for every request; fill ``statuses`` in order."""
        _fill(statuses, len(requests))
        for i, request in enumerate(requests):
            request._complete(_at(statuses, i))
        return True

    @classmethod
    def waitall(cls, requests: Sequence[Request], statuses: list[Status] | None = None) -> list[Any]:
        """Wait for every request; return their objects."""
        _fill(statuses, len(requests))
        return [r._complete(_at(statuses, i)) for i, r in enumerate(requests)]

    @classmethod
    def Testall(cls, requests: Sequence[Request], statuses: list[Status] | None = None) -> bool:
        """Whether every request has completed (completing them all if so)."""
        if not all(r._pending is None or r._pending.done() for r in requests):
            return False
        return cls.Waitall(requests, statuses)

    @classmethod
    def testall(cls, requests: Sequence[Request],
                statuses: list[Status] | None = None) -> tuple[bool, list[Any] | None]:
        """``(True, objects)`` once every request has completed, else ``(False, None)``."""
        if not all(r._pending is None or r._pending.done() for r in requests):
            return False, None
        return True, cls.waitall(requests, statuses)

    @classmethod
    def Waitany(cls, requests: Sequence[Request], status: Status | None = None) -> int:
        """Wait for one request; return its index (``UNDEFINED`` if none is active)."""
        return _any(requests, status, block=True)[0]

    @classmethod
    def waitany(cls, requests: Sequence[Request], status: Status | None = None) -> tuple[int, Any]:
        """``(index, object)`` of the first request to complete."""
        return _any(requests, status, block=True)

    @classmethod
    def Testany(cls, requests: Sequence[Request], status: Status | None = None) -> tuple[int, bool]:
        """``(index, flag)``: a completed request's index, if one has."""
        index, _ = _any(requests, status, block=False)
        return index, index != _UNDEFINED or all(not r for r in requests)

    @classmethod
    def testany(cls, requests: Sequence[Request],
                status: Status | None = None) -> tuple[int, bool, Any]:
        """``(index, flag, object)``: a completed request, if one has."""
        index, value = _any(requests, status, block=False)
        return index, index != _UNDEFINED or all(not r for r in requests), value

    @classmethod
    def Waitsome(cls, requests: Sequence[Request],
                 statuses: list[Status] | None = None) -> list[int] | None:
        """Wait for at least one request; the indices of those that completed."""
        return _some(requests, statuses, block=True)[0]

    @classmethod
    def waitsome(cls, requests: Sequence[Request],
                 statuses: list[Status] | None = None) -> tuple[list[int] | None, list[Any] | None]:
        """``(indices, objects)`` of at least one completed request."""
        return _some(requests, statuses, block=True)

    @classmethod
    def Testsome(cls, requests: Sequence[Request],
                 statuses: list[Status] | None = None) -> list[int] | None:
        """The indices of the requests that have completed."""
        return _some(requests, statuses, block=False)[0]

    @classmethod
    def testsome(cls, requests: Sequence[Request],
                 statuses: list[Status] | None = None) -> tuple[list[int] | None, list[Any] | None]:
        """``(indices, objects)`` of the requests that have completed."""
        return _some(requests, statuses, block=False)

    @classmethod
    def Get_status_all(cls, requests: Sequence[Request], statuses: list[Status] | None = None) -> bool:
        """Whether every request has completed, without freeing them."""
        _fill(statuses, len(requests))
        flags = [r.Get_status(_at(statuses, i)) for i, r in enumerate(requests)]
        return all(flags)

    get_status_all = Get_status_all

    @classmethod
    def Get_status_any(cls, requests: Sequence[Request], status: Status | None = None) -> tuple[int, bool]:
        """``(index, flag)`` of a completed request, without freeing it."""
        for i, request in enumerate(requests):
            if request and request.Get_status(status):
                return i, True
        if status is not None and all(not r for r in requests):
            status._clear()
        return _UNDEFINED, all(not r for r in requests)

    get_status_any = Get_status_any

    @classmethod
    def Get_status_some(cls, requests: Sequence[Request],
                        statuses: list[Status] | None = None) -> list[int] | None:
        """The indices of completed requests, without freeing them."""
        if all(not r for r in requests):
            return None
        return [i for i, r in enumerate(requests) if r and r.Get_status()]

    get_status_some = Get_status_some

    @classmethod
    def Cancelall(cls, requests: Sequence[Request]) -> None:
        """Cancel every request."""
        for request in requests:
            request.Cancel()


_UNDEFINED = -32766


def _fill(statuses: Sequence[Status] | None, count: int) -> None:
    """Grow a list of statuses to ``count`` (a tuple is filled as far as it goes)."""
    if isinstance(statuses, list):
        while len(statuses) < count:
            statuses.append(Status())


def _at(statuses: Sequence[Status] | None, i: int) -> Status | None:
    return statuses[i] if statuses is not None and i < len(statuses) else None


def _pause(spins: int, deadline: float) -> None:
    """Yield, then sleep a little; past ``deadline`` (the job's timeout) raise."""
    if spins % 1000 == 999 and time.monotonic() > deadline:
        raise exceptions.as_mpi(CommTimeoutError("no request of the set completed within the job's timeout"))
    time.sleep(0 if spins < 100 else 0.0005)


def _deadline() -> float:
    return time.monotonic() + runtime.world().timeout


def _any(requests: Sequence[Request], status: Status | None, block: bool) -> tuple[int, Any]:
    spins, deadline = 0, _deadline()
    while True:
        active = False
        for i, request in enumerate(requests):
            pending = request._pending
            if pending is None:
                continue
            active = True
            if pending.done():
                return i, request._complete(status)
        if not active:
            if status is not None:
                status._clear()
            return _UNDEFINED, None
        if not block:
            return _UNDEFINED, None
        _pause(spins, deadline)
        spins += 1


def _some(requests: Sequence[Request], statuses: list[Status] | None,
          block: bool) -> tuple[list[int] | None, list[Any] | None]:
    spins, deadline = 0, _deadline()
    while True:
        if all(r._pending is None for r in requests):
            return None, None
        ready = [i for i, r in enumerate(requests) if r._pending is not None and r._pending.done()]
        if ready or not block:
            _fill(statuses, len(ready))
            values = [requests[i]._complete(_at(statuses, k)) for k, i in enumerate(ready)]
            if isinstance(statuses, list):
                del statuses[len(ready):]
            return ready, values
        _pause(spins, deadline)
        spins += 1


class Prequest(Request):
    """A persistent request: ``Start`` runs the operation again, ``Wait`` completes it; it stays
    (inactive) until freed."""

    __slots__ = ("_start",)

    def __init__(self, request: Request | None = None) -> None:
        super().__init__(request)
        self._start: Callable[[], Pending] | None = getattr(request, "_start", None)

    @classmethod
    def _made(cls, start: Callable[[], Pending]) -> Prequest:
        request = cls()
        request._start = start
        return request

    def __bool__(self) -> bool:
        return self._start is not None

    def _key(self) -> object:
        return self._start

    def _release(self) -> None:
        self._pending = None  # inactive, ready to start again

    def Start(self) -> None:
        """Start the operation."""
        if self._start is None:
            raise exceptions.error(exceptions.ERR_REQUEST, "Start: the request was freed")
        if self._pending is not None:
            raise exceptions.error(exceptions.ERR_REQUEST, "Start: the request is active already")
        self._pending = self._start()

    def start(self) -> None:
        """As ``Start``."""
        self.Start()

    @classmethod
    def Startall(cls, requests: Sequence[Prequest]) -> None:
        """Start every request."""
        for request in requests:
            request.Start()

    def Free(self) -> None:
        """Release the request."""
        self._pending = None
        self._start = None


class Grequest(Request):
    """Generalized requests are not offered."""

    @classmethod
    def Start(cls, *args: Any) -> Grequest:
        """Not offered: raises NotImplementedError."""
        raise NotImplementedError("MPI.Grequest.Start: generalized requests are not offered by "
                                  "tensorcomm.MPI; see docs/mpi.md")
