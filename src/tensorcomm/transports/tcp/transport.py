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

The class is put together from one part per job: ``sending.py`` (per-link send queues),
``reading.py`` (the frame reader), ``receiving.py`` (receive matching) and ``control.py``
(failures, aborts, close), over the shared state declared in ``state.py``; this module builds
it and runs the driver loop.

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

import select
import socket
import threading
import time
from collections.abc import Callable

import ml_dtypes
import numpy as np

from ... import config
from ...errors import LinkAuthenticationError, PeerLostError
from ...rendezvous import discovery
from ..matching import Matching
from . import framing
from .control import Control
from .driving import NO_DEADLINE, Driving
from .messages import Link
from .reading import Reading
from .receiving import Receiving
from .sealing import Sealer
from .sending import Sending

_WIRE_DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
_POLLIN = select.POLLIN | select.POLLERR | select.POLLHUP


class TcpTransport(Sending, Reading, Receiving, Control):
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
        self._match = Matching(rank, size)
        # (group, peer) -> their latest call and its signature, from probe replies
        self._progress = {}
        # group id -> the first failure of its own a peer reported (not a lost peer it passed on)
        self._peer_failures = {}
        self._on_peer_lost = on_peer_lost
        self._discard = memoryview(bytearray(0))
        self._spares = {}  # reusable unexpected-message buffers
        self._spare_bytes = 0
        self._role = Driving(self._drive, rank)  # who drives (see the module docstring)
        self._run_until = self._role.run_until
        self._poller = select.poll()
        self._poller.register(self._role.wake_fd, select.POLLIN)
        for link in self._links.values():
            self._poller.register(link.fd, _POLLIN)
            link.polled = _POLLIN
        self._role.start()

    def _drive(self, done: Callable[[], bool], deadline: float) -> bool:
        """Read and write every link until ``done()`` or ``deadline`` (driver only); return ``done()``.

        Once the deadline has passed the links are polled one last time without waiting: what
        arrived before it (while this thread was descheduled, say) is read, not taken for a timeout.
        """
        poller, by_fd, links = self._poller, self._by_fd, self._links.values()
        while not done():
            now = time.monotonic()
            wait = deadline - now
            last = wait <= 0
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
            if wait <= 0 and not last:
                self._overdue(now)
                continue
            events = poller.poll(0 if last else None if wait == NO_DEADLINE else max(1, int(wait * 1000 + 1)))
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
                except (OSError, framing.BadFrame) as exc:
                    if not self._role.closing:
                        self._link_failed(link, PeerLostError(link.peer, str(exc)))
                    link.closed = True
            if not events:
                self._overdue(time.monotonic())
            if last:
                return done()
        return True
