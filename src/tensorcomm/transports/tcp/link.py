"""One peer connection of the TCP transport: its socket, its send queue and its frame reader.

Sending: ``send`` seals a frame, writes what the socket takes at once and queues the rest; the
driver writes the queue as the socket makes room (``write``). Reading: the driver calls ``read``
when the socket has data; it reads headers and payloads with non-blocking calls only, a data
payload straight into its posted receive (``recv_into``, zero-copy) or into the unexpected queue
(an ``Unexpected`` in a buffer of the transport's ``pool.Pool``) and from there into the receive
posted later. Which receive a message goes to is the transport's ``Matching``; what control
frames (abort, probe, goodbye) do is the transport's too. Everything here but ``send`` runs in
the driver only.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
import threading
import time
from collections import deque
from typing import Protocol

from ...errors import PeerLostError
from ...signature import Signature
from ..matching import Matching, MessageRequest, finished, misfit
from . import framing, sealing
from .driving import Driving
from .pool import Pool, Unexpected
from .sealing import Sealer

_READ_BUDGET = 4 << 20  # bytes read from one link per turn, so a busy link starves no other
_DISCARD_BYTES = 1 << 20  # scratch for draining a message no posted receive can take
_MSG_DONTWAIT = socket.MSG_DONTWAIT
_get_ident = threading.get_ident
_OUTQ = termios.TIOCOUTQ  # SIOCOUTQ on a socket: the bytes of its send queue the peer has not taken


class Untaken(ConnectionError):
    """The peer closed the link before sending a single frame on it: it never took it (it refused
    it while leaving, say) or it died."""


class Send:
    """A frame queued on a link: what is left of it, its request and its deadline."""

    __slots__ = ("parts", "request", "deadline")

    def __init__(self, parts: list[memoryview], request: MessageRequest | None, deadline: float) -> None:
        self.parts = parts
        self.request = request
        self.deadline = deadline

    def advance(self, sent: int) -> bool:
        """Drop ``sent`` bytes from the front; return whether the frame is all out."""
        while sent:
            head = self.parts[0]
            if sent < len(head):
                self.parts[0] = head[sent:]
                return False
            sent -= len(head)
            self.parts.pop(0)
        return not self.parts


class Owner(Protocol):
    """What a link needs of the transport that owns it (``TcpTransport``): its matching, lock,
    driving role and unexpected-message ``pool`` (``pool.Pool``: where a message that comes
    before its receive goes), and what it does when a control frame or a failure comes in
    (``links.Links`` calls the last too). A Protocol, so that this module need not import the
    transport's or ``links.py`` (which import this one)."""

    rank: int
    send_timeout: float
    match: Matching[MessageRequest, Unexpected]
    lock: threading.Lock
    role: Driving
    pool: Pool
    unsettled: set[Link]  # links the driver must look at before it polls (``links.Links._settle``)

    def link_failed(self, link: Link, error: PeerLostError) -> None: ...
    def cause(self, request: MessageRequest, error: BaseException) -> BaseException: ...
    def peer_gone(self, peer: int, error: PeerLostError) -> None: ...
    def on_control(self, peer: int, kind: int, tag: int, payload: memoryview,
                   signature: Signature | None) -> None: ...


