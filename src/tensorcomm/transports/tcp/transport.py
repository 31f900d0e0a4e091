"""TCP transport: tagged messages over one socket per peer, moved by the thread that waits.

Progress: one thread at a time *drives* the transport. It polls every peer socket and, with
non-blocking calls only, reads frames straight into posted receive buffers (``recv_into``,
zero-copy) or into the unexpected queue, and writes queued sends. The driver is whichever caller
waits (``Request.wait``, ``progress``, ``close``), so on the hot path a message lands in the
caller's buffer without waking another thread (a hand-off per message doubled the round trip).
A background thread drives only once no caller has for a moment (``driving.py``): peers' data is
then still drained, probes answered and failures noticed while the caller computes. A message
whose receive is posted while it is arriving switches to the posted buffer at once: only the
bytes read before the post are copied. Matching messages to receives: ``transports/matching.py``;
per-request and per-link state: ``messages.py``.

Sends write what the socket takes at once and queue the rest for the driver, which writes and
reads in one loop, so a ring of simultaneous large sends never deadlocks and a link carries data
both ways at once. A send still unwritten at its deadline (the peer stopped reading) fails with
``CommTimeoutError`` and closes that link for good, since part of a frame may have gone out.

Every frame is sealed on the way out and checked on the way in (``sealing.py``, keyed by the
link's handshake): a header that fails its check fails the link at once, a payload that fails
(``mac``/``encrypt``) fails the receive it was filling, both with ``LinkAuthenticationError``.

Failures spread: a peer's connection closing without a goodbye fails everything pending on it
(``PeerLostError``), and ``abort_group`` tells every peer that a group is finished, so members
waiting on someone else learn of a failure at once instead of at their timeout.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import ml_dtypes
import numpy as np

from ... import config
from ...errors import (
    CollectiveMismatchError,
    CommError,
    CommTimeoutError,
    GroupAbortedError,
    LinkAuthenticationError,
    PeerLostError,
)
from ...rendezvous import discovery
from ...signature import NO_SIGNATURE, Signature
from ..base import (
    P2P_FLAG,
    SEQ_BITS,
    STEP_BITS,
    Transport,
    call_of_tag,
    decode_abort,
    encode_abort,
    group_of_tag,
    signature_mismatch,
)
from ..matching import Matching
from . import framing, sealing
from .driving import NO_DEADLINE, Driving
from .messages import Link, Send, TcpRequest, Unexpected, completed
from .sealing import Sealer

log = logging.getLogger("tensorcomm.tcp")

_READ_BUDGET = 4 << 20  # bytes read from one link per turn, so a busy link starves no other
_DISCARD_BYTES = 1 << 20  # scratch for draining a message no posted receive can take
_WIRE_DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
_POLLIN = select.POLLIN | select.POLLERR | select.POLLHUP
_MSG_DONTWAIT = socket.MSG_DONTWAIT
_pack_header = framing.HEADER.pack
_get_ident = threading.get_ident
_CALL_SHIFT = SEQ_BITS + STEP_BITS  # a collective tag's group id, above its call's sequence number
_SEQ_MASK = (1 << SEQ_BITS) - 1


class TcpTransport(Transport):
    """Full mesh of authenticated sockets; see ``mesh.connect_mesh`` for how it is built.

    ``links`` maps each peer's global rank to its socket and the ``sealing.Sealer`` its
    handshake gave: every frame is sealed on the way out and checked on the way in.
    """

    def __init__(self, rank: int, size: int, links: dict[int, tuple[socket.socket, Sealer]],
                 on_peer_lost: Callable[[int, BaseException], None] | None = None,
                 send_timeout: float = config.DEFAULT_TIMEOUT) -> None:
        self.rank = rank
        self.send_timeout = send_timeout
        self.size = size
        wire = discovery.wire_dtype()
        self.wire_dtype = None if wire is None else _WIRE_DTYPES[wire]
        self._links = {peer: Link(peer, sock, sealer) for peer, (sock, sealer) in links.items()}
        self._by_fd = {link.fd: link for link in self._links.values()}
        self._lock = threading.Lock()  # guards the matching state below
        self._noted = -1  # the call (tag >> STEP_BITS) whose signature was noted last
        self._match: Matching[TcpRequest, Unexpected] = Matching(rank, size)
        # (group, peer) -> their latest call and its signature, from probe replies
        self._progress: dict[tuple[int, int], tuple[int, Signature | None]] = {}
        # group id -> the first failure of its own a peer reported (not a lost peer it passed on)
        self._peer_failures: dict[int, BaseException] = {}
        self._on_peer_lost = on_peer_lost
        self._discard = memoryview(bytearray(0))
        self._spares: dict[int, list[np.ndarray]] = {}  # reusable unexpected-message buffers
        self._spare_bytes = 0
        self._role = Driving(self._drive, rank)  # who drives (see the module docstring)
        self._run_until = self._role.run_until
        self._poller = select.poll()
        self._poller.register(self._role.wake_fd, select.POLLIN)
        for link in self._links.values():
            self._poller.register(link.fd, _POLLIN)
            link.polled = _POLLIN
        self._role.start()

    # -- sending -------------------------------------------------------------------------------

    def isend(self, peer: int, data: memoryview, tag: int,
              signature: Signature | None = None) -> TcpRequest:
        if peer == self.rank:
            self._deliver(self.rank, tag, memoryview(bytearray(data)), signature)
            return completed(self.rank)
        match = self._match
        error = match.refusal(peer, tag) if match.aborted or match.aborted_groups or match.lost else None
        if error is None and tag >> STEP_BITS != self._noted and signature is not None:
            error = self._note_call(tag, signature)
        if error is not None:
            return completed(peer, error)
        # ``framing.pack_header``, inline on the hot path
        header = _pack_header(framing.MAGIC, framing.KIND_DATA, tag, len(data), *(signature or NO_SIGNATURE))
        return self._enqueue(self._links[peer], header, data.cast("B"), tag)  # type: ignore[return-value]

    def _enqueue(self, link: Link, header: bytes, payload: memoryview, tag: int | None) -> TcpRequest | None:
        """Seal a frame (a data frame if it has a ``tag``), write it now as far as the socket takes
        it and queue the rest for the driver.

        Returns the data frame's request (None for a control frame): ``link.sent``, done, when the
        socket took the whole frame at once (nobody but the caller can wait for it, so there is no
        request of its own to make or complete); failed if the link is gone.
        """
        failure: PeerLostError | None = None
        with link.send_lock:  # frames are sealed in the order they go onto the wire
            gone = self._match.lost.get(link.peer)
            parts = link.sealer.seal(header, payload, tag is not None)
            sent = 0
            if gone is None and not link.queue:
                try:  # the whole frame at once, the common case: no ``Send`` to keep
                    sent = link.sock.sendmsg(parts, (), _MSG_DONTWAIT)
                except BlockingIOError:
                    pass
                except OSError as exc:
                    failure = PeerLostError(link.peer, f"send failed: {exc}")
                if sent == len(parts[0]) + (len(parts[1]) if len(parts) > 1 else 0):
                    return None if tag is None else link.sent
            request = None if tag is None else TcpRequest(self._run_until, link.peer, tag)
            item = Send(parts, request, time.monotonic() + self.send_timeout)
            if sent:
                item.advance(sent)
            if gone is None and failure is None:
                try:
                    if not link.queue and self._write_item(link, item):
                        return request
                except OSError as exc:
                    failure = PeerLostError(link.peer, f"send failed: {exc}")
            if gone is None and failure is None:
                link.queue.append(item)
        if failure is not None:
            self._link_failed(link, failure)
        if gone is not None or failure is not None:
            if request is not None:
                lost = self._match.lost[link.peer]
                self._complete(request, link.peer, self._cause(request, lost))
            return request
        self._role.poke_elsewhere()  # the driver must watch this socket for room now
        return request

    def _write_item(self, link: Link, item: Send) -> bool:
        """Write ``item`` until the socket is full; return whether all of it went out."""
        while True:
            try:
                sent = link.sock.sendmsg(item.parts, (), _MSG_DONTWAIT)
            except BlockingIOError:
                return False
            if item.advance(sent):
                if item.request is not None:
                    self._complete(item.request, link.peer)
                return True

    def _write(self, link: Link) -> None:
        """Write queued frames of ``link`` until its socket is full (driver only)."""
        with link.send_lock:
            queue = link.queue
            while queue and self._write_item(link, queue[0]):
                queue.popleft()

    def _overdue(self, now: float) -> None:
        """Fail links whose oldest queued frame missed its deadline (driver only)."""
        for link in self._links.values():
            with link.send_lock:
                late = link.queue.popleft() if link.queue and link.queue[0].deadline <= now else None
            if late is None or link.peer in self._match.lost:
                continue
            error = CommTimeoutError(f"rank {link.peer} took no data for {self.send_timeout:g} s "
                                     "(stopped or unreachable)")
            if late.request is not None:
                self._complete(late.request, link.peer, error)  # names the stall itself
            self._break_link(link, error)

    def _break_link(self, link: Link, error: CommError) -> None:
        """A frame went out half-sent: nothing more can travel on this link. Fail it for good."""
        self._link_failed(link, PeerLostError(link.peer, f"link closed after a stalled send: {error}"))
        try:
            link.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # -- receiving -----------------------------------------------------------------------------

    def irecv(self, peer: int, out: memoryview, tag: int,
              signature: Signature | None = None) -> TcpRequest:
        buffer = out.cast("B") if out.format != "B" else out
        request = TcpRequest(self._run_until, peer, tag, buffer, signature)
        if tag >> STEP_BITS != self._noted and signature is not None:
            mismatch = self._note_call(tag, signature)
            if mismatch is not None:
                self._complete(request, peer, mismatch)
                return request
        match = self._match
        with self._lock:
            source, entry = match.take_unexpected(peer, tag) if match.unexpected else (peer, None)
            if entry is None:
                error = match.refusal(peer, tag) if match.aborted or match.aborted_groups or \
                    match.lost else None
                if error is None:
                    self._match.post(peer, tag, request)
                    return request
            elif not entry.complete:
                error = self._check(request, source, len(entry.data), entry.signature)
                if error is None:
                    entry.request = request  # the driver moves it into ``out`` as it arrives
                    return request
        if entry is None:
            self._complete(request, peer, error)
        elif entry.complete:
            self._fill(request, source, entry)
        else:
            self._reject(request, source, error)  # type: ignore[arg-type]
        return request

    def _note_call(self, tag: int, signature: Signature | None) -> BaseException | None:
        """Remember this rank's signature for the tag's call; check messages already queued for it.

        Once per call: the requests that follow for the same call skip it (``_noted``); messages
        that arrive later are checked on arrival (``_check_late``). Returns the error to fail the
        request with when a queued message disagrees (the group is then aborted everywhere).
        """
        if tag & P2P_FLAG or signature is None:
            return None
        call = (tag >> _CALL_SHIFT, (tag >> STEP_BITS) & _SEQ_MASK)  # ``call_of_tag``, inline
        with self._lock:
            mismatch = self._match.note_call(call, signature)
        if mismatch is not None:
            self.abort_group(call[0], mismatch)
            return mismatch
        self._noted = tag >> STEP_BITS
        return None

    def _check_late(self, source: int, tag: int, signature: Signature | None) -> None:
        """Abort the group if an unmatched message contradicts the call this rank made."""
        late = self._match.late_mismatch(source, tag, signature)
        if late is not None:
            self.abort_group(*late)

    def _check(self, request: TcpRequest, source: int, nbytes: int,
               signature: Signature | None) -> BaseException | None:
        """The error a message of ``nbytes`` with ``signature`` raises for ``request``, if any."""
        mine = request.signature
        if signature is not None and mine is not None and signature != mine:
            return signature_mismatch(source, signature, self.rank, mine)
        assert request.out is not None
        if nbytes != len(request.out):
            return CollectiveMismatchError(
                f"rank {source} sent a {nbytes}-byte message where a {len(request.out)}-byte one was "
                "expected: the ranks called collectives with different sizes, dtypes or orders")
        return None

    def _fill(self, request: TcpRequest, source: int, entry: Unexpected) -> None:
        error = self._check(request, source, len(entry.data), entry.signature)
        if error is None:
            request.out[:] = entry.data  # type: ignore[index]
        self._give_back(entry)
        if error is None:
            self._complete(request, source)
        else:
            self._reject(request, source, error)

    def _take_spare(self, nbytes: int) -> np.ndarray:
        """A buffer for an unexpected message: a reused one of that size if there is one
        (fresh memory costs a page fault per page; see ``algorithms.base.Scratch``). Hold ``_lock``."""
        kept = self._spares.get(nbytes)
        if kept:
            self._spare_bytes -= nbytes
            return kept.pop()
        return np.empty(nbytes, np.uint8)

    def _give_back(self, entry: Unexpected) -> None:
        """Keep ``entry``'s buffer for the next unexpected message of its size, within bounds."""
        spare, entry.spare = entry.spare, None
        if spare is None or spare.size == 0:
            return
        with self._lock:
            if self._spare_bytes + spare.size <= config.SCRATCH_KEEP_BYTES:
                self._spares.setdefault(spare.size, []).append(spare)
                self._spare_bytes += spare.size

    def _reject(self, request: TcpRequest, source: int, error: BaseException) -> None:
        """Fail ``request`` for a message that does not fit it, and abort its group everywhere."""
        call = call_of_tag(request.tag)
        if call is not None:
            self.abort_group(call[0], error)
        self._complete(request, source, error)

    def _deliver(self, source: int, tag: int, data: memoryview, signature: Signature | None) -> None:
        """Hand a whole message to its posted receive, or queue it (a message to oneself)."""
        with self._lock:
            request = self._match.pop_posted(source, tag)
            if request is None:
                self._match.queue(source, tag, Unexpected(data, signature, True))
        if request is None:
            self._check_late(source, tag, signature)
        else:
            self._fill(request, source, Unexpected(data, signature, True))

    def _complete(self, request: TcpRequest, source: int, error: BaseException | None = None) -> None:
        """Finish ``request`` and wake whoever waits for it in another thread."""
        request.source = source
        request._error = error
        request._done = True
        self._role.completed()

    # -- driving -------------------------------------------------------------------------------

    def _drive(self, done: Callable[[], bool], deadline: float) -> bool:
        """Read and write every link until ``done()`` or ``deadline`` (driver only); return ``done()``."""
        poller, by_fd, links = self._poller, self._by_fd, self._links.values()
        while not done():
            now = time.monotonic()
            wait = deadline - now
            if wait <= 0:
                return done()
            for link in links:
                want = 0 if link.closed else _POLLIN | (select.POLLOUT if link.queue else 0)
                if link.queue:
                    wait = min(wait, link.queue[0].deadline - now)
                if want != link.polled:
                    if want:
                        poller.register(link.fd, want)
                    else:
                        poller.unregister(link.fd)
                    link.polled = want
            if wait <= 0:
                self._overdue(now)
                continue
            events = poller.poll(None if wait == NO_DEADLINE else max(1, int(wait * 1000 + 1)))
            for fd, event in events:
                found = by_fd.get(fd)
                if found is None:
                    if fd == self._role.wake_fd:
                        self._role.drain_wake_ups()
                    continue
                link = found
                if link.closed:
                    continue
                try:
                    if event & select.POLLOUT:
                        self._write(link)
                    if event & _POLLIN:
                        self._read(link)
                except LinkAuthenticationError as exc:  # someone on the path: trust nothing more
                    if not self._role.closing:
                        self._link_failed(link, exc)
                    link.closed = True
                    try:
                        link.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                except (OSError, framing.ProtocolError) as exc:
                    if not self._role.closing:
                        self._link_failed(link, PeerLostError(link.peer, str(exc)))
                    link.closed = True
            if not events:
                self._overdue(time.monotonic())
        return True

    # -- reading frames ------------------------------------------------------------------------

    def _read(self, link: Link) -> None:
        """Read what ``link`` has (up to a budget), completing frames as they end (driver only).

        Raises:
            OSError, ProtocolError: the link is broken; the caller fails it.
        """
        budget = _READ_BUDGET
        sock = link.sock
        while budget > 0 and not link.closed:
            if not link.kind:
                try:
                    n = sock.recv_into(link.header[link.header_got:], 0, _MSG_DONTWAIT)
                except BlockingIOError:
                    return
                if n == 0:
                    if link.header_got:
                        raise ConnectionError(f"connection closed after {link.header_got} bytes of a header")
                    raise ConnectionError("connection closed without a goodbye")
                link.header_got += n
                if link.header_got < sealing.HEADER_BYTES:
                    continue
                link.header_got = 0
                kind, tag, nbytes, signature, link.opened = link.sealer.open_header(link.header.tobytes())
                self._begin(link, kind, tag, nbytes, signature)
                if link.kind and link.got == link.nbytes:
                    filled = link.request is not None
                    self._end(link)
                    if filled and not self._match.posted:  # see below
                        return
                continue
            entry = link.entry
            if entry is not None and entry.request is not None and link.target is entry.data:
                self._switch(link, entry, entry.request)
            target = link.target
            want = link.nbytes - link.got
            try:
                if target is None:  # draining a message nobody can take
                    n = sock.recv_into(self._discard, min(want, len(self._discard)), _MSG_DONTWAIT)
                else:
                    n = sock.recv_into(target[link.got:], min(want, budget), _MSG_DONTWAIT)
            except BlockingIOError:
                return
            if n == 0:
                raise ConnectionError(f"connection closed after {link.got} of {link.nbytes} bytes")
            link.got += n
            budget -= n
            if link.got == link.nbytes:
                filled = link.request is not None
                self._end(link)
                # The last posted receive is filled: its waiter goes on, and the peer's next
                # frame (its next call's, often) waits in the socket for a receive to land in
                # rather than being copied through the unexpected queue.
                if filled and not self._match.posted:
                    return

    def _begin(self, link: Link, kind: int, tag: int, nbytes: int,
               signature: Signature | None) -> None:
        """A header arrived: decide where its payload goes."""
        link.kind, link.tag, link.nbytes, link.got, link.signature = kind, tag, nbytes, 0, signature
        link.request = link.entry = None
        if kind == framing.KIND_BYE:
            link.kind = 0
            link.closed = True
            self._peer_gone(link.peer, PeerLostError(link.peer, "it left the job (destroy() was called)",
                                                           left=True))
            return
        if kind != framing.KIND_DATA:
            link.target = memoryview(bytearray(nbytes))  # small, bounded by MAX_ABORT_BYTES
            return
        with self._lock:
            request = self._match.pop_posted(link.peer, tag)
            if request is None:
                spare = self._take_spare(nbytes)
                entry = Unexpected(memoryview(spare).cast("B"), signature, False, spare)  # type: ignore[arg-type]
                self._match.queue(link.peer, tag, entry)
        if request is None:
            link.entry, link.target = entry, entry.data
            self._check_late(link.peer, tag, signature)
            return
        out = request.out
        assert out is not None
        error = None if nbytes == len(out) and signature == request.signature else \
            self._check(request, link.peer, nbytes, signature)
        if error is not None:
            self._reject(request, link.peer, error)
            self._drain(link)
            return
        link.request, link.target = request, out

    def _drain(self, link: Link) -> None:
        """Read the current payload into scratch and drop it (the link stays usable)."""
        link.target = None
        if len(self._discard) < min(link.nbytes, _DISCARD_BYTES):
            self._discard = memoryview(bytearray(_DISCARD_BYTES))

    def _switch(self, link: Link, entry: Unexpected, request: TcpRequest) -> None:
        """A receive was posted for the message arriving: move it into the request's buffer."""
        assert request.out is not None
        request.out[:link.got] = entry.data[:link.got]
        link.entry, link.request, link.target = None, request, request.out
        self._give_back(entry)

    def _end(self, link: Link) -> None:
        """The payload of the current frame is complete: check it, then act on it.

        Raises:
            LinkAuthenticationError: the payload failed its check (the caller fails the link).
        """
        kind, peer = link.kind, link.peer
        if link.target is not None and (kind != framing.KIND_DATA or link.sealer.checks_data):
            header, number, tag = link.opened
            link.sealer.open_payload(header, number, tag, link.target, kind == framing.KIND_DATA)
        link.kind = 0
        if kind == framing.KIND_DATA:
            request, entry = link.request, link.entry
            link.request = link.entry = None
            link.target = None
            if request is not None:  # ``_complete``, inline on the hot path
                request.source = peer
                request._done = True
                role = self._role
                if role.sleepers or role.driver != _get_ident():  # ``role.completed``'s test, inline
                    role.completed()
            elif entry is not None:
                with self._lock:
                    entry.complete = True
                    attached = entry.request
                if attached is not None:
                    self._fill(attached, peer, entry)
            return
        payload, link.target = link.target, None
        assert payload is not None
        if kind == framing.KIND_ABORT:
            # Passed on to every peer before anything else this rank sends them (its goodbye,
            # say), so the cause reaches everyone ahead of its consequences.
            error = decode_abort(peer, payload)
            if not isinstance(error, PeerLostError):
                self._peer_failures.setdefault(link.tag, error)
            self.abort_group(link.tag, error)
        elif kind == framing.KIND_PROBE:
            latest, signature = self._match.latest_call(link.tag)
            self._send_control(peer, framing.KIND_PROBE_REPLY, link.tag, framing.PROBE_REPLY.pack(latest),
                               signature)
        elif len(payload) == framing.PROBE_REPLY.size:
            with self._lock:
                self._progress[(link.tag, peer)] = (framing.PROBE_REPLY.unpack(payload)[0], link.signature)

    def _link_failed(self, link: Link, error: PeerLostError) -> None:
        """``link`` can carry nothing more: fail what waits on it."""
        link.closed = True
        with link.send_lock:
            queued, link.queue = list(link.queue), deque()
        self._peer_gone(link.peer, error)
        error = self._match.lost[link.peer]  # type: ignore[assignment]
        pending = [link.request] if link.request is not None else []
        if link.entry is not None and link.entry.request is not None:
            pending.append(link.entry.request)
        link.kind, link.request, link.entry, link.target = 0, None, None, None
        with self._lock:  # messages cut off midway will never complete: drop them
            unexpected = self._match.unexpected
            for key in [key for key in unexpected if key[0] == link.peer]:
                kept = deque(entry for entry in unexpected[key] if entry.complete)
                if kept:
                    unexpected[key] = kept
                else:
                    del unexpected[key]
        for request in pending + [item.request for item in queued if item.request is not None]:
            if not request.done():
                self._complete(request, link.peer, self._cause(request, error))

    def _cause(self, request: TcpRequest, error: BaseException) -> BaseException:
        """What ``request`` fails with when its link goes: the abort of its group if there was
        one (a peer that leaves after a mismatch is a consequence, not the cause), else ``error``."""
        return self._match.aborted_groups.get(group_of_tag(request.tag)) or error

    def _peer_gone(self, peer: int, error: PeerLostError) -> None:
        with self._lock:
            error = self._match.lost.setdefault(peer, error)  # type: ignore[assignment]
            failed = self._match.take_posted(lambda source, tag: source == peer)
        for request in failed:
            self._complete(request, peer, self._cause(request, error))
        if self._on_peer_lost is not None and not self._role.closing:
            self._on_peer_lost(peer, error)

    # -- who is where ---------------------------------------------------------------------------

    def lost_peers(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._match.lost)

    def progress(self, group_id: int, peers: Sequence[int],
                 timeout: float) -> dict[int, tuple[int, Signature | None] | None]:
        """Ask ``peers`` which call of ``group_id`` they have reached (and its signature);
        ``None``: no answer in time."""
        with self._lock:
            for peer in peers:
                self._progress.pop((group_id, peer), None)
        for peer in peers:
            self._send_control(peer, framing.KIND_PROBE, group_id, b"")
        self._run_until(lambda: all((group_id, p) in self._progress for p in peers), timeout)
        with self._lock:
            return {peer: self._progress.get((group_id, peer)) for peer in peers}

    def _send_control(self, peer: int, kind: int, tag: int, payload: bytes,
                      signature: Signature | None = None) -> None:
        """Send (or queue) a small control frame unless the link is gone."""
        link = self._links.get(peer)
        if link is None or peer in self._match.lost:
            return
        header = framing.pack_header(kind, tag, len(payload), signature)
        self._enqueue(link, header, memoryview(payload), None)

    # -- failure and lifecycle -----------------------------------------------------------------

    def abort_cause(self, group_id: int, grace: float) -> BaseException | None:
        told = self._peer_failures
        self._run_until(lambda: group_id in told, grace)
        return told.get(group_id)

    def abort_group(self, group_id: int, error: BaseException, tell_peers: bool = True) -> None:
        # Peers are told before local waiters wake: a waiter that goes on to destroy() must not
        # get its goodbye to a peer ahead of the abort that explains it.
        with self._lock:
            if group_id in self._match.aborted_groups:
                return
            self._match.aborted_groups[group_id] = error
            failed = self._match.take_posted(lambda source, tag: group_of_tag(tag) == group_id)
        if tell_peers:
            self._tell_peers(group_id, error)
        for request in failed:
            self._complete(request, request.peer, error)

    def _tell_peers(self, group_id: int, error: BaseException) -> None:
        payload = encode_abort(error, framing.MAX_ABORT_BYTES)
        for peer in self._links:
            self._send_control(peer, framing.KIND_ABORT, group_id, payload)

    def abort(self, error: BaseException) -> None:
        with self._lock:
            self._match.aborted = self._match.aborted or error
            failed = self._match.take_posted(lambda source, tag: True)
        for request in failed:
            self._complete(request, request.peer, error)

    def close(self, linger: float = 10.0) -> None:
        """Say goodbye to every peer, wait (up to ``linger`` s) for theirs, then close sockets.

        Waiting for the peers' end of stream before closing avoids a TCP reset that could
        discard data a slower peer has not read yet.
        """
        if self._role.closing:
            return
        deadline = time.monotonic() + linger
        links = list(self._links.values())
        for link in links:
            self._send_control(link.peer, framing.KIND_BYE, 0, b"")
        self._run_until(lambda: all(link.closed or not link.queue for link in links), linger)
        for link in links:
            try:
                link.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        self._run_until(lambda: all(link.closed for link in links),
                        max(0.0, deadline - time.monotonic()))
        self._role.stop(max(1.0, deadline - time.monotonic()))
        for link in links:
            self._link_failed(link, PeerLostError(link.peer, "this rank closed its transport"))
            link.sock.close()
        self._role.close()
        self.abort(GroupAbortedError(f"rank {self.rank}'s transport is closed"))

