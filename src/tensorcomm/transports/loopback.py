"""Threads-as-ranks transport: every rank is a thread of one process, all sharing a ``LoopbackHub``.

Owns the in-memory mailboxes behind fast unit tests and docs examples, and ``run_threads``, the
helper that runs one function per rank and reports the first failure. It implements
``transports.base.Transport`` exactly (FIFO per source and tag, ``ANY_SOURCE``, size or call
signature mismatch as ``CollectiveMismatchError``, group aborts) so algorithms tested here behave
the same over shm and tcp. It imports ``transports.base``, ``errors`` and, like
``transports.base``, the ``Signature`` value type; it must not import ``core``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import CollectiveMismatchError, CommTimeoutError, GroupAbortedError, PeerLostError
from ..signature import Signature
from .base import ANY_SOURCE, Transport, group_of_tag, signature_mismatch

T = TypeVar("T")


class LoopbackRequest:
    """A send or receive on a loopback transport; satisfies ``transports.base.Request``."""

    def __init__(self, peer: int) -> None:
        self.peer = peer  # the posted peer; the actual sender once an ANY_SOURCE receive matched
        self._event = threading.Event()
        self._error: BaseException | None = None

    def _finish(self, peer: int, error: BaseException | None = None) -> None:
        self.peer = peer
        self._error = error
        self._event.set()

    def wait(self, timeout: float | None = None) -> int:
        """Block until done; return the peer's global rank.

        Raises:
            CommTimeoutError: not done within ``timeout`` seconds.
            CollectiveMismatchError: the message did not fit the posted buffer.
            CommError: the error the transport was aborted with, or closed with.
        """
        if not self._event.wait(timeout):
            raise CommTimeoutError(f"loopback request with peer {self.peer} not done after {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self.peer

    def done(self) -> bool:
        """Whether the request has finished (successfully or not)."""
        return self._event.is_set()


class _Posted:
    """A receive waiting for its message."""

    __slots__ = ("src", "out", "request", "signature", "dst")

    def __init__(self, src: int, out: memoryview, request: LoopbackRequest,
                 signature: Signature | None, dst: int) -> None:
        self.src, self.out, self.request = src, out, request
        self.signature, self.dst = signature, dst


def _failed(peer: int, error: BaseException) -> LoopbackRequest:
    request = LoopbackRequest(peer)
    request._finish(peer, error)
    return request


class LoopbackHub:
    """The mailboxes of ``size`` ranks living in one process; one lock guards them all.

    Per destination rank, messages that arrived before their receive wait in ``_unexpected`` and
    receives posted before their message wait in ``_posted``, both keyed by tag and kept in order,
    so matching is FIFO per (source, tag) and an ``ANY_SOURCE`` receive takes the oldest message.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size: expected a positive number of ranks, got {size}")
        self.size = size
        self._lock = threading.Lock()
        self._unexpected: list[dict[int, list[tuple[int, bytes, Signature | None]]]] = [
            {} for _ in range(size)]
        self._aborted_groups: dict[int, BaseException] = {}
        self._posted: list[dict[int, list[_Posted]]] = [{} for _ in range(size)]
        self._transports: dict[int, LoopbackTransport] = {}
        self._error: BaseException | None = None  # set by abort(); transports made later inherit it

    def transport(self, rank: int) -> LoopbackTransport:
        """The transport of ``rank`` (the same object on every call)."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank: expected 0 <= rank < {self.size}, got {rank}")
        with self._lock:
            if rank not in self._transports:
                self._transports[rank] = LoopbackTransport(self, rank)
                self._transports[rank]._error = self._error
            return self._transports[rank]

    def abort(self, error: BaseException) -> None:
        """Abort every transport, including those made later, with ``error``."""
        with self._lock:
            self._error = self._error or error
            transports = list(self._transports.values())
        for transport in transports:
            transport.abort(error)

    def close(self) -> None:
        """Close every transport made so far."""
        with self._lock:
            transports = list(self._transports.values())
        for transport in transports:
            transport.close()

    def _deliver(self, src: int, dst: int, tag: int, payload: bytes, signature: Signature | None) -> None:
        with self._lock:
            waiting = self._posted[dst].get(tag, [])
            for index, posted in enumerate(waiting):
                if posted.src in (src, ANY_SOURCE):
                    del waiting[index]
                    _fill(posted, src, tag, payload, signature)
                    return
            self._unexpected[dst].setdefault(tag, []).append((src, payload, signature))

    def _post(self, dst: int, tag: int, posted: _Posted) -> None:
        with self._lock:
            aborted = self._aborted_groups.get(group_of_tag(tag))
            if aborted is not None:
                posted.request._finish(posted.src, aborted)
                return
            arrived = self._unexpected[dst].get(tag, [])
            for index, (src, payload, signature) in enumerate(arrived):
                if posted.src in (src, ANY_SOURCE):
                    del arrived[index]
                    _fill(posted, src, tag, payload, signature)
                    return
            self._posted[dst].setdefault(tag, []).append(posted)

    def _abort_group(self, group_id: int, error: BaseException, only: int | None = None) -> None:
        with self._lock:
            if only is None:
                self._aborted_groups.setdefault(group_id, error)
            pending = []
            for mailbox in self._posted if only is None else [self._posted[only]]:
                for tag in [t for t in mailbox if group_of_tag(t) == group_id]:
                    pending.extend(mailbox.pop(tag))
        for posted in pending:
            posted.request._finish(posted.src, error)

    def _fail_posted(self, dst: int, error: BaseException) -> None:
        with self._lock:
            pending = [p for waiting in self._posted[dst].values() for p in waiting]
            self._posted[dst].clear()
        for posted in pending:
            posted.request._finish(posted.src, error)


def _fill(posted: _Posted, src: int, tag: int, payload: bytes, signature: Signature | None) -> None:
    mismatch = signature_mismatch(src, signature, posted.dst, posted.signature)
    if mismatch is not None:
        posted.request._finish(src, mismatch)
        return
    if len(payload) != len(posted.out):
        posted.request._finish(src, CollectiveMismatchError(
            f"rank {src} sent {len(payload)} bytes with tag {tag:#x}, but the receive posted for it "
            f"expects {len(posted.out)} bytes"))
        return
    posted.out[:] = payload
    posted.request._finish(src)


class LoopbackTransport(Transport):
    """One rank's end of a ``LoopbackHub``: sends copy the bytes and complete at once."""

    def __init__(self, hub: LoopbackHub, rank: int) -> None:
        self.hub = hub
        self.rank = rank
        self.size = hub.size
        self._error: BaseException | None = None
        self._closed = False

    def _check_peer(self, peer: int, allow_any: bool) -> None:
        if not (0 <= peer < self.size or (allow_any and peer == ANY_SOURCE)):
            raise ValueError(f"peer: expected a rank in [0, {self.size}), got {peer}")

    def isend(self, peer: int, data: memoryview, tag: int,
              signature: Signature | None = None) -> LoopbackRequest:
        """Copy ``data`` into ``peer``'s mailbox; the request is already complete."""
        self._check_peer(peer, allow_any=False)
        if self._error is not None:
            return _failed(peer, self._error)
        if self.hub.transport(peer)._closed:
            return _failed(peer, PeerLostError(peer, "its loopback transport is closed"))
        self.hub._deliver(self.rank, peer, tag, data.tobytes(), signature)
        request = LoopbackRequest(peer)
        request._finish(peer)
        return request

    def irecv(self, peer: int, out: memoryview, tag: int,
              signature: Signature | None = None) -> LoopbackRequest:
        """Post a receive of exactly ``len(out)`` bytes from ``peer`` (or ``ANY_SOURCE``)."""
        self._check_peer(peer, allow_any=True)
        if out.readonly:
            raise ValueError("out: receive buffers must be writable")
        if self._error is not None:
            return _failed(peer, self._error)
        request = LoopbackRequest(peer)
        self.hub._post(self.rank, tag, _Posted(peer, out.cast("B"), request, signature, self.rank))
        # An abort racing with the post above must not leave this receive pending forever.
        if self._error is not None:
            self.hub._fail_posted(self.rank, self._error)
        return request

    def abort_group(self, group_id: int, error: BaseException, tell_peers: bool = True) -> None:
        """Fail every pending and future message of ``group_id`` on every rank of the hub
        (without ``tell_peers``: this rank's pending receives of the group only)."""
        self.hub._abort_group(group_id, error, None if tell_peers else self.rank)

    def abort(self, error: BaseException) -> None:
        """Fail every pending and future request of this rank with ``error``."""
        if self._error is None:
            self._error = error
        self.hub._fail_posted(self.rank, self._error)

    def close(self) -> None:
        """Fail pending receives and refuse new requests; idempotent."""
        self._closed = True
        self.abort(GroupAbortedError(f"loopback transport of rank {self.rank} is closed"))


