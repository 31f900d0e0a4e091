"""MPI transport: tensorcomm's tagged messages carried by MPI point-to-point calls (mpi4py).

Why tensorcomm matches messages itself instead of through MPI tags: its tags are 64 bits (group,
call, step; a user's tag for send/recv) while MPI's end at ``MPI_TAG_UB`` (2**28 - 1 in MPICH
4.0), and every message must carry its sender's call signature so that the receiver catches a
mismatched call. So every message starts with a header (``framing``) and travels one of two ways:

- *eager* (up to ``EAGER_BYTES``): header and payload in one MPI message on
  ``framing.EAGER_TAG``, taken by a matched probe (``MPI_Improbe`` + ``MPI_Mrecv``), then copied
  into the posted buffer or queued until it is posted: FIFO per (source, tag);
- *bulk*: the header names an MPI tag from a per-peer counter and the payload follows on that
  tag, zero-copy from the sender's buffer into the receiver's once the receiver has matched the
  header (MPI's own rendezvous protocol, and RDMA where the fabric has it, do the rest).

Control messages (a group's abort, "which call are you in", goodbye) travel eager too.

Progress: MPI moves data only inside MPI calls, and this transport starts no thread: a rank
makes progress while it waits on a request (``wait``, ``done``), polling MPI (``comm.pause``).
Every deadline is tensorcomm's own, so a stopped or vanished peer ends as ``CommTimeoutError``
naming the call (``algorithms.base.Ctx.wait``), never as a wait inside MPI. All MPI calls are made
under one lock, so any thread may use the transport (``MPI_THREAD_SERIALIZED`` suffices).

What MPI cannot do that sockets can: tell that a peer died. MPI launchers kill the whole job when
a rank dies; a peer that stops answering is seen at the deadline; and after either, the MPI job
cannot be used again (``comm`` ends it at exit). Imports ``transports.base``, ``errors``, the
``Signature`` value type and this package.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ...errors import CommError, GroupAbortedError, PeerLostError
from ...signature import Signature
from ..base import (
    Transport,
    call_of_tag,
    decode_abort,
    encode_abort,
    group_of_tag,
)
from ..matching import Matching, MessageRequest, misfit
from . import comm as mpi_comm
from . import framing

# Up to this many payload bytes a message is copied behind its header and sent in one MPI
# message; larger ones go zero-copy on their own tag, for one more round trip.
EAGER_BYTES = 16 << 10


class _Incoming(NamedTuple):
    """A data message whose header arrived: its payload (eager) or the tag it follows on (bulk)."""

    nbytes: int
    payload: memoryview | None  # None: bulk
    bulk: int
    signature: Signature | None


class _InFlight(NamedTuple):
    """An MPI request under way, the tensorcomm request it completes (if any) and its buffer."""

    request: MessageRequest | None
    peer: int
    buffer: Any  # kept alive until MPI is done with it
    receive: bool


class MpiTransport(Transport):
    """tensorcomm's transport over a private duplicate of ``MPI_COMM_WORLD``."""

    def __init__(self, comm: Any, rank: int, size: int) -> None:
        MPI = mpi_comm.load()
        self._MPI = MPI
        self._comm = comm
        self.rank = rank
        self.size = size
        self._tag_ub = int(comm.Get_attr(MPI.TAG_UB))
        self._lock = threading.RLock()  # guards everything below, and every MPI call
        self._status = MPI.Status()
        self._match: Matching[MessageRequest, _Incoming] = Matching(rank, size)
        self._pending: list[Any] = []  # MPI requests under way ...
        self._flights: list[_InFlight] = []  # ... and what each one is for
        self._bulk_tags = [framing.FIRST_BULK_TAG] * size  # next bulk tag per peer
        self._answers: dict[tuple[int, int], tuple[int, Signature | None]] = {}
        self._goodbyes: set[int] = set()
        self._closed = False

    @classmethod
    def open(cls, rank: int, size: int, timeout: float) -> MpiTransport:
        """The transport of this MPI rank, on a fresh duplicate of ``MPI_COMM_WORLD``.

        Raises:
            ImportError: mpi4py is missing.
            ValueError: ``rank``/``size`` are not MPI's.
            RendezvousError: some MPI ranks did not arrive within ``timeout``.
        """
        from .join import check_ranks

        MPI = mpi_comm.load()
        check_ranks(rank, size, MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())
        return cls(mpi_comm.duplicate(timeout), rank, size)

    # -- progress ------------------------------------------------------------------------------

    def poll(self) -> None:
        """Take every header that arrived and finish every MPI request that completed."""
        with self._lock:
            if self._closed:
                return
            try:
                self._receive()
                if self._pending:
                    self._complete()
            except self._MPI.Exception as exc:
                self._mpi_failed(exc)

    def run_until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Wait, pacing the calls, until ``done()`` (a request's polls MPI) or ``timeout`` seconds
        (None: no limit); return ``done()``."""
        backoff = mpi_comm.Backoff()
        while True:
            if done():
                return True
            now = time.monotonic()
            if timeout is not None and now - backoff.started >= timeout:
                return False
            backoff.pause(now)

    def completed(self) -> None:
        """A request finished: nothing to wake, its waiter polls (``run_until``)."""

    def _receive(self) -> None:
        MPI, comm, status = self._MPI, self._comm, self._status
        while True:
            message = comm.Improbe(MPI.ANY_SOURCE, framing.EAGER_TAG, status)
            if message is None:
                return
            source = status.Get_source()
            buffer = bytearray(status.Get_count(MPI.BYTE))
            message.Recv([buffer, MPI.BYTE])
            try:
                kind, tag, nbytes, bulk, signature = framing.parse(buffer)
            except ValueError as exc:
                self._peer_gone(source, PeerLostError(source, str(exc)))
                continue
            self._on_header(source, kind, tag, nbytes, bulk, signature,
                            memoryview(buffer)[framing.HEADER.size:])

    def _on_header(self, source: int, kind: int, tag: int, nbytes: int, bulk: int,
                   signature: Signature | None, payload: memoryview) -> None:
        if kind in (framing.DATA, framing.BULK):
            self._arrived(source, tag, _Incoming(nbytes, payload if kind == framing.DATA else None,
                                                 bulk, signature))
        elif kind == framing.ABORT:
            self.abort_group(tag, decode_abort(source, payload))
        elif kind == framing.PROBE:
            latest, signature = self._match.latest_call(tag)
            self._send(source, framing.frame(framing.PROBE_REPLY, tag, b"", signature,
                                             nbytes=latest + 1))
        elif kind == framing.PROBE_REPLY:
            self._answers[(tag, source)] = (nbytes - 1, signature)
        elif kind == framing.BYE:
            self._goodbyes.add(source)
            self._peer_gone(source, PeerLostError(source, "it left the job (destroy() was called)",
                                                   left=True))

    def _complete(self) -> None:
        # An MPI error here (Testsome's MPI_ERR_IN_STATUS) reaches ``poll``, which fails the
        # transport: which requests completed is then unknown.
        done = self._MPI.Request.Testsome(self._pending)
        for index in sorted(done or (), reverse=True):
            flight = self._flights.pop(index)
            del self._pending[index]
            if flight.request is not None:
                flight.request.finish(flight.peer)

    def _track(self, pending: Any, request: MessageRequest | None, peer: int, buffer: Any,
               receive: bool = False) -> None:
        self._pending.append(pending)
        self._flights.append(_InFlight(request, peer, buffer, receive))

    def _send(self, peer: int, frame: bytearray) -> None:
        """Start sending one eager message (a header, with its payload if any)."""
        MPI = self._MPI
        self._track(self._comm.Isend([frame, MPI.BYTE], peer, framing.EAGER_TAG), None, peer, frame)

    def _mpi_failed(self, error: BaseException) -> None:
        failure = CommError(f"rank {self.rank}: MPI reported an error: {error}")
        mpi_comm.failed(str(failure))
        self.abort(failure)

    # -- sending -------------------------------------------------------------------------------

    def isend(self, peer: int, data: memoryview, tag: int,
              signature: Signature | None = None) -> MessageRequest:
        request = MessageRequest(self, peer, tag, poll=self.poll)
        with self._lock:
            if peer == self.rank:
                self._arrived(peer, tag, _Incoming(len(data), memoryview(bytes(data)), 0, signature))
                request.finish(peer)
                return request
            error = self._match.refusal(peer, tag) or self._note_call(tag, signature)
            if error is not None:
                request.finish(peer, error)
                return request
            try:
                if len(data) <= EAGER_BYTES:
                    self._send(peer, framing.frame(framing.DATA, tag, data, signature))
                    request.finish(peer)  # the payload was copied: ``data`` may be reused
                    return request
                bulk = self._bulk_tag(peer)
                self._send(peer, framing.frame(framing.BULK, tag, data, signature, bulk=bulk))
                self._track(self._comm.Isend([data, self._MPI.BYTE], peer, bulk), request, peer, data)
            except self._MPI.Exception as exc:
                request.finish(peer, PeerLostError(peer, f"MPI_Isend failed: {exc}"))
        return request

    def _bulk_tag(self, peer: int) -> int:
        tag = self._bulk_tags[peer]
        self._bulk_tags[peer] = tag + 1 if tag < self._tag_ub else framing.FIRST_BULK_TAG
        return tag

    # -- receiving -----------------------------------------------------------------------------

    def irecv(self, peer: int, out: memoryview, tag: int,
              signature: Signature | None = None) -> MessageRequest:
        request = MessageRequest(self, peer, tag, out, signature, self.poll)
        with self._lock:
            mismatch = self._note_call(tag, signature)
            if mismatch is not None:
                request.finish(peer, mismatch)
                return request
            source, incoming = self._match.take_unexpected(peer, tag)
            if incoming is not None:
                try:
                    self._deliver(request, source, incoming)
                except self._MPI.Exception as exc:
                    request.finish(source, PeerLostError(source, f"MPI_Irecv failed: {exc}"))
                return request
            error = self._match.refusal(peer, tag)
            if error is not None:
                request.finish(peer, error)
            else:
                self._match.post(peer, tag, request)
        return request

    def _arrived(self, source: int, tag: int, incoming: _Incoming) -> None:
        request = self._match.pop_posted(source, tag)
        if request is not None:
            self._deliver(request, source, incoming)
            return
        self._match.queue(source, tag, incoming)
        late = self._match.late_mismatch(source, tag, incoming.signature)
        if late is not None:  # it contradicts a call this rank made
            self.abort_group(*late)

    def _deliver(self, request: MessageRequest, source: int, incoming: _Incoming) -> None:
        """Fill ``request`` with a message whose header arrived, or fail it if they disagree."""
        assert request.out is not None
        error = misfit(request, source, incoming.nbytes, incoming.signature, self.rank)
        MPI = self._MPI
        if incoming.payload is None:  # bulk: receive it where it belongs, or drain it
            target = request.out if error is None else bytearray(incoming.nbytes)
            pending = self._comm.Irecv([target, MPI.BYTE], source, incoming.bulk)
            self._track(pending, request if error is None else None, source, target, receive=True)
        elif error is None:
            request.out[:] = incoming.payload
            request.finish(source)
        if error is not None:
            call = call_of_tag(request.tag)
            if call is not None:
                self.abort_group(call[0], error)
            request.finish(source, error)

    def _note_call(self, tag: int, signature: Signature | None) -> BaseException | None:
        """Remember this rank's signature for the tag's call; check messages already queued for
        it. Returns the error to fail the request with when a queued one disagrees."""
        call = call_of_tag(tag)
        if call is None or signature is None:
            return None
        mismatch = self._match.note_call(call, signature)
        if mismatch is not None:
            self.abort_group(call[0], mismatch)
        return mismatch

    # -- who is where ---------------------------------------------------------------------------

    def progress(self, group_id: int, peers: Sequence[int],
                 timeout: float) -> dict[int, tuple[int, Signature | None] | None]:
        """Ask ``peers`` which call of ``group_id`` they have reached (and its signature);
        ``None``: no answer in time (a peer answers while it polls, i.e. waits on a request)."""
        with self._lock:
            for peer in peers:
                self._answers.pop((group_id, peer), None)
            self._tell(peers, framing.frame(framing.PROBE, group_id))
        backoff = mpi_comm.Backoff()
        while True:
            self.poll()
            now = time.monotonic()
            with self._lock:
                if all((group_id, p) in self._answers for p in peers) or now - backoff.started >= timeout:
                    return {peer: self._answers.get((group_id, peer)) for peer in peers}
            backoff.pause(now)

    # -- failure and lifecycle -----------------------------------------------------------------

    def _peer_gone(self, peer: int, error: PeerLostError) -> None:
        """``peer`` sends no more: fail receives from it whose header has not come, and sends
        to it. Bulk receives whose header came stay: their payload was sent before."""
        with self._lock:
            error = self._match.lost.setdefault(peer, error)  # type: ignore[assignment]
            failed = self._match.take_posted(lambda source, tag: source == peer)
            failed += [f.request for f in self._flights
                       if f.peer == peer and f.request is not None and not f.receive]
        for request in failed:
            request.finish(peer, error)

    def abort_group(self, group_id: int, error: BaseException, tell_peers: bool = True) -> None:
        with self._lock:
            failed = self._match.abort_group(group_id, error)
            if failed is None:
                return
            failed += [f.request for f in self._flights
                       if f.request is not None and group_of_tag(f.request.tag) == group_id]
            if tell_peers:
                mpi_comm.failed(f"group {group_id}: {error}")
                self._tell(range(self.size), framing.frame(framing.ABORT, group_id,
                                                           encode_abort(error, framing.MAX_ABORT_BYTES)))
        for request in failed:
            request.finish(request.peer, error)

    def _tell(self, peers: Sequence[int], frame: bytearray) -> None:
        """Send a control message to each of ``peers`` that is still there (one that said
        goodbye is: it waits for this rank's goodbye)."""
        for peer in peers:
            if peer != self.rank and (peer not in self._match.lost or peer in self._goodbyes):
                try:
                    self._send(peer, frame)
                except self._MPI.Exception:
                    pass  # that peer's own failure is reported where it is used

    def abort(self, error: BaseException) -> None:
        with self._lock:
            self._match.aborted = self._match.aborted or error
            failed = self._match.take_posted(lambda source, tag: True)
            failed += [f.request for f in self._flights if f.request is not None]
        for request in failed:
            request.finish(request.peer, error)

    def close(self, linger: float = 10.0) -> None:
        """Say goodbye to every peer and wait (up to ``linger`` s) for theirs.

        When every peer said goodbye and no send is left under way, MPI can finalize normally;
        otherwise the job is ended at exit (``comm.failed``). The communicator is freed only
        then: MPI may still be moving data for requests that were failed here.
        """
        with self._lock:
            if self._closed:
                return
            self._tell(range(self.size), framing.frame(framing.BYE, 0))
        others = set(range(self.size)) - {self.rank}
        backoff = mpi_comm.Backoff()
        while True:
            self.poll()
            now = time.monotonic()
            with self._lock:
                if others <= self._goodbyes and not any(not f.receive for f in self._flights):
                    break
            if now - backoff.started >= linger:
                break
            backoff.pause(now)
        with self._lock:
            self._closed = True
            for pending, flight in zip(self._pending, self._flights, strict=True):
                if flight.receive:
                    pending.Cancel()
            clean = others <= self._goodbyes and not any(not f.receive for f in self._flights)
            if clean:
                self._comm.Free()
                mpi_comm.recovered()
            else:
                missing = sorted(others - self._goodbyes)
                mpi_comm.failed(f"rank {self.rank} closed without the goodbyes of ranks {missing}"
                                if missing else f"rank {self.rank} closed with sends under way")
        self.abort(GroupAbortedError(f"rank {self.rank}'s transport is closed"))
