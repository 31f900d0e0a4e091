"""The TCP transport's send side: seal each frame, write what the socket takes, queue the rest.

The driver writes a link's queue as its socket makes room (``_write``); ``control.py`` fails a
link whose oldest queued frame misses its deadline.
"""

from __future__ import annotations

import socket
import time

from ...errors import PeerLostError
from ...signature import NO_SIGNATURE, Signature
from ..base import STEP_BITS
from . import framing
from .messages import Link, Send, TcpRequest, completed
from .state import TcpState

_MSG_DONTWAIT = socket.MSG_DONTWAIT
_pack_header = framing.HEADER.pack


class Sending(TcpState):
    """Per-link send queues of ``TcpTransport``."""

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
