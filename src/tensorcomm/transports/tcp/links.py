"""Every link of one TCP transport, and the driver's loop that has them read and write.

The links set-up made (``mesh.Mesh.connect``), and, with a ``mesh``, one made the first time a
send, a receive or a probe names a peer without one (``open``), or dialled in by that peer
(``adopt``). A pair may so hold two links; each end sends on the first it had, and reads both,
so the messages of one sender stay in order. Its goodbye on the other link may be read before
them: only the one on the link it sent on says it is gone (``framing.BYE_SENT``). A dial the
peer refuses (it left) first lets the handshakes under way end: the peer may have dialled this
end, sent and left before this end took that link.

The driver (whichever thread holds the transport's ``driving.Driving`` role) runs ``drive``: it
polls every link's socket and, with non-blocking calls only, has the links read frames and write
queued sends, in one loop, so a ring of simultaneous large sends never deadlocks and a link
carries data both ways at once. A send still unwritten at its deadline (the peer stopped reading)
fails with ``CommTimeoutError`` and closes that link for good, since part of a frame may have gone
out. Imports ``config`` and ``link``, ``mesh``, ``driving``, ``framing``, ``sealing`` of this package; what a
failed link or a lost peer does is the owner's (``link.Owner``), so that this module need not
import the transport's (which imports this one).
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable

from ...config import HANDSHAKE_TIMEOUT
from ...errors import CommError, CommTimeoutError, LinkAuthenticationError, PeerLostError
from . import framing
from .driving import NO_DEADLINE
from .link import Link, Owner, Untaken
from .mesh import Mesh
from .sealing import Sealer

_POLLIN = select.POLLIN | select.POLLERR | select.POLLHUP


class Links:
    """The links of one transport (``owner``): each peer's to send on (``by_peer``), every one
    the driver reads, and the poller it waits in. ``start`` adds the set-up's links once the
    owner's ``role`` exists (the role drives with this object's ``drive``)."""

    def __init__(self, owner: Owner, mesh: Mesh | None) -> None:
        self._owner = owner
        self._match = owner.match
        # Links the driver must look at before it polls: those with frames queued (added by the
        # send that queues one) and new ones; the others stay registered for reading as they are.
        self.unsettled: set[Link] = set()
        # Each peer's link to send on; every link, read by the driver; links by descriptor. The
        # last two are replaced, never changed, when a link is added (the driver reads them
        # without a lock).
        self.by_peer: dict[int, Link] = {}
        self._every: tuple[Link, ...] = ()
        self._by_fd: dict[int, Link] = {}
        self._mesh = mesh
        self._adding = threading.Lock()  # one link added at a time
        self._dialling = threading.Lock()  # one dial at a time: a rank dials a peer at most once
        self._adopting = True  # until ``stop``
        self._poller = select.poll()

    def start(self, links: dict[int, tuple[socket.socket, Sealer]]) -> None:
        """Add the set-up's links (socket and sealer by peer) and poll them, with the owner's role's
        wake-up pipe."""
        owner = self._owner
        self.by_peer.update({peer: Link(peer, sock, sealer, owner) for peer, (sock, sealer) in links.items()})
        self._every = tuple(self.by_peer.values())
        self._by_fd = {link.fd: link for link in self._every}
        self._poller.register(owner.role.wake_fd, select.POLLIN)
        for link in self._every:
            self._poller.register(link.fd, _POLLIN)
            link.polled = _POLLIN

    def stop(self, linger: float) -> list[Link]:
        """Adopt no more links (the mesh, if any, closes, waiting up to ``linger`` s for the links it
        is still checking); return every link."""
        if self._mesh is not None:  # links it is still checking are taken, and told goodbye by the owner
            self._mesh.close(wait=linger)
        with self._adding:
            self._adopting = False
            return list(self._every)

    def adopt(self, peer: int, sock: socket.socket, sealer: Sealer) -> Link | None:
        """Add a link to ``peer`` (dialled by either end); the driver polls it from its next turn.
        Returns the link (None: the transport is closing, and the socket was closed)."""
        with self._adding:
            if not self._adopting:
                sock.close()
                return None
            link = Link(peer, sock, sealer, self._owner)
            self._by_fd = {**self._by_fd, link.fd: link}
            self._every = (*self._every, link)
            self.by_peer.setdefault(peer, link)
            self.unsettled.add(link)
        self._owner.role.poke()
        return link

    def open(self, peer: int) -> Link | None:
        """The link to send to ``peer`` on, dialled now if it has none (None: it cannot have one;
        the peer is then lost, and the reason is ``match.lost[peer]``)."""
        with self._dialling:
            link = self.by_peer.get(peer)
            if link is not None or self._mesh is None or peer in self._match.lost or not self._adopting:
                return link
            try:
                sock, sealer = self._mesh.dial(peer, self._owner.send_timeout)
            except (CommError, OSError) as exc:
                # It may have dialled this end, sent, and left while this end was still checking
                # its dial: that link, with what came on it, is this end's once the check ends.
                self._mesh.settle(HANDSHAKE_TIMEOUT)
                link = self.by_peer.get(peer)
                if link is not None:
                    return link
                self._owner.peer_gone(peer, exc if isinstance(exc, PeerLostError) else
                                      PeerLostError(peer, f"could not connect to it: {exc}"))
                return None
            if self.adopt(peer, sock, sealer) is None:
                return None
            return self.by_peer[peer]  # this one, or one the peer dialled meanwhile

    # -- the driver ----------------------------------------------------------------------------

    def drive(self, done: Callable[[], bool], deadline: float) -> bool:
        """Read and write every link until ``done()`` or ``deadline`` (driver only); return ``done()``.

        Once the deadline has passed the links are polled one last time without waiting: what
        arrived before it (while this thread was descheduled, say) is read, not taken for a timeout.
        """
        poller, unsettled, role = self._poller, self.unsettled, self._owner.role
        while not done():
            by_fd = self._by_fd
            now = time.monotonic()
            wait = deadline - now
            last = wait <= 0
            if unsettled:
                wait = self._settle(now, wait)
            if wait <= 0 and not last:
                self._overdue(now)
                continue
            events = poller.poll(0 if last else None if wait == NO_DEADLINE else max(1, int(wait * 1000 + 1)))
            for fd, event in events:
                found = by_fd.get(fd)
                if found is None:
                    if fd == role.wake_fd:
                        role.drain_wake_ups()
                    continue
                link = found
                if link.closed:  # nothing more to read or write: poll it no more
                    if link.polled:
                        poller.unregister(fd)
                        link.polled = 0
                    continue
                try:
                    if event & select.POLLOUT:
                        link.write()
                    # One message per socket per poll (see ``Link.read``); all that came, on
                    # the last look before the deadline.
                    if event & _POLLIN and link.read() and last:
                        while not link.closed and link.read():
                            pass
                except LinkAuthenticationError as exc:  # someone on the path: trust nothing more
                    if not role.closing:
                        self._owner.link_failed(link, exc)
                    link.closed = True
                    try:
                        link.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                except (OSError, framing.BadFrame) as exc:
                    if not role.closing and not (isinstance(exc, Untaken) and self._drop_untaken(link)):
                        self._owner.link_failed(link, PeerLostError(link.peer, str(exc)))
                    link.closed = True
            if not events:
                self._overdue(time.monotonic())
            if last:
                return done()
        return True

    def _settle(self, now: float, wait: float) -> float:
        """Poll the links with frames queued for room to write too (for reading only once their
        queue is empty, when they leave ``unsettled``), and new ones for reading; return ``wait``
        cut to their oldest frame's deadline (driver only). Only these links are looked at: a
        poll costs no Python work per idle link."""
        poller, unsettled = self._poller, self.unsettled
        for link in tuple(unsettled):
            with link.send_lock:  # a send that queues a frame adds its link back under this lock
                queue = link.queue
                if not queue:
                    unsettled.discard(link)
            want = 0 if link.closed else _POLLIN | (select.POLLOUT if queue else 0)
            if queue:
                wait = min(wait, queue[0].deadline - now)
            if want != link.polled:
                if want:
                    poller.register(link.fd, want)
                else:
                    poller.unregister(link.fd)
                link.polled = want
        return wait

    def _overdue(self, now: float) -> None:
        """Fail links whose oldest queued frame missed its deadline (driver only)."""
        for link in tuple(self.unsettled):
            late = link.take_overdue(now)
            if late is None or link.peer in self._match.lost:
                continue
            error = CommTimeoutError(f"rank {link.peer} took no data for {self._owner.send_timeout:g} s "
                                     "(stopped or unreachable)")
            if late.request is not None:
                late.request.finish(link.peer, error)  # names the stall itself
            self._break_link(link, error)

    def _drop_untaken(self, link: Link) -> bool:
        """``link``'s peer closed it unused (``Untaken``) while another link to it is open: the
        peer never took this one (both ranks dialled at once and it refused it as it left), so
        the peer is not lost. Close only this link, send on the other from now on and return
        True; False where no other is open (the peer is gone). Driver only."""
        with self._adding:
            other = next((each for each in self._every
                          if each.peer == link.peer and each is not link and not each.closed), None)
            if other is None:
                return False
            if self.by_peer.get(link.peer) is link:
                self.by_peer[link.peer] = other
        error = PeerLostError(link.peer, "it closed the link this send was on without reading it")
        for request in link.take_pending():
            request.finish(link.peer, error)
        return True

    def _break_link(self, link: Link, error: CommError) -> None:
        """A frame went out half-sent: nothing more can travel on this link. Fail it for good."""
        self._owner.link_failed(link, PeerLostError(link.peer, f"link closed after a stalled send: {error}"))
        try:
            link.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
