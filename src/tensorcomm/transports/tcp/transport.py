"""TCP transport: tagged messages over one socket per peer, drained by a reader thread per peer.

Why a reader thread per peer: it always drains its socket, either straight into a posted receive
buffer (``recv_into``, zero-copy) or into an "unexpected" queue, so a sender never blocks forever
on full socket buffers and a ring of simultaneous sends cannot deadlock. Senders write from the
calling thread under a per-peer lock, so frames never interleave.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from typing import Callable

from ...errors import CollectiveMismatchError, CommTimeoutError, PeerLostError
from ..base import ANY_SOURCE, Transport
from . import framing

log = logging.getLogger("tensorcomm.tcp")


class TcpRequest:
    """A send or receive; completed by whichever thread finishes it."""

    __slots__ = ("peer", "tag", "out", "_event", "_error", "source")

    def __init__(self, peer: int, tag: int, out: memoryview | None) -> None:
        self.peer = peer
        self.tag = tag
        self.out = out
        self.source = peer
        self._event = threading.Event()
        self._error: BaseException | None = None

    def _finish(self, source: int, error: BaseException | None = None) -> None:
        self.source = source
        self._error = error
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> int:
        if not self._event.wait(timeout):
            who = "any rank" if self.peer == ANY_SOURCE else f"rank {self.peer}"
            raise CommTimeoutError(f"no message from {who} within {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self.source


def _completed(peer: int, error: BaseException | None = None) -> TcpRequest:
    request = TcpRequest(peer, 0, None)
    request._finish(peer, error)
    return request


class TcpTransport(Transport):
    """Full mesh of authenticated sockets; see ``mesh.connect_mesh`` for how it is built."""

    def __init__(self, rank: int, size: int, sockets: dict[int, socket.socket],
                 on_peer_lost: Callable[[int, BaseException], None] | None = None) -> None:
        self.rank = rank
        self.size = size
        self._sockets = sockets
        self._send_locks = {peer: threading.Lock() for peer in sockets}
        self._lock = threading.Lock()  # guards the matching state below
        self._posted: dict[tuple[int, int], deque[TcpRequest]] = {}
        self._unexpected: dict[tuple[int, int], deque[bytearray]] = {}
        self._lost: dict[int, BaseException] = {}
        self._aborted: BaseException | None = None
        self._closing = False
        self._on_peer_lost = on_peer_lost
        self._readers = [threading.Thread(target=self._read_loop, args=(peer, sock), daemon=True,
                                          name=f"tensorcomm-tcp-read-{peer}")
                         for peer, sock in sockets.items()]
        for reader in self._readers:
            reader.start()

    # -- sending -------------------------------------------------------------------------------

    def isend(self, peer: int, data: memoryview, tag: int) -> TcpRequest:
        if peer == self.rank:
            return self._deliver_local(data, tag)
        error = self._aborted or self._lost.get(peer)
        if error is not None:
            return _completed(peer, error)
        try:
            with self._send_locks[peer]:
                framing.send_frame(self._sockets[peer], framing.KIND_DATA, tag, data)
        except OSError as exc:
            return _completed(peer, self._lost.get(peer) or PeerLostError(peer, f"send failed: {exc}"))
        return _completed(peer)

    def _deliver_local(self, data: memoryview, tag: int) -> TcpRequest:
        self._match_or_queue(self.rank, tag, bytearray(data))
        return _completed(self.rank)

    # -- receiving -----------------------------------------------------------------------------

    def irecv(self, peer: int, out: memoryview, tag: int) -> TcpRequest:
        request = TcpRequest(peer, tag, out)
        with self._lock:
            if self._aborted is not None:
                request._finish(peer, self._aborted)
                return request
            source, data = self._take_unexpected(peer, tag)
            if data is None:
                if peer != ANY_SOURCE and peer in self._lost:
                    request._finish(peer, self._lost[peer])
                else:
                    self._posted.setdefault((peer, tag), deque()).append(request)
                return request
        self._copy_into(request, source, data)
        return request

    def _take_unexpected(self, peer: int, tag: int) -> tuple[int, bytearray | None]:
        peers = range(self.size) if peer == ANY_SOURCE else (peer,)
        for source in peers:
            queue = self._unexpected.get((source, tag))
            if queue:
                data = queue.popleft()
                if not queue:
                    del self._unexpected[(source, tag)]
                return source, data
        return peer, None

    @staticmethod
    def _copy_into(request: TcpRequest, source: int, data: bytearray) -> None:
        assert request.out is not None
        if len(data) != len(request.out):
            request._finish(source, _size_mismatch(source, len(data), len(request.out)))
        else:
            request.out[:] = data
            request._finish(source)

    def _pop_posted(self, source: int, tag: int) -> TcpRequest | None:
        for key in ((source, tag), (ANY_SOURCE, tag)):
            queue = self._posted.get(key)
            if queue:
                request = queue.popleft()
                if not queue:
                    del self._posted[key]
                return request
        return None

    def _match_or_queue(self, source: int, tag: int, data: bytearray) -> None:
        with self._lock:
            request = self._pop_posted(source, tag)
            if request is None:
                self._unexpected.setdefault((source, tag), deque()).append(data)
                return
        self._copy_into(request, source, data)

    def _read_loop(self, peer: int, sock: socket.socket) -> None:
        try:
            while True:
                header = framing.read_header(sock)
                if header is None:
                    raise ConnectionError("connection closed without a goodbye")
                kind, tag, nbytes = header
                if kind == framing.KIND_BYE:
                    self._peer_gone(peer, PeerLostError(peer, "it left the job (destroy() was called)"))
                    return
                self._receive_payload(peer, sock, tag, nbytes)
        except (OSError, framing.ProtocolError) as exc:
            if not self._closing:
                self._peer_gone(peer, PeerLostError(peer, str(exc)))

    def _receive_payload(self, peer: int, sock: socket.socket, tag: int, nbytes: int) -> None:
        with self._lock:
            request = self._pop_posted(peer, tag)
        if request is None:
            data = bytearray(nbytes)
            framing.recv_exact_into(sock, memoryview(data))
            self._match_or_queue(peer, tag, data)
            return
        assert request.out is not None
        if len(request.out) != nbytes:
            framing.recv_exact_into(sock, memoryview(bytearray(nbytes)))
            request._finish(peer, _size_mismatch(peer, nbytes, len(request.out)))
            return
        framing.recv_exact_into(sock, request.out)
        request._finish(peer)

    def _peer_gone(self, peer: int, error: PeerLostError) -> None:
        with self._lock:
            self._lost.setdefault(peer, error)
            error = self._lost[peer]  # type: ignore[assignment]
            failed = [r for key in list(self._posted) if key[0] == peer for r in self._posted.pop(key)]
        for request in failed:
            request._finish(peer, error)
        if self._on_peer_lost is not None and not self._closing:
            self._on_peer_lost(peer, error)

    # -- lifecycle -----------------------------------------------------------------------------

    def abort(self, error: BaseException) -> None:
        with self._lock:
            self._aborted = self._aborted or error
            failed = [r for queue in self._posted.values() for r in queue]
            self._posted.clear()
        for request in failed:
            request._finish(request.peer, error)

    def close(self, linger: float = 10.0) -> None:
        """Say goodbye to every peer, wait (up to ``linger`` s) for theirs, then close sockets.

        Waiting for the peers' end of stream before closing avoids a TCP reset that could
        discard data a slower peer has not read yet.
        """
        if self._closing:
            return
        for peer, sock in self._sockets.items():
            try:
                with self._send_locks[peer]:
                    sock.sendall(framing.pack_header(framing.KIND_BYE, 0, 0))
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        deadline = time.monotonic() + linger
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        self._closing = True
        for sock in self._sockets.values():
            sock.close()
        self.abort(PeerLostError(self.rank, "this rank's transport is closed"))


def _size_mismatch(peer: int, got: int, expected: int) -> CollectiveMismatchError:
    return CollectiveMismatchError(
        f"rank {peer} sent a {got}-byte message where a {expected}-byte one was expected: "
        "the ranks called collectives with different sizes, dtypes or orders")
