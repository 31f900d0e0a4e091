"""TCP transport: tagged messages over one socket per peer, moved by the thread that waits.

A message, in order: ``isend`` hands its frame to the peer's ``link.Link``, which seals it and
writes it; on the other rank the driver (below) finds the link's socket readable and the link's
reader (``Link.read``) reads the frame into the receive ``irecv`` posted, matched by
``transports/matching.py``, or into the unexpected queue (``pool.py``) until one is posted.

Progress: one thread at a time *drives* the transport, running ``links.Links.drive``: it polls
every peer socket and, with non-blocking calls only, has the links read frames and write queued
sends. The driver is whichever caller waits (``Request.wait``, ``progress``, ``close``), so on the
hot path a message lands in the caller's buffer without waking another thread (a hand-off per
message doubled the round trip). A background thread drives only once no caller has for a moment
(``driving.py``): peers' data is then still drained, probes answered and failures noticed while
the caller computes. A message whose receive is posted while it is arriving switches to the
posted buffer at once: only the bytes read before the post are copied.

Every frame is sealed on the way out and checked on the way in (``sealing.py``, keyed by the
link's handshake): a header that fails its check fails the link at once, a payload that fails
(``mac``/``encrypt``) fails the receive it was filling, both with ``LinkAuthenticationError``.

Failures spread: a peer's connection closing without a goodbye fails everything pending on it
(``PeerLostError``), and ``abort_group`` tells every linked peer that a group is finished, so
members waiting on someone else learn of a failure at once instead of at their timeout. This
module owns the ``Transport`` API, control frames (aborts, probes) and lost peers; the links and
the driver's loop are ``links.py``'s, the messages that come before their receive ``pool.py``'s.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from ... import config
from ...errors import GroupAbortedError, PeerLostError
from ...rendezvous import discovery
from ...signature import NO_SIGNATURE, Signature
from ...types import bfloat16
from ..base import (
    P2P_FLAG,
    SEQ_BITS,
    STEP_BITS,
    Transport,
    decode_abort,
    encode_abort,
    group_of_tag,
)
from ..liveness import ProcessWatch
from ..matching import Batch, Matching, MessageRequest, finished, misfit
from . import framing
from .driving import Driving
from .link import Link
from .links import Links
from .mesh import Mesh
from .pool import Pool, Unexpected
from .sealing import Sealer

_CALL_SHIFT = SEQ_BITS + STEP_BITS  # a collective tag's group id, above its call's sequence number
_SEQ_MASK = (1 << SEQ_BITS) - 1
_CLOSE_LOOK = 0.01  # seconds between looks at whether what close() sent has reached its peers
LIVENESS_SECONDS = 0.1  # the processes of peers without a link are looked at no more often
_pack_header = framing.HEADER.pack


class TcpTransport(Transport):
    """Authenticated sockets to the peers; see ``mesh.Mesh`` for how they are made.

    ``links`` maps each peer's global rank to its socket and the ``sealing.Sealer`` its
    handshake gave: every frame is sealed on the way out and checked on the way in. With a
    ``mesh`` (which the transport then owns and closes), a peer without a link gets one when
    first needed; without one, ``links`` must hold every peer. ``watch`` names the processes of
    peers that may have no link (ranks on this host): ``lost_peers`` looks at them, since no
    closing link would say they died.
    """

    def __init__(self, rank: int, size: int, links: dict[int, tuple[socket.socket, Sealer]],
                 on_peer_lost: Callable[[int, BaseException], None] | None = None,
                 send_timeout: float = config.DEFAULT_TIMEOUT, mesh: Mesh | None = None,
                 watch: ProcessWatch | None = None) -> None:
        self.rank = rank
        self.send_timeout = send_timeout
        self.size = size
        wire = discovery.wire_dtype()
        self.wire_dtype = None if wire is None else bfloat16() if wire == "bfloat16" else np.dtype(np.float16)
        # Shared with the links: the matching state and its lock, and the driver role.
        self.lock = threading.Lock()  # guards ``match``, ``_progress`` and the pool's spares
        self.match: Matching[MessageRequest, Unexpected] = Matching(rank, size)
        self.pool = Pool(rank, self.match, self.lock, self.abort_group)  # messages before their receive
        self.links = Links(self, mesh)  # every link, and the driver's loop over them (``links.py``)
        self.unsettled = self.links.unsettled  # (for the links) those the driver must look at
        self._links = self.links.by_peer  # each peer's link to send on, read by every send
        self.role = Driving(self.links.drive, rank)  # who drives (see the module docstring)
        self._noted = -1  # the call (tag >> STEP_BITS) whose signature was noted last
        # (group, peer) -> their latest call and its signature, from probe replies
        self._progress: dict[tuple[int, int], tuple[int, Signature | None]] = {}
        # group id -> the first failure of its own a peer reported (not a lost peer it passed on)
        self._peer_failures: dict[int, BaseException] = {}
        self._on_peer_lost = on_peer_lost
        self._watch = watch
        self._looked = (0.0, 0)  # when the watched processes were last looked at, and the losses then
        self.links.start(links)
        self.role.start()
        if mesh is not None:
            mesh.attach(self.links.adopt)

    # -- sending and receiving -----------------------------------------------------------------

    def isend(self, peer: int, data: memoryview, tag: int,
              signature: Signature | None = None) -> MessageRequest:
        if peer == self.rank:
            self.pool.deliver(self.rank, tag, memoryview(bytearray(data)), signature)
            return finished(self.rank)
        match = self.match
        error = match.refusal(peer, tag) if match.aborted or match.aborted_groups or match.lost else None
        if error is None and tag >> STEP_BITS != self._noted and signature is not None:
            error = self._note_call(tag, signature)
        if error is not None:
            return finished(peer, error)
        # ``framing.pack_header``, inline on the hot path
        header = _pack_header(framing.MAGIC, framing.KIND_DATA, tag, len(data), *(signature or NO_SIGNATURE))
        link = self._links.get(peer) or self.links.open(peer)
        if link is None:
            return finished(peer, match.refusal(peer, tag) or GroupAbortedError(
                f"rank {self.rank}'s transport is closed"))
        return link.send(header, data.cast("B"), tag)  # type: ignore[return-value]

    def irecv(self, peer: int, out: memoryview, tag: int,
              signature: Signature | None = None) -> MessageRequest:
        if peer not in self._links and peer != self.rank and peer >= 0:  # not from any source
            self.links.open(peer)  # the link that brings the message, and says if the peer dies
        buffer = out.cast("B") if out.format != "B" else out
        request = MessageRequest(self.role, peer, tag, buffer, signature)
        if tag >> STEP_BITS != self._noted and signature is not None:
            mismatch = self._note_call(tag, signature)
            if mismatch is not None:
                request.finish(peer, mismatch)
                return request
        match = self.match
        with self.lock:
            source, entry = match.take_unexpected(peer, tag) if match.unexpected else (peer, None)
            if entry is None:
                error = match.refusal(peer, tag) if match.aborted or match.aborted_groups or \
                    match.lost else None
                if error is None:
                    match.post(peer, tag, request)
                    return request
            elif not entry.complete:
                error = misfit(request, source, len(entry.data), entry.signature, self.rank)
                if error is None:
                    entry.request = request  # the link moves it into ``out`` as it arrives
                    return request
        if entry is None:
            request.finish(peer, error)
        elif entry.complete:
            self.pool.fill(request, source, entry)
        else:
            self.pool.reject(request, source, error)  # type: ignore[arg-type]
        return request

    def exchange(self, receives: Sequence[tuple[int, memoryview]], sends: Sequence[tuple[int, memoryview]],
                 tag: int, signature: Signature | None = None) -> Batch:
        """``Transport.exchange`` in one go: the call's signature noted once, the receives posted
        under one hold of the lock, then each send sealed and written as ``isend`` does, then
        the messages that came before their receive copied in. A receive whose message is still
        arriving, one from this rank or any rank, and every request while a peer is lost or a
        group aborted take ``irecv``'s or ``isend``'s own way."""
        if tag >> STEP_BITS != self._noted and signature is not None:
            mismatch = self._note_call(tag, signature)
            if mismatch is not None:
                return Batch(self.role, [finished(peer, mismatch) for peer, _ in (*receives, *sends)])
        links, match, role, rank = self._links, self.match, self.role, self.rank
        for peer, _ in receives:
            if peer not in links and peer != rank and peer >= 0:
                self.links.open(peer)  # the link that brings the message, and says if the peer dies
        requests: list[MessageRequest] = []
        slow, early = [], []
        with self.lock:
            plain = not (match.aborted or match.aborted_groups or match.lost)
            queued = match.unexpected
            for peer, out in receives:
                if not plain or peer == rank or peer < 0:
                    slow.append((peer, out))
                    continue
                request = MessageRequest(role, peer, tag, out.cast("B") if out.format != "B" else out,
                                         signature)
                if queued and (peer, tag) in queued:
                    if not queued[(peer, tag)][0].complete:
                        slow.append((peer, out))
                        continue
                    early.append((request, match.take_unexpected(peer, tag)[1]))
                else:
                    match.post(peer, tag, request)
                requests.append(request)
        fields = signature or NO_SIGNATURE
        for peer, data in sends:
            link = links.get(peer)
            if link is None or not plain or peer == rank:
                requests.append(self.isend(peer, data, tag, signature))
                continue
            payload = data.cast("B")
            header = _pack_header(framing.MAGIC, framing.KIND_DATA, tag, len(payload), *fields)
            requests.append(link.send(header, payload, tag))  # type: ignore[arg-type]
        for request, entry in early:
            self.pool.fill(request, request.peer, entry)  # type: ignore[arg-type]
        requests += [self.irecv(peer, out, tag, signature) for peer, out in slow]
        return Batch(role, requests)

    def _note_call(self, tag: int, signature: Signature | None) -> BaseException | None:
        """Remember this rank's signature for the tag's call; check messages already queued for it.

        Once per call: the requests that follow for the same call skip it (``_noted``); messages
        that arrive later are checked on arrival (``check_late``). Returns the error to fail the
        request with when a queued message disagrees (the group is then aborted everywhere).
        """
        if tag & P2P_FLAG or signature is None:
            return None
        call = (tag >> _CALL_SHIFT, (tag >> STEP_BITS) & _SEQ_MASK)  # ``call_of_tag``, inline
        with self.lock:
            mismatch = self.match.note_call(call, signature)
        if mismatch is not None:
            self.abort_group(call[0], mismatch)
            return mismatch
        self._noted = tag >> STEP_BITS
        return None

    # -- what the links call back: control frames, failures --------------------------------------

    def on_control(self, peer: int, kind: int, tag: int, payload: memoryview,
                   signature: Signature | None) -> None:
        """Act on a whole control frame from ``peer`` (an abort, a probe or a probe's reply)."""
        if kind == framing.KIND_ABORT:
            # Passed on to every peer before anything else this rank sends them (its goodbye,
            # say), so the cause reaches everyone ahead of its consequences.
            error = decode_abort(peer, payload)
            if not isinstance(error, PeerLostError):
                self._peer_failures.setdefault(tag, error)
            self.abort_group(tag, error)
        elif kind == framing.KIND_PROBE:
            latest, mine = self.match.latest_call(tag)
            self._send_control(peer, framing.KIND_PROBE_REPLY, tag, framing.PROBE_REPLY.pack(latest), mine)
        elif len(payload) == framing.PROBE_REPLY.size:
            with self.lock:
                self._progress[(tag, peer)] = (framing.PROBE_REPLY.unpack(payload)[0], signature)

    def link_failed(self, link: Link, error: PeerLostError) -> None:
        """``link`` can carry nothing more: fail what waits on it."""
        pending = link.take_pending()
        self.peer_gone(link.peer, error)
        error = self.match.lost[link.peer]  # type: ignore[assignment]
        with self.lock:  # messages cut off midway will never complete: drop them
            unexpected = self.match.unexpected
            for key in [key for key in unexpected if key[0] == link.peer]:
                kept = deque(entry for entry in unexpected[key] if entry.complete)
                if kept:
                    unexpected[key] = kept
                else:
                    del unexpected[key]
        for request in pending:
            request.finish(link.peer, self.cause(request, error))

    def cause(self, request: MessageRequest, error: BaseException) -> BaseException:
        """What ``request`` fails with when its link goes: the abort of its group if there was
        one (a peer that leaves after a mismatch is a consequence, not the cause), else ``error``."""
        return self.match.aborted_groups.get(group_of_tag(request.tag)) or error

    def peer_gone(self, peer: int, error: PeerLostError) -> None:
        """``peer`` sends no more: fail the receives posted for it and tell ``on_peer_lost``."""
        with self.lock:
            error = self.match.lost.setdefault(peer, error)  # type: ignore[assignment]
            failed = self.match.take_posted(lambda source, tag: source == peer)
        for request in failed:
            request.finish(peer, self.cause(request, error))
        if self._on_peer_lost is not None and not self.role.closing:
            self._on_peer_lost(peer, error)

    # -- the rest of the Transport API ----------------------------------------------------------

    def lost_peers(self) -> frozenset[int]:
        """The peers lost so far. Peers without a link are looked at (their processes) once per
        ``LIVENESS_SECONDS`` at most, and at once after a loss: when ranks die one after another,
        the first, the cause, must not be missed for being seen a moment later."""
        watch, lost = self._watch, self.match.lost
        if watch is not None:
            now = time.monotonic()
            if now - self._looked[0] >= LIVENESS_SECONDS or len(lost) != self._looked[1]:
                unlinked = [peer for peer in range(self.size)
                            if peer not in self._links and peer not in lost and peer != self.rank]
                for peer in watch.dead(unlinked):
                    self.peer_gone(peer, PeerLostError(peer, "its process exited"))
                self._looked = (now, len(lost))
        with self.lock:
            return frozenset(lost)

    def progress(self, group_id: int, peers: Sequence[int],
                 timeout: float) -> dict[int, tuple[int, Signature | None] | None]:
        """Ask ``peers`` which call of ``group_id`` they have reached (and its signature);
        ``None``: no answer in time."""
        with self.lock:
            for peer in peers:
                self._progress.pop((group_id, peer), None)
        for peer in peers:
            if peer not in self._links:
                self.links.open(peer)
            self._send_control(peer, framing.KIND_PROBE, group_id, b"")
        self.role.run_until(lambda: all((group_id, p) in self._progress for p in peers), timeout)
        with self.lock:
            return {peer: self._progress.get((group_id, peer)) for peer in peers}

    def _send_control(self, peer: int, kind: int, tag: int, payload: bytes,
                      signature: Signature | None = None) -> None:
        """Send (or queue) a small control frame unless the link is gone."""
        link = self._links.get(peer)
        if link is None or peer in self.match.lost:
            return
        link.send(framing.pack_header(kind, tag, len(payload), signature), memoryview(payload), None)

    def abort_cause(self, group_id: int, grace: float) -> BaseException | None:
        told = self._peer_failures
        self.role.run_until(lambda: group_id in told, grace)
        return told.get(group_id)

    def abort_group(self, group_id: int, error: BaseException, tell_peers: bool = True) -> None:
        # Peers are told before local waiters wake: a waiter that goes on to destroy() must not
        # get its goodbye to a peer ahead of the abort that explains it.
        with self.lock:
            failed = self.match.abort_group(group_id, error)
        if failed is None:
            return
        if tell_peers:
            payload = encode_abort(error, framing.MAX_ABORT_BYTES)
            for peer in list(self._links):
                self._send_control(peer, framing.KIND_ABORT, group_id, payload)
        for request in failed:
            request.finish(request.peer, error)

    def abort(self, error: BaseException) -> None:
        with self.lock:
            self.match.aborted = self.match.aborted or error
            failed = self.match.take_posted(lambda source, tag: True)
        for request in failed:
            request.finish(request.peer, error)

    def close(self, linger: float = 10.0) -> None:
        """Say goodbye to every peer, wait (up to ``linger`` s) for each link to be done with, then
        close sockets.

        A link is done with once the peer said goodbye too, or once all this end sent, goodbye
        included, is with the peer (``Link.delivered``): closing then cannot discard data a
        slower peer has not read yet, and a peer that closes only after this returns (the other
        end of a pair closed one after the other) is not waited for.
        """
        if self.role.closing:
            return
        deadline = time.monotonic() + linger
        links = self.links.stop(linger)  # those the mesh was still checking included
        for link in links:  # the goodbye on the link this end sends on says it sends no more
            if link.peer not in self.match.lost and not link.closed:  # closed: it left, or never took it
                which = framing.BYE_SENT if self._links.get(link.peer) is link else framing.BYE_SPARE
                link.send(framing.pack_header(framing.KIND_BYE, which, 0, None), memoryview(b""), None)
        self.role.run_until(lambda: all(link.closed or not link.queue for link in links), linger)
        for link in links:
            try:
                link.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        # No poll wakes for an acknowledgement: look again every _CLOSE_LOOK s.
        while not self.role.run_until(lambda: all(link.closed or link.delivered() for link in links),
                                      min(_CLOSE_LOOK, max(0.0, deadline - time.monotonic()))) \
                and time.monotonic() < deadline:
            pass
        self.role.stop(max(1.0, deadline - time.monotonic()))
        for link in links:
            self.link_failed(link, PeerLostError(link.peer, "this rank closed its transport"))
            link.sock.close()
        self.role.close()
        self.abort(GroupAbortedError(f"rank {self.rank}'s transport is closed"))
