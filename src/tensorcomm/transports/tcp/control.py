"""The TCP transport's failure and lifecycle control: failed links and peers, aborts, probes, close.

A link fails on a stalled send, a broken socket or a peer's goodbye; what waits on it fails
with the cause. Aborts and progress probes travel as small control frames.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Sequence

from ...errors import CommError, CommTimeoutError, GroupAbortedError, PeerLostError
from ...signature import Signature
from ..base import encode_abort, group_of_tag
from . import framing
from .messages import Link, TcpRequest
from .state import TcpState


class Control(TcpState):
    """Failure spreading, aborts, progress probes and closing of ``TcpTransport``."""

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

    def abort_cause(self, group_id: int, grace: float) -> BaseException | None:
        told = self._peer_failures
        self._run_until(lambda: group_id in told, grace)
        return told.get(group_id)

    def abort_group(self, group_id: int, error: BaseException, tell_peers: bool = True) -> None:
        # Peers are told before local waiters wake: a waiter that goes on to destroy() must not
        # get its goodbye to a peer ahead of the abort that explains it.
        with self._lock:
            failed = self._match.abort_group(group_id, error)
        if failed is None:
            return
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