class Link:
    """One peer's connection: its socket and sealer, its send queue, the frame being read."""

    __slots__ = ("peer", "sock", "sealer", "fd", "send_lock", "queue", "header", "header_got", "kind",
                 "tag", "nbytes", "got", "signature", "target", "request", "entry", "closed", "polled",
                 "opened", "sent", "_transport", "_match", "_lock", "_role", "_pool", "_unsettled",
                 "_discard")

    def __init__(self, peer: int, sock: socket.socket, sealer: Sealer, transport: Owner) -> None:
        self.peer = peer
        self.sock = sock
        self.sealer = sealer
        self.fd = sock.fileno()
        self.send_lock = threading.Lock()  # guards ``queue`` and writing to the socket
        self.queue: deque[Send] = deque()
        self.header = memoryview(bytearray(sealing.HEADER_BYTES))
        self.header_got = 0
        self.kind = 0  # of the frame being read; 0 while reading a header
        self.tag = 0
        self.nbytes = 0
        self.got = 0
        self.signature: Signature | None = None
        self.target: memoryview | None = None  # where the payload goes (None: discard it)
        self.request: MessageRequest | None = None  # the posted receive it fills
        self.entry: Unexpected | None = None  # or the unexpected message it fills
        self.closed = False  # no more reading: the peer is gone or said goodbye
        self.polled = 0  # the poll events the driver registered for it
        self.opened: tuple[bytes, int, bytes] = (b"", 0, b"")  # the frame's header, number, payload tag
        self.sent = finished(peer)  # what a send the socket took whole at once returns (never changes)
        self._transport = transport
        self._match, self._lock, self._role = transport.match, transport.lock, transport.role
        self._pool = transport.pool
        self._unsettled = transport.unsettled
        self._discard = memoryview(bytearray(0))

    # -- sending -------------------------------------------------------------------------------

    def send(self, header: bytes, payload: memoryview, tag: int | None) -> MessageRequest | None:
        """Seal a frame (a data frame if it has a ``tag``), write it now as far as the socket takes
        it and queue the rest for the driver.

        Returns the data frame's request (None for a control frame): ``sent``, done, when the
        socket took the whole frame at once (nobody but the caller can wait for it, so there is no
        request of its own to make or complete); failed if the link is gone.
        """
        failure: PeerLostError | None = None
        with self.send_lock:  # frames are sealed in the order they go onto the wire
            gone = self._match.lost.get(self.peer)
            parts = self.sealer.seal(header, payload, tag is not None)
            sent = 0
            if gone is None and not self.queue:
                try:  # the whole frame at once, the common case: no ``Send`` to keep
                    sent = self.sock.sendmsg(parts, (), _MSG_DONTWAIT)
                except BlockingIOError:
                    pass
                except OSError as exc:
                    failure = PeerLostError(self.peer, f"send failed: {exc}")
                if sent == len(parts[0]) + (len(parts[1]) if len(parts) > 1 else 0):
                    return None if tag is None else self.sent
            request = None if tag is None else MessageRequest(self._role, self.peer, tag)
            item = Send(parts, request, time.monotonic() + self._transport.send_timeout)
            if sent:
                item.advance(sent)
            if gone is None and failure is None:
                try:
                    if not self.queue and self._write_item(item):
                        return request
                except OSError as exc:
                    failure = PeerLostError(self.peer, f"send failed: {exc}")
            if gone is None and failure is None:
                self.queue.append(item)
                self._unsettled.add(self)  # the driver polls it for room from its next turn
        if failure is not None:
            self._transport.link_failed(self, failure)
        if gone is not None or failure is not None:
            if request is not None:
                request.finish(self.peer, self._transport.cause(request, self._match.lost[self.peer]))
            return request
        self._role.poke_elsewhere()  # the driver must watch this socket for room now
        return request

    def _write_item(self, item: Send) -> bool:
        """Write ``item`` until the socket is full; return whether all of it went out."""
        while True:
            try:
                sent = self.sock.sendmsg(item.parts, (), _MSG_DONTWAIT)
            except BlockingIOError:
                return False
            if item.advance(sent):
                if item.request is not None:
                    item.request.finish(self.peer)
                return True

    def write(self) -> None:
        """Write queued frames until the socket is full (driver only)."""
        with self.send_lock:
            queue = self.queue
            while queue and self._write_item(queue[0]):
                queue.popleft()

    def take_overdue(self, now: float) -> Send | None:
        """The oldest queued frame if it missed its deadline, off the queue."""
        with self.send_lock:
            return self.queue.popleft() if self.queue and self.queue[0].deadline <= now else None

    # -- reading -------------------------------------------------------------------------------

    def read(self) -> bool:
        """Read what the socket has (up to a budget) until a data frame ends (driver only);
        return whether one did (more may be waiting).

        Raises:
            OSError, framing.BadFrame: the link is broken; the driver fails it.
            LinkAuthenticationError: a frame failed its check; the driver fails the link.
        """
        budget = _READ_BUDGET
        sock = self.sock
        while budget > 0 and not self.closed:
            if not self.kind:
                try:
                    n = sock.recv_into(self.header[self.header_got:], 0, _MSG_DONTWAIT)
                except BlockingIOError:
                    return False
                if n == 0:
                    if self.header_got:
                        raise ConnectionError(f"connection closed after {self.header_got} bytes of a header")
                    raise (ConnectionError if self.sealer.received else Untaken)(
                        "connection closed without a goodbye")
                self.header_got += n
                if self.header_got < sealing.HEADER_BYTES:
                    continue
                self.header_got = 0
                kind, tag, nbytes, signature, self.opened = self.sealer.open_header(self.header.tobytes())
                self._begin(kind, tag, nbytes, signature)
                if self.kind and self.got == self.nbytes:
                    data = self.kind == framing.KIND_DATA
                    self._end()
                    if data:  # see below
                        return True
                continue
            entry = self.entry
            if entry is not None and entry.request is not None and self.target is entry.data:
                self._switch(entry, entry.request)
            target = self.target
            want = self.nbytes - self.got
            try:
                if target is None:  # draining a message nobody can take
                    n = sock.recv_into(self._discard, min(want, len(self._discard)), _MSG_DONTWAIT)
                else:
                    n = sock.recv_into(target[self.got:], min(want, budget), _MSG_DONTWAIT)
            except BlockingIOError:
                return False
            if n == 0:
                raise ConnectionError(f"connection closed after {self.got} of {self.nbytes} bytes")
            self.got += n
            budget -= n
            if self.got == self.nbytes:
                data = self.kind == framing.KIND_DATA
                self._end()
                # A message is in: the driver looks at what it waited for before this socket
                # again (the next poll says whether more came). The peer's next frame (its next
                # call's, often) may so wait in the socket for a receive to land in rather than
                # be copied through the unexpected queue, and no read of an empty socket is
                # tried (a system call and an exception) after each message.
                if data:
                    return True
        return False

    def _begin(self, kind: int, tag: int, nbytes: int, signature: Signature | None) -> None:
        """A header arrived: decide where its payload goes."""
        self.kind, self.tag, self.nbytes, self.got, self.signature = kind, tag, nbytes, 0, signature
        self.request = self.entry = None
        if kind == framing.KIND_BYE:
            self.kind = 0
            self.closed = True
            if tag == framing.BYE_SENT:  # every message it sent on any link has been read
                self._transport.peer_gone(self.peer, PeerLostError(
                    self.peer, "it left the job (destroy() was called)", left=True))
            return
        if kind != framing.KIND_DATA:
            self.target = memoryview(bytearray(nbytes))  # small, bounded by MAX_ABORT_BYTES
            return
        pool = self._pool
        with self._lock:
            request = self._match.pop_posted(self.peer, tag)
            if request is None:
                try:
                    spare = pool.take_spare(nbytes)
                except MemoryError:  # the link fails, with why
                    raise framing.BadFrame(
                        f"cannot allocate {nbytes} bytes for a message it sent before its receive was "
                        f"posted (out of memory)") from None
                entry = Unexpected(memoryview(spare).cast("B"), signature, False, spare)  # type: ignore[arg-type]
                self._match.queue(self.peer, tag, entry)
        if request is None:
            self.entry, self.target = entry, entry.data
            pool.check_late(self.peer, tag, signature)
            return
        out = request.out
        assert out is not None
        error = None if nbytes == len(out) and signature == request.signature else \
            misfit(request, self.peer, nbytes, signature, self._transport.rank)
        if error is not None:
            pool.reject(request, self.peer, error)
            self._drain()
            return
        self.request, self.target = request, out

    def _drain(self) -> None:
        """Read the current payload into scratch and drop it (the link stays usable)."""
        self.target = None
        if len(self._discard) < min(self.nbytes, _DISCARD_BYTES):
            self._discard = memoryview(bytearray(_DISCARD_BYTES))

    def _switch(self, entry: Unexpected, request: MessageRequest) -> None:
        """A receive was posted for the message arriving: move it into the request's buffer."""
        assert request.out is not None
        request.out[:self.got] = entry.data[:self.got]
        self.entry, self.request, self.target = None, request, request.out
        self._pool.give_back(entry)

    def _end(self) -> None:
        """The payload of the current frame is complete: check it, then act on it.

        Raises:
            LinkAuthenticationError: the payload failed its check (the driver fails the link).
        """
        kind, peer = self.kind, self.peer
        if self.target is not None and (kind != framing.KIND_DATA or self.sealer.checks_data):
            header, number, tag = self.opened
            self.sealer.open_payload(header, number, tag, self.target, kind == framing.KIND_DATA)
        self.kind = 0
        if kind == framing.KIND_DATA:
            request, entry = self.request, self.entry
            self.request = self.entry = None
            self.target = None
            if request is not None:  # ``request.finish``, inline on the hot path
                request.source = peer
                request.finished = True
                role = self._role
                if role.sleepers or role.driver != _get_ident():  # ``role.completed``'s test, inline
                    role.completed()
            elif entry is not None:
                with self._lock:
                    entry.complete = True
                    attached = entry.request
                if attached is not None:
                    self._pool.fill(attached, peer, entry)
            return
        payload, self.target = self.target, None
        assert payload is not None
        self._transport.on_control(peer, kind, self.tag, payload, self.signature)

    def delivered(self) -> bool:
        """Whether everything this end sent is with the peer: nothing queued here, nothing in the
        socket's send queue (TCP: acknowledged by the peer's host; a Unix socket: read by the
        peer). Closing the socket then loses none of it, goodbye included, though the peer has
        not said its own goodbye yet. False where the socket cannot tell."""
        if self.queue:
            return False
        try:
            unsent: int = struct.unpack("i", fcntl.ioctl(self.fd, _OUTQ, b"\0\0\0\0"))[0]
        except OSError:
            return False
        return unsent == 0

    # -- failing -------------------------------------------------------------------------------

    def take_pending(self) -> list[MessageRequest]:
        """Close the link for good; return the requests it would have finished: its queued sends
        and the receive (or attached receive) its current frame fills."""
        self.closed = True
        with self.send_lock:
            queued, self.queue = list(self.queue), deque()
        pending = [item.request for item in queued if item.request is not None]
        if self.request is not None:
            pending.append(self.request)
        if self.entry is not None and self.entry.request is not None:
            pending.append(self.entry.request)
        self.kind, self.request, self.entry, self.target = 0, None, None, None
        return pending
