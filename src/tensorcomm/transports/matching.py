"""How the message transports (TCP, MPI) match messages to receives, what they refuse, and
the request both hand out.

Receives posted before their message and messages that came before their receive wait in FIFO
queues by (peer, tag); ``ANY_SOURCE`` receives match any peer. Each rank remembers the signatures
of its recent calls, so a message that arrives after (or for a call that needed no message from)
its sender is still checked. Lost peers and aborted groups refuse new requests. Not thread-safe:
the transport holds its own lock around every use.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ..errors import CollectiveMismatchError, CommTimeoutError
from ..signature import Signature
from .base import ANY_SOURCE, call_of_tag, group_of_tag, signature_mismatch

REMEMBERED_CALLS = 4096  # this rank's most recent calls whose signatures are kept


class Signed(Protocol):
    """A queued message: whatever the transport keeps, with the sender's call signature."""

    @property
    def signature(self) -> Signature | None: ...


class Driver(Protocol):
    """What moves a transport's messages, as its requests see it."""

    def run_until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Move messages until ``done()`` or ``timeout`` seconds (None: no limit); return ``done()``."""
        ...

    def completed(self) -> None:
        """A request finished: wake whoever waits for it in another thread."""
        ...


class MessageRequest:
    """A send or receive of a message transport, finished by whichever thread moves its message.

    ``poll`` (MPI, where no thread moves messages on its own): what ``done`` calls to make
    progress before it answers. A request with no ``driver`` is made finished.

    Attributes:
        finished: its outcome is in (set by ``finish``, or by a TCP link that has just written
            a received message into ``out``, which then calls its driver's ``completed``).
        source: the rank the message came from (a receive from any rank learns it then).
    """

    __slots__ = ("peer", "tag", "out", "signature", "source", "finished", "_error", "_driver", "_poll")

    def __init__(self, driver: Driver | None, peer: int, tag: int, out: memoryview | None = None,
                 signature: Signature | None = None, poll: Callable[[], None] | None = None) -> None:
        self.peer = peer
        self.tag = tag
        self.out = out  # a receive's buffer; None for a send
        self.signature = signature
        self.source = peer
        self.finished = False
        self._error: BaseException | None = None
        self._driver = driver
        self._poll = poll

    def finish(self, source: int, error: BaseException | None = None) -> None:
        """Finish the request (the first outcome stays) and wake its waiter."""
        if not self.finished:
            self.source = source
            self._error = error
            self.finished = True
        if self._driver is not None:
            self._driver.completed()

    def done(self) -> bool:
        if not self.finished and self._poll is not None:
            self._poll()
        return self.finished

    def wait(self, timeout: float | None = None) -> int:
        if not self.finished and (self._driver is None or not self._driver.run_until(self.done, timeout)):
            raise _timed_out(self, timeout)
        if self._error is not None:
            raise self._error
        return self.source


class Batch:
    """Message requests of one driver waited for as one (``Transport.exchange``): done once each
    is, or once the first that is not done well has failed; ``wait`` raises the first failure in
    their order, as waiting for each in turn would, and returns ``ANY_SOURCE``.

    ``done`` resumes where it stopped (``_next``), so the driver's every look at it costs one
    attribute read per request that finished since, not one per request.
    """

    __slots__ = ("requests", "_next", "_driver")

    def __init__(self, driver: Driver, requests: list[MessageRequest]) -> None:
        self.requests = requests
        self._next = 0  # the requests before it are finished without error
        self._driver = driver

    def done(self) -> bool:
        requests, i = self.requests, self._next
        end = len(requests)
        while i < end:
            request = requests[i]
            if not request.finished:
                self._next = i
                return False
            if request._error is not None:
                break
            i += 1
        self._next = i
        return True

    def wait(self, timeout: float | None = None) -> int:
        if not self.done() and not self._driver.run_until(self.done, timeout):
            raise _timed_out(self.requests[self._next], timeout)
        if self._next < len(self.requests):
            raise self.requests[self._next]._error  # type: ignore[misc]
        return ANY_SOURCE


def _timed_out(request: MessageRequest, timeout: float | None) -> CommTimeoutError:
    who = "any rank" if request.peer == ANY_SOURCE else f"rank {request.peer}"
    what = "no message from" if request.out is not None else "no receive posted by"
    return CommTimeoutError(f"{what} {who} within {timeout:g} s")


def misfit(request: MessageRequest, source: int, nbytes: int, signature: Signature | None,
           rank: int) -> BaseException | None:
    """Why a message of ``nbytes`` from ``source``, sent in the call ``signature`` names, cannot
    fill the receive ``request`` of ``rank``; None if it can."""
    mismatch = signature_mismatch(source, signature, rank, request.signature)
    if mismatch is not None:
        return mismatch
    assert request.out is not None
    if nbytes != len(request.out):
        return CollectiveMismatchError(
            f"rank {source} sent a {nbytes}-byte message where a {len(request.out)}-byte one was "
            "expected: the ranks called collectives with different sizes, dtypes or orders")
    return None


def finished(peer: int, error: BaseException | None = None) -> MessageRequest:
    """A request that is over already (sent at once, refused, or to this rank itself)."""
    request = MessageRequest(None, peer, 0)
    request._error = error
    request.finished = True
    return request


R = TypeVar("R")
M = TypeVar("M", bound=Signed)


class Matching(Generic[R, M]):
    """Posted receives (``R``), unexpected messages (``M``), recent calls and refusals of one rank."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.posted: dict[tuple[int, int], deque[R]] = {}
        self.unexpected: dict[tuple[int, int], deque[M]] = {}
        self.calls: OrderedDict[tuple[int, int], Signature] = OrderedDict()
        self.latest: dict[int, int] = {}  # group id -> latest call sequence number started
        self.lost: dict[int, BaseException] = {}
        self.aborted_groups: dict[int, BaseException] = {}
        self.aborted: BaseException | None = None

    def refusal(self, peer: int, tag: int) -> BaseException | None:
        """Why a new request to/from ``peer`` with ``tag`` must fail at once, if it must."""
        return self.aborted or self.aborted_groups.get(group_of_tag(tag)) or self.lost.get(peer)

    def post(self, peer: int, tag: int, request: R) -> None:
        self.posted.setdefault((peer, tag), deque()).append(request)

    def pop_posted(self, source: int, tag: int) -> R | None:
        """The oldest receive a message from ``source`` with ``tag`` goes to, if one is posted."""
        for key in ((source, tag), (ANY_SOURCE, tag)):
            queue = self.posted.get(key)
            if queue:
                request = queue.popleft()
                if not queue:
                    del self.posted[key]
                return request
        return None

    def abort_group(self, group_id: int, error: BaseException) -> list[R] | None:
        """Record that group ``group_id`` ended with ``error`` and take its posted receives (to
        fail them); None if it had ended already. The caller holds the transport's lock."""
        if group_id in self.aborted_groups:
            return None
        self.aborted_groups[group_id] = error
        return self.take_posted(lambda source, tag: group_of_tag(tag) == group_id)

    def take_posted(self, which: Callable[[int, int], bool]) -> list[R]:
        """Remove and return every posted receive whose (peer, tag) ``which`` selects."""
        return [r for key in [key for key in self.posted if which(*key)] for r in self.posted.pop(key)]

    def queue(self, source: int, tag: int, message: M) -> None:
        self.unexpected.setdefault((source, tag), deque()).append(message)

    def take_unexpected(self, peer: int, tag: int) -> tuple[int, M | None]:
        """The oldest queued message for a receive from ``peer`` with ``tag``, and its source."""
        for source in (range(self.size) if peer == ANY_SOURCE else (peer,)):
            queue = self.unexpected.get((source, tag))
            if queue:
                message = queue.popleft()
                if not queue:
                    del self.unexpected[(source, tag)]
                return source, message
        return peer, None

    def note_call(self, call: tuple[int, int], signature: Signature) -> BaseException | None:
        """Remember this rank's ``signature`` for ``call`` (group id, sequence number); the
        mismatch of a message already queued for it, if one disagrees."""
        if call in self.calls:
            return None
        self.calls[call] = signature
        self.latest[call[0]] = max(call[1], self.latest.get(call[0], -1))
        if len(self.calls) > REMEMBERED_CALLS:
            self.calls.popitem(last=False)
        if not self.unexpected:
            return None
        return next((signature_mismatch(source, message.signature, self.rank, signature)
                     for (source, queued_tag), queue in self.unexpected.items()
                     if call_of_tag(queued_tag) == call
                     for message in queue if message.signature != signature), None)

    def late_mismatch(self, source: int, tag: int,
                      signature: Signature | None) -> tuple[int, BaseException] | None:
        """(group id, error) when an unmatched message contradicts the call this rank made."""
        call = call_of_tag(tag)
        if call is None:
            return None
        mismatch = signature_mismatch(source, signature, self.rank, self.calls.get(call))
        return None if mismatch is None else (call[0], mismatch)

    def latest_call(self, group_id: int) -> tuple[int, Signature | None]:
        """The latest call of ``group_id`` this rank started (-1: none) and its signature."""
        latest = self.latest.get(group_id, -1)
        return latest, self.calls.get((group_id, latest))