def run_threads(size: int, fn: Callable[[LoopbackTransport], T], timeout: float = 20.0) -> list[T]:
    """Run ``fn(transport)`` for ranks ``0..size-1`` in threads over one hub; return their results.

    When a rank raises, every other rank's transport is aborted so nobody waits for it, and the
    first exception raised (in time) is re-raised here once all threads have stopped.

    Raises:
        BaseException: the first exception any rank raised.
        CommTimeoutError: some rank had not returned after ``timeout`` seconds.
    """
    hub = LoopbackHub(size)
    results: list[T | None] = [None] * size
    failures: list[BaseException] = []
    failures_lock = threading.Lock()

    def body(rank: int) -> None:
        try:
            results[rank] = fn(hub.transport(rank))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            with failures_lock:
                failures.append(exc)
                first = len(failures) == 1
            if first:
                hub.abort(GroupAbortedError(f"rank {rank} failed: {exc!r}"))

    threads = [threading.Thread(target=body, args=(rank,), name=f"loopback-rank-{rank}", daemon=True)
               for rank in range(size)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
    with failures_lock:
        first_failure = failures[0] if failures else None
    hub.close()  # also wakes stuck ranks blocked on a receive; their errors come too late to count
    if first_failure is not None:
        raise first_failure
    if stuck:
        raise CommTimeoutError(f"run_threads: ranks {stuck} did not finish within {timeout:g} s")
    return results  # type: ignore[return-value]  # every slot was filled: no rank failed or hung
