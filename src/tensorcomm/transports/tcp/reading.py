"""The TCP transport's read side: read frames off a link and hand each payload where it goes.

A data payload goes straight into its posted receive, or into the unexpected queue (in reused
buffers) and from there into the receive posted later; control frames (abort, probe, goodbye)
are acted on when they end. Driver only, except ``_deliver``, ``_fill`` and ``_give_back``.
"""

from __future__ import annotations

import socket
import threading

import numpy as np

from ... import config
from ...errors import PeerLostError
from ...signature import Signature
from ..base import decode_abort
from . import framing, sealing
from .messages import Link, TcpRequest, Unexpected
from .state import TcpState

_READ_BUDGET = 4 << 20  # bytes read from one link per turn, so a busy link starves no other
_DISCARD_BYTES = 1 << 20  # scratch for draining a message no posted receive can take
_MSG_DONTWAIT = socket.MSG_DONTWAIT
_get_ident = threading.get_ident


class Reading(TcpState):
    """The frame reader and dispatcher of ``TcpTransport``."""

    def _read(self, link: Link) -> None:
        """Read what ``link`` has (up to a budget), completing frames as they end (driver only).

        Raises:
            OSError, framing.BadFrame: the link is broken; the caller fails it.
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
                try:
                    spare = self._take_spare(nbytes)
                except MemoryError:  # the link fails, with why
                    raise framing.BadFrame(
                        f"cannot allocate {nbytes} bytes for a message it sent before its receive was "
                        f"posted (out of memory)") from None
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
