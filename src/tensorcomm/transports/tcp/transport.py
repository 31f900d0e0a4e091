"""TCP transport: tagged messages over one socket per peer, drained by a reader thread per peer.

Why a reader thread per peer: it always drains its socket, either straight into a posted receive
buffer (``recv_into``, zero-copy) or into an "unexpected" queue, so a sender never blocks forever
on full socket buffers and a ring of simultaneous sends cannot deadlock. Senders write from the
calling thread under a per-peer lock, so frames never interleave.

Failures spread: a peer's connection closing without a goodbye fails everything pending on it
(``PeerLostError``), and ``abort_group`` tells every peer that a group is finished, so members
waiting on someone else learn of a failure at once instead of at their timeout.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import OrderedDict, deque
from typing import Callable, Sequence

from ... import config
from ...signature import Signature
from ...errors import (CollectiveMismatchError, CommError, CommTimeoutError, GroupAbortedError,
                       PeerLostError)
from ..base import ANY_SOURCE, Transport, call_of_tag, group_of_tag, signature_mismatch
from . import framing

log = logging.getLogger("tensorcomm.tcp")

# How an abort's cause travels: its class as a small code, rebuilt by the receiving rank.
# Signatures of this rank's recent calls, to check messages that arrive after (or for a call
# that needed no message from) their sender: a root that only sends learns of a mismatch too.
_REMEMBERED_CALLS = 4096
_CONTROL_SEND_SECONDS = 1.0
_ERROR_CODES: tuple[type[CommError], ...] = (GroupAbortedError, PeerLostError, CollectiveMismatchError,
                                             CommTimeoutError)


class TcpRequest:
    """A send or receive; completed by whichever thread finishes it."""

    __slots__ = ("peer", "tag", "out", "signature", "_event", "_error", "source")

    def __init__(self, peer: int, tag: int, out: memoryview | None,
                 signature: Signature | None = None) -> None:
        self.peer = peer
        self.tag = tag
        self.out = out
        self.signature = signature
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
                 on_peer_lost: Callable[[int, BaseException], None] | None = None,
                 send_timeout: float = config.DEFAULT_TIMEOUT) -> None:
        self.rank = rank
        self.send_timeout = send_timeout
        self.size = size
        self._sockets = sockets
        self._send_locks = {peer: threading.Lock() for peer in sockets}
        self._lock = threading.Lock()  # guards the matching state below
        self._posted: dict[tuple[int, int], deque[TcpRequest]] = {}
        self._unexpected: dict[tuple[int, int], deque[tuple[bytearray, Signature | None]]] = {}
        self._lost: dict[int, BaseException] = {}
        self._aborted_groups: dict[int, BaseException] = {}
        self._calls: OrderedDict[tuple[int, int], Signature] = OrderedDict()
        self._latest: dict[int, int] = {}  # group id -> latest call sequence number started
        self._answers = threading.Condition()
        # (group, peer) -> their latest call and its signature
        self._progress: dict[tuple[int, int], tuple[int, Signature | None]] = {}
        self._aborted: BaseException | None = None
        self._closing = False
        self._on_peer_lost = on_peer_lost
        self._readers = [threading.Thread(target=self._read_loop, args=(peer, sock), daemon=True,
                                          name=f"tensorcomm-tcp-read-{peer}")
                         for peer, sock in sockets.items()]
        for reader in self._readers:
            reader.start()

    def _refusal(self, peer: int, tag: int) -> BaseException | None:
        """Why a new request to/from ``peer`` with ``tag`` must fail at once, if it must."""
        return (self._aborted or self._aborted_groups.get(group_of_tag(tag))
                or self._lost.get(peer))

    # -- sending -------------------------------------------------------------------------------

    def isend(self, peer: int, data: memoryview, tag: int,
              signature: Signature | None = None) -> TcpRequest:
        if peer == self.rank:
            self._match_or_queue(self.rank, tag, bytearray(data), signature)
            return _completed(self.rank)
        error = self._refusal(peer, tag) or self._note_call(tag, signature)
        if error is not None:
            return _completed(peer, error)
        try:
            with self._send_locks[peer]:
                framing.send_frame(self._sockets[peer], framing.KIND_DATA, tag, data, signature,
                                   self.send_timeout)
        except framing.SendTimeout:
            return _completed(peer, self._break_link(peer, CommTimeoutError(
                f"rank {peer} took no data for {self.send_timeout:g} s (stopped or unreachable)")))
        except OSError as exc:
            return _completed(peer, self._lost.get(peer) or PeerLostError(peer, f"send failed: {exc}"))
        return _completed(peer)

    def _break_link(self, peer: int, error: CommError) -> CommError:
        """A frame went out half-sent: nothing more can travel on this link. Fail it for good."""
        self._peer_gone(peer, PeerLostError(peer, f"link closed after a stalled send: {error}"))
        try:
            self._sockets[peer].shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return error

    # -- receiving -----------------------------------------------------------------------------

    def irecv(self, peer: int, out: memoryview, tag: int,
              signature: Signature | None = None) -> TcpRequest:
        request = TcpRequest(peer, tag, out, signature)
        mismatch = self._note_call(tag, signature)
        if mismatch is not None:
            request._finish(peer, mismatch)
            return request
        with self._lock:
            source, data, theirs = self._take_unexpected(peer, tag)
            if data is None:
                error = self._refusal(peer, tag)
                if error is not None:
                    request._finish(peer, error)
                else:
                    self._posted.setdefault((peer, tag), deque()).append(request)
                return request
        self._fill(request, source, data, theirs)
        return request

    def _note_call(self, tag: int, signature: Signature | None) -> BaseException | None:
        """Remember this rank's signature for the tag's call; check messages already queued for it.

        Returns the error to fail the request with when a queued message disagrees (the group is
        then aborted everywhere).
        """
        call = call_of_tag(tag)
        if call is None or signature is None:
            return None
        with self._lock:
            if call in self._calls:
                return None
            self._calls[call] = signature
            self._latest[call[0]] = max(call[1], self._latest.get(call[0], -1))
            if len(self._calls) > _REMEMBERED_CALLS:
                self._calls.popitem(last=False)
            mismatch = next((signature_mismatch(source, theirs, self.rank, signature)
                             for (source, queued_tag), queue in self._unexpected.items()
                             if call_of_tag(queued_tag) == call
                             for _, theirs in queue if theirs != signature), None)
        if mismatch is not None:
            self.abort_group(call[0], mismatch)
        return mismatch

    def _check_late(self, source: int, tag: int, signature: Signature | None) -> None:
        """Abort the group if an unmatched message contradicts the call this rank made."""
        call = call_of_tag(tag)
        mine = self._calls.get(call) if call is not None else None
        mismatch = signature_mismatch(source, signature, self.rank, mine)
        if mismatch is not None and call is not None:
            self.abort_group(call[0], mismatch)

    def _take_unexpected(self, peer: int, tag: int) -> tuple[int, bytearray | None, Signature | None]:
        peers = range(self.size) if peer == ANY_SOURCE else (peer,)
        for source in peers:
            queue = self._unexpected.get((source, tag))
            if queue:
                data, signature = queue.popleft()
                if not queue:
                    del self._unexpected[(source, tag)]
                return source, data, signature
        return peer, None, None

    def _check(self, request: TcpRequest, source: int, nbytes: int,
               signature: Signature | None) -> BaseException | None:
        """The error a message of ``nbytes`` with ``signature`` raises for ``request``, if any."""
        mismatch = signature_mismatch(source, signature, self.rank, request.signature)
        if mismatch is not None:
            return mismatch
        assert request.out is not None
        if nbytes != len(request.out):
            return CollectiveMismatchError(
                f"rank {source} sent a {nbytes}-byte message where a {len(request.out)}-byte one was "
                "expected: the ranks called collectives with different sizes, dtypes or orders")
        return None

    def _fill(self, request: TcpRequest, source: int, data: bytearray, signature: Signature | None) -> None:
        error = self._check(request, source, len(data), signature)
        if error is None:
            request.out[:] = data  # type: ignore[index]
            request._finish(source)
        else:
            self._reject(request, source, error)

    def _reject(self, request: TcpRequest, source: int, error: BaseException) -> None:
        """Fail ``request`` for a message that does not fit it, and abort its group everywhere."""
        call = call_of_tag(request.tag)
        if call is not None:
            self.abort_group(call[0], error)
        request._finish(source, error)

    def _pop_posted(self, source: int, tag: int) -> TcpRequest | None:
        for key in ((source, tag), (ANY_SOURCE, tag)):
            queue = self._posted.get(key)
            if queue:
                request = queue.popleft()
                if not queue:
                    del self._posted[key]
                return request
        return None

    def _match_or_queue(self, source: int, tag: int, data: bytearray, signature: Signature | None) -> None:
        with self._lock:
            request = self._pop_posted(source, tag)
            if request is None:
                self._unexpected.setdefault((source, tag), deque()).append((data, signature))
        if request is None:
            self._check_late(source, tag, signature)
        else:
            self._fill(request, source, data, signature)

    def _read_loop(self, peer: int, sock: socket.socket) -> None:
        try:
            while True:
                header = framing.read_header(sock)
                if header is None:
                    raise ConnectionError("connection closed without a goodbye")
                kind, tag, nbytes, signature = header
                if kind == framing.KIND_BYE:
                    self._peer_gone(peer, PeerLostError(peer, "it left the job (destroy() was called)"))
                    return
                if kind in (framing.KIND_PROBE, framing.KIND_PROBE_REPLY):
                    self._on_probe(peer, sock, kind, tag, nbytes, signature)
                    continue
                if kind == framing.KIND_ABORT:
                    payload = bytearray(nbytes)
                    framing.recv_exact_into(sock, memoryview(payload))
                    # Passed on to every peer before anything else this rank sends them (its
                    # goodbye, say), so the cause reaches everyone ahead of its consequences.
                    self.abort_group(tag, _decode_abort(peer, payload))
                    continue
                self._receive_payload(peer, sock, tag, nbytes, signature)
        except (OSError, framing.ProtocolError) as exc:
            if not self._closing:
                self._peer_gone(peer, PeerLostError(peer, str(exc)))

    def _receive_payload(self, peer: int, sock: socket.socket, tag: int, nbytes: int,
                         signature: Signature | None) -> None:
        with self._lock:
            request = self._pop_posted(peer, tag)
        if request is None:
            data = bytearray(nbytes)
            framing.recv_exact_into(sock, memoryview(data))
            self._match_or_queue(peer, tag, data, signature)
            return
        error = self._check(request, peer, nbytes, signature)
        if error is not None:
            framing.recv_exact_into(sock, memoryview(bytearray(nbytes)))  # drain; keep the link
            self._reject(request, peer, error)
            return
        try:
            framing.recv_exact_into(sock, request.out)  # type: ignore[arg-type]
        except OSError as exc:  # the request is no longer posted: fail it here, then the link
            request._finish(peer, PeerLostError(peer, str(exc)))
            raise
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

    # -- who is where ---------------------------------------------------------------------------

    def progress(self, group_id: int, peers: Sequence[int],
                 timeout: float) -> dict[int, tuple[int, Signature | None] | None]:
        """Ask ``peers`` which call of ``group_id`` they have reached (and its signature);
        ``None``: no answer in time."""
        with self._answers:
            for peer in peers:
                self._progress.pop((group_id, peer), None)
        for peer in peers:
            self._send_control(peer, framing.KIND_PROBE, group_id, b"")
        deadline = time.monotonic() + timeout
        with self._answers:
            self._answers.wait_for(lambda: all((group_id, p) in self._progress for p in peers),
                                   max(0.0, deadline - time.monotonic()))
            return {peer: self._progress.get((group_id, peer)) for peer in peers}

    def _on_probe(self, peer: int, sock: socket.socket, kind: int, group_id: int, nbytes: int,
                  signature: Signature | None) -> None:
        payload = bytearray(nbytes)
        framing.recv_exact_into(sock, memoryview(payload))
        if kind == framing.KIND_PROBE:
            latest = self._latest.get(group_id, -1)
            self._send_control(peer, framing.KIND_PROBE_REPLY, group_id, framing.PROBE_REPLY.pack(latest),
                               self._calls.get((group_id, latest)))
        elif nbytes == framing.PROBE_REPLY.size:
            with self._answers:
                self._progress[(group_id, peer)] = (framing.PROBE_REPLY.unpack(payload)[0], signature)
                self._answers.notify_all()

    def _send_control(self, peer: int, kind: int, tag: int, payload: bytes,
                      signature: Signature | None = None) -> bool:
        """Send a small control frame unless the link is gone or stalled; say whether it went."""
        lock = self._send_locks[peer]
        # A peer that is not taking data (the one that failed, often) must not hold up the
        # others: give up on it after a short wait.
        if peer in self._lost or not lock.acquire(timeout=_CONTROL_SEND_SECONDS):
            return False
        try:
            framing.send_frame(self._sockets[peer], kind, tag, memoryview(payload), signature,
                               timeout=_CONTROL_SEND_SECONDS)
            return True
        except OSError:
            return False  # that peer is gone or stalled; its own reader reports it
        finally:
            lock.release()

    # -- failure and lifecycle -----------------------------------------------------------------

    def abort_group(self, group_id: int, error: BaseException, tell_peers: bool = True) -> None:
        # Peers are told before local waiters wake: a waiter that goes on to destroy() must not
        # get its goodbye to a peer ahead of the abort that explains it.
        with self._lock:
            if group_id in self._aborted_groups:
                return
            self._aborted_groups[group_id] = error
            failed = [r for key in list(self._posted) if group_of_tag(key[1]) == group_id
                      for r in self._posted.pop(key)]
        if tell_peers:
            self._tell_peers(group_id, error)
        for request in failed:
            request._finish(request.peer, error)

    def _tell_peers(self, group_id: int, error: BaseException) -> None:
        payload = _encode_abort(error)
        for peer in self._sockets:
            self._send_control(peer, framing.KIND_ABORT, group_id, payload)

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
        self.abort(GroupAbortedError(f"rank {self.rank}'s transport is closed"))


def _encode_abort(error: BaseException) -> bytes:
    code = next((i for i, kind in enumerate(_ERROR_CODES) if isinstance(error, kind)), 0)
    rank = error.rank if isinstance(error, PeerLostError) else -1
    message = str(error).encode("utf-8", "replace")[:framing.MAX_ABORT_BYTES - framing.ABORT_RECORD.size]
    return framing.ABORT_RECORD.pack(code, rank) + message


def _decode_abort(peer: int, payload: bytearray) -> CommError:
    if len(payload) < framing.ABORT_RECORD.size:
        return GroupAbortedError(f"rank {peer} aborted the group")
    code, rank = framing.ABORT_RECORD.unpack_from(payload)
    message = payload[framing.ABORT_RECORD.size:].decode("utf-8", "replace")
    if "(reported by rank" not in message:
        message += f" (reported by rank {peer})"
    if code == 1:
        return PeerLostError(rank, message.removeprefix(f"peer rank {rank} was lost: "))
    return _ERROR_CODES[code if 0 <= code < len(_ERROR_CODES) else 0](message)
