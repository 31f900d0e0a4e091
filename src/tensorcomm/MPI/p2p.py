"""Point-to-point messages of one communicator, matched the way MPI matches them.

Every message, buffer or pickled object, starts with an envelope (tag, length, sequence number,
flags, its place in the order of the sender's messages to this receiver) and the payload itself
when it fits. Between members on one host the envelope goes through the communicator's
shared-memory mailbox (``transports/shm/mailbox.py``: no system call, a copy in and a copy out),
with payloads up to half a ring; a longer payload is lent (the envelope carries its address, the
receiver reads it from the sender's memory as soon as the envelope arrives and answers through
the ring; ``settle`` keeps the sender from leaving before that) where the group's members may read
each other, else it follows on the transport. Elsewhere, or when the ring is full, the envelope
is a fixed-size message (``ENVELOPE`` bytes, payloads up to ``INLINE``) on the communicator's
envelope channel of the transport, and a longer payload follows on a payload channel under the
sender's sequence number, straight from the sender's buffer into the receiver's. Each
communicator keeps one receive of envelopes from any member posted at the transport
(``transports.base``) and reads its mailbox rings whenever it polls; envelopes that overtook an
earlier one from the same sender (a full ring sent the earlier one by the transport) wait for it,
so this module sees every message in the order its sender sent it and matches it here, as MPI
does: a message goes to the oldest posted receive whose source and tag
(or ``ANY_SOURCE``/``ANY_TAG``) fit, a receive takes the oldest message that fits. What that
gives beyond the transport's exact (peer, tag, size) matching: wildcard tags and the status's
actual tag, ``Probe``/``Iprobe`` (the envelope says the length before the payload is received),
a receive into a buffer longer than the message, ``Cancel`` of a receive not yet matched, and a
message longer than its receive buffer reported as ``MPI.ERR_TRUNCATE`` while the communicator
stays usable (the payload is drained). On one host a message of up to half a ring costs
no transport message; elsewhere one up to ``INLINE`` bytes, two above.

Imports ``core`` (a group's transport and shared-memory domain), ``transports.base`` and the MPI package's
``constants``, ``exceptions`` and ``messages`` (the envelopes, receives and sends it makes);
only ``messages.unpickle``/``unpickle_bytes`` and ``frontends.object_collectives`` unpickle.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any
from weakref import WeakSet

import numpy as np

from ..core.group import Group as TcGroup
from ..errors import CommError, CommTimeoutError, PeerLostError
from ..transports.base import ANY_SOURCE as TRANSPORT_ANY
from ..transports.base import Request as TransportRequest
from ..transports.base import as_bytes, p2p_tag
from ..transports.shm.apart import Apart
from ..transports.shm.domain import ShmDomain
from . import exceptions
from .constants import ANY_SOURCE, ANY_TAG, TAG_UB
from .messages import LENT as _LENT
from .messages import RETURNED as _RETURNED
from .messages import SYNC as _SYNC
from .messages import Envelope, Receive, Send, unpickle, unpickle_bytes

ENVELOPE = 512
_HEAD = struct.Struct("<5q")  # tag, length, sequence, flags, order (per sender and receiver)
_FIELDS = _HEAD.size
_ADDRESS = struct.Struct("<q")  # after the head of a lent payload's envelope
INLINE = ENVELOPE - _FIELDS
_ENVELOPE_CHANNEL = 20000  # apart from tensorcomm's own send/recv channels (object_p2p: 0..16385)
_PAYLOAD_CHANNEL = 20001
_ACK_CHANNEL = 20002  # a synchronous send's "matched" answer, under the sender's sequence number
_ACK = np.zeros(8, np.uint8)
_SLICE = 0.05  # seconds between looks at lost peers while a receive waits for any envelope
_MAIL_SLICE = 0.005  # the same while a mailbox sleeps: transport envelopes (a full ring) wait that long
_SPIN_SECONDS = 0.002  # a wait on a mailbox polls, then yields the core, this long before it sleeps
_SPIN_POLLS = 32
_SPIN_LOOKS = 256  # ``receive_object``'s looks at one ring between looks at the transport
_SCRATCH_BYTES = 16 << 20  # lent objects up to this long are read into an engine's reused buffer
_sequence = itertools.count(1)  # one counter for the process: payload tags never repeat per pair
log = logging.getLogger("tensorcomm.mpi")


def _array(data: np.ndarray | bytes) -> np.ndarray:
    """``data`` as a flat uint8 array (a pickle's bytes viewed, not copied)."""
    return np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data


def _came(look: Callable[[], bool], request: TransportRequest) -> bool:
    """Whether ``look()`` or the transport's envelope ``request`` turned true within
    ``_SPIN_POLLS`` looks (the cheapest a wait can make, without the engine's lock)."""
    for _ in range(_SPIN_POLLS):  # noqa: SIM110 - a plain loop: no generator frame per look
        if look() or request.done():
            return True
    return False


class _Spin:
    """A wait's spin: between rounds of looks that found nothing, the core is yielded, until
    ``_SPIN_SECONDS`` after the first such round. Before the first yield, a wait for one member
    (``source``) moves off the core if that member last waited on it (``transports/shm/apart.py``)."""

    __slots__ = ("end", "_apart", "_source")

    def __init__(self, apart: Apart | None, source: int) -> None:
        self.end = 0.0
        self._apart = apart if source >= 0 else None  # not for ANY_SOURCE
        self._source = source

    def idle(self) -> bool:
        """Yield the core after a round that found nothing; False once the spin is over."""
        now = time.monotonic()
        if not self.end:
            self.end = now + _SPIN_SECONDS
            if self._apart is not None:
                self._apart.check(self._source, now)
        elif now > self.end:
            return False
        os.sched_yield()
        return True


def _either(first: Callable[[], bool], second: Callable[[], bool]) -> Callable[[], bool]:
    return lambda: first() or second()


class Engine:
    """The matching state of one communicator: envelopes that arrived unmatched, receives posted
    unmatched (both oldest first), and the transport receive of the next envelope."""

    def __init__(self, group: TcGroup) -> None:
        world = group._world
        self.transport = world.transport
        self.timeout = world.timeout
        self.ranks = group.ranks
        self.size = len(self.ranks)
        self.index = {peer: i for i, peer in enumerate(self.ranks)}
        self.group_id = group._group_id
        self.lock = threading.RLock()
        self.arrived: deque[Envelope] = deque()
        self.posted: list[Receive] = []
        domain = self.shm = group._member_team().shm
        self._mailbox = domain.mailbox if domain is not None else None
        self._apart = domain.slots.apart if domain is not None and domain.slots.apart.enabled else None
        # Payloads longer than a ring are lent: read by the receiver from the sender's memory
        # (cross-memory attach) where the domain may, and kept here until the receiver says so.
        self._domain = domain if domain is not None and domain.cma else None
        self._lent: dict[int, tuple[int, np.ndarray]] = {}  # sequence -> (receiver, payload) unread
        self._scratch = np.empty(0, np.uint8)  # where lent objects are read (``_borrowed_object``)
        self._owed: list[tuple[int, bytes]] = []  # "read" answers a full ring did not take yet
        self._settled_at_close = False  # ``settle`` runs when the domain closes and at exit
        size = len(self.ranks)
        self._order = [0] * size  # messages sent to each member so far
        # The last (dest, tag) ``post`` found to be plain ints in range: the same objects again
        # need no second look (``is``: a bool or a numpy integer equal to them is not them).
        self._posted: tuple[Any, Any] = (None, None)
        self._received: tuple[Any, Any] = (None, None)  # the same for ``receive_object``
        self._expected = [0] * size  # the order number of the next message from each member
        self._early: dict[tuple[int, int], Envelope] = {}  # (member, order): came before its turn
        self._envelope_tag = p2p_tag(self.group_id, 0, _ENVELOPE_CHANNEL)
        self._next = np.empty(ENVELOPE, np.uint8)
        self._request = self.transport.irecv(TRANSPORT_ANY, as_bytes(self._next), self._envelope_tag)

    def _tag(self, channel: int, sequence: int) -> int:
        return p2p_tag(self.group_id, sequence & 0xFFFFFFFF, channel)

    # -- sending ----------------------------------------------------------------------------

    def post(self, data: bytes, dest: Any, tag: Any) -> bool:
        """Send the pickle ``data`` whole through the mailbox to communicator rank ``dest``
        with ``tag`` (both plain ints in range) and return True; False, with nothing sent, for
        anything else (then ``send`` takes it, with every check): the blocking object send's way."""
        if dest is not self._posted[0] or tag is not self._posted[1]:  # not the last pair checked
            if (type(dest) is not int or type(tag) is not int or not 0 <= dest < self.size
                    or not 0 <= tag <= TAG_UB):
                return False
            self._posted = (dest, tag)
        mailbox = self._mailbox
        if mailbox is None or len(data) + _FIELDS > mailbox.longest:
            return False
        lock = self.lock
        lock.acquire()  # not ``with``: on an RLock that costs about twice as much
        try:
            order = self._order[dest]
            # No sequence number: a record carried whole is neither answered nor followed.
            if not mailbox.push(dest, _HEAD.pack(tag, len(data), 0, 0, order), data):
                return False
            self._order[dest] = order + 1
        finally:
            lock.release()
        return True

    def send(self, data: np.ndarray | bytes, dest: int, tag: int, keep: Any = None,
             sync: bool = False) -> Send:
        """Start sending ``data`` (bytes: a pickle; else a flat uint8 array) to communicator rank
        ``dest`` (``sync``: done only once a receive has matched it, as ``MPI_Ssend``)."""
        peer = self.ranks[dest]
        body: bytes | memoryview
        if isinstance(data, bytes):
            nbytes, body = len(data), data
        else:
            nbytes, body = data.size, data.data
        sequence = next(_sequence)
        transport = self.transport
        requests: list[TransportRequest] = []
        if sync:
            ack = np.empty(_ACK.size, np.uint8)
            requests.append(transport.irecv(peer, as_bytes(ack), self._tag(_ACK_CHANNEL, sequence)))
        flags = _SYNC if sync else 0
        with self.lock:
            order = self._order[dest]
            self._order[dest] = order + 1
            head = _HEAD.pack(tag, nbytes, sequence, flags, order)
            mailbox = self._mailbox
            if mailbox is not None:
                if nbytes + _FIELDS <= mailbox.longest:
                    if mailbox.push(dest, head, body):
                        return Send(self, requests)
                elif self._domain is not None:
                    # Lend it (a copy of a caller's buffer, which may change once this returns).
                    lent = _array(data) if keep is None else _array(data).copy()
                    head = _HEAD.pack(tag, nbytes, sequence, flags | _LENT, order)
                    if mailbox.push(dest, head, _ADDRESS.pack(lent.ctypes.data)):
                        if not self._settled_at_close:
                            self._settled_at_close = True
                            _settle_before_closing(self, self._domain)
                        self._lent[sequence] = (dest, lent)
                        return Send(self, requests)
                    head = _HEAD.pack(tag, nbytes, sequence, flags, order)
                elif mailbox.push(dest, head):
                    data = _array(data)
                    requests.append(transport.isend(peer, as_bytes(data),
                                                    self._tag(_PAYLOAD_CHANNEL, sequence)))
                    return Send(self, requests, keep if keep is not None else data)
        data = _array(data)
        envelope = np.empty(ENVELOPE, np.uint8)
        envelope[:_FIELDS] = np.frombuffer(head, np.uint8)
        if nbytes <= INLINE:
            envelope[_FIELDS:_FIELDS + nbytes] = data
            requests.append(transport.isend(peer, as_bytes(envelope), self._envelope_tag))
            return Send(self, requests)
        requests.append(transport.isend(peer, as_bytes(envelope), self._envelope_tag))
        requests.append(transport.isend(peer, as_bytes(data), self._tag(_PAYLOAD_CHANNEL, sequence)))
        return Send(self, requests, keep if keep is not None else data)

    # -- receiving --------------------------------------------------------------------------

    def receive(self, buffer: np.ndarray | None, source: int, tag: int) -> Receive:
        """Post a receive from communicator rank ``source`` (or ANY_SOURCE) with ``tag`` (or
        ANY_TAG), into ``buffer`` or of an object."""
        receive = Receive(self, source, tag, buffer)
        with self.lock:
            self._poll()
            for envelope in self.arrived:
                if envelope.fits(source, tag):
                    self.arrived.remove(envelope)
                    self._match(receive, envelope)
                    return receive
            self.posted.append(receive)
        return receive

    def receive_envelope(self, envelope: Envelope, buffer: np.ndarray | None) -> Receive:
        """A receive of a message already taken by a matched probe (``Message``)."""
        receive = Receive(self, envelope.source, envelope.tag, buffer)
        with self.lock:
            self._match(receive, envelope)
        return receive

    def _match(self, receive: Receive, envelope: Envelope) -> None:
        """Give ``envelope``'s message to ``receive`` (hold the lock)."""
        receive.envelope = envelope
        if envelope.sync:
            self.transport.isend(envelope.peer, as_bytes(_ACK), self._tag(_ACK_CHANNEL, envelope.sequence))
        nbytes = envelope.nbytes
        buffer = receive.buffer
        if envelope.failure is not None:
            receive.error = envelope.failure
            return
        if buffer is None and envelope.inline is not None:
            receive.data = envelope.inline[:nbytes]  # the envelope's own copy: nobody else's
            return
        if buffer is None:
            buffer = receive.data = np.empty(nbytes, np.uint8)
        elif nbytes > buffer.size:
            receive.error = exceptions.error(
                exceptions.ERR_TRUNCATE, f"a message of {nbytes} bytes from rank {envelope.source} "
                f"(tag {envelope.tag}) does not fit the {buffer.size}-byte receive buffer")
            buffer = np.empty(nbytes, np.uint8)  # drained, so the link stays in step
        if envelope.inline is not None:
            buffer[:nbytes] = envelope.inline[:nbytes]
        elif envelope.lent:
            self._fetch(envelope, buffer[:nbytes])
            receive.error = receive.error or envelope.failure
        elif nbytes:
            receive.payload = self.transport.irecv(envelope.peer, as_bytes(buffer[:nbytes]),
                                                   self._tag(_PAYLOAD_CHANNEL, envelope.sequence))

    def _poll(self) -> None:
        """Take every envelope the mailbox and the transport have received (hold the lock)."""
        mailbox = self._mailbox
        if mailbox is not None:
            if self._owed:
                self._owed = [(q, answer) for q, answer in self._owed if not mailbox.push(q, answer)]
            for source, record in mailbox.arrivals():
                self._take(source, record)
        request = self._request
        while request.done():
            peer = request.wait(0)
            raw = self._next
            self._next = np.empty(ENVELOPE, np.uint8)
            request = self._request = self.transport.irecv(TRANSPORT_ANY, as_bytes(self._next),
                                                           self._envelope_tag)
            fields = _HEAD.unpack_from(raw.data)
            inline = raw[_FIELDS:] if fields[1] <= INLINE else None
            self._arrive(Envelope(self.index[peer], peer, fields, inline))

    def _take(self, source: int, record: bytes) -> None:
        """Take in one mailbox record from member ``source`` (hold the lock)."""
        fields = _HEAD.unpack_from(record)
        flags = fields[3]
        if flags & _RETURNED:
            self._lent.pop(fields[2], None)
        elif flags & _LENT:
            address = _ADDRESS.unpack_from(record, _FIELDS)[0]
            self._arrive(Envelope(source, self.ranks[source], fields, None, address))
        else:
            carried = len(record) == _FIELDS + fields[1]
            inline = np.frombuffer(record, np.uint8, offset=_FIELDS) if carried else None
            self._arrive(Envelope(source, self.ranks[source], fields, inline))

    def receive_object(self, source: Any, tag: Any) -> tuple[Any, int, int] | None:
        """The blocking object receive's way while nothing waits in this engine's queues:
        ``source`` a member (a plain int) on this host, ``tag`` a plain int or ``ANY_TAG``.
        Waits, spinning as ``wait_for`` does, for ``source``'s next mailbox record; when that is
        an object carried whole, in its turn, with a fitting tag, returns ``(object, tag,
        length)``. None in every other case, with any record read taken in the general way
        (``receive`` then finds it)."""
        if source is not self._received[0] or tag is not self._received[1]:  # as ``_posted``
            if (type(source) is not int or type(tag) is not int or not 0 <= source < self.size
                    or not (0 <= tag <= TAG_UB or tag == ANY_TAG)):
                return None
            self._received = (source, tag)
        mailbox = self._mailbox
        if mailbox is None:
            return None
        spin: _Spin | None = None
        lock = self.lock
        while True:
            lock.acquire()  # not ``with``: on an RLock that costs about twice as much
            try:
                if self.arrived or self.posted or self._early or self._owed:
                    return None
                record = mailbox.pull_one(source)
                if record is not None:
                    fields = _HEAD.unpack_from(record)
                    came, nbytes, _, flags, order = fields
                    if order == self._expected[source] and tag in (came, ANY_TAG):
                        if flags == 0 and len(record) == _FIELDS + nbytes:
                            self._expected[source] = order + 1
                            break
                        if flags == _LENT and self._domain is not None and nbytes <= _SCRATCH_BYTES:
                            self._expected[source] = order + 1
                            return self._borrowed_object(source, record, fields)
                    if flags == _RETURNED:  # a lent payload was read: look again
                        self._lent.pop(fields[2], None)
                        continue
                    self._take(source, record)
                    return None
                request = self._request
                if request.done():
                    return None
            finally:
                lock.release()
            if not mailbox.arrives(source, _SPIN_LOOKS) and not request.done():
                spin = spin or _Spin(self._apart, source)
                if not spin.idle():
                    return None
        return unpickle_bytes(record[_FIELDS:]) if nbytes else None, came, nbytes

    def _borrowed_object(self, source: int, record: bytes, fields: tuple[int, ...]) -> tuple[Any, int, int]:
        """``receive_object``'s lent object: read into this engine's scratch buffer (memory that
        is not new to the process, so the copy takes no page faults), answered, unpickled from
        there (hold the lock: the scratch is the engine's)."""
        nbytes = fields[1]
        if self._scratch.size < nbytes:
            self._scratch = np.empty(min(max(nbytes, 2 * self._scratch.size), _SCRATCH_BYTES), np.uint8)
        address = _ADDRESS.unpack_from(record, _FIELDS)[0]
        envelope = Envelope(source, self.ranks[source], fields, None, address)
        self._fetch(envelope, self._scratch)
        if envelope.failure is not None:
            raise envelope.failure
        return unpickle(self._scratch[:nbytes]), fields[0], nbytes

    def _arrive(self, envelope: Envelope) -> None:
        """Take one envelope in, or keep it until the sender's earlier ones came (hold the lock)."""
        source = envelope.source
        expected = self._expected[source]
        if envelope.order != expected:
            self._early[source, envelope.order] = envelope
            return
        while True:
            expected += 1
            for receive in self.posted:
                if envelope.fits(receive.source, receive.tag):
                    self.posted.remove(receive)
                    self._match(receive, envelope)
                    break
            else:
                if envelope.lent:  # read it now: the sender's memory is lent until then
                    envelope.inline = np.empty(envelope.nbytes, np.uint8)
                    self._fetch(envelope, envelope.inline)
                self.arrived.append(envelope)
            if not self._early:
                break
            later = self._early.pop((source, expected), None)
            if later is None:
                break
            envelope = later
        self._expected[source] = expected

    def poll(self) -> None:
        """Take what has arrived, without waiting."""
        try:
            with self.lock:
                self._poll()
        except CommError as exc:
            raise exceptions.as_mpi(exc) from None

    def probe(self, source: int, tag: int, take: bool) -> Envelope | None:
        """The oldest unmatched message that fits, if one has arrived (``take``: remove it)."""
        with self.lock:
            self._poll()
            for envelope in self.arrived:
                if envelope.fits(source, tag):
                    if take:
                        self.arrived.remove(envelope)
                    return envelope
        return None

    def wait_for(self, ready: Callable[[], bool], source: int, spin: bool = True) -> None:
        """Receive (and match) envelopes until ``ready()``, within the job's timeout: a rank
        that waits for anything point-to-point matches what arrives meanwhile, so a synchronous
        send to it is answered. With a mailbox (and ``spin``: ``ready`` waits for no transport
        request, which only a driving caller moves) it polls and yields the core for up to
        ``_SPIN_SECONDS``, then sleeps until a member rings its bell, ``_MAIL_SLICE`` at most
        (the transport's background thread moves its envelopes meanwhile).

        Raises:
            MPI.Exception and PeerLostError: ``source`` left the job.
            MPI.Exception and CommTimeoutError: nothing fitting came in time.
        """
        deadline = time.monotonic() + self.timeout
        peer = None if source == ANY_SOURCE else self.ranks[source]
        mailbox = self._mailbox if spin else None
        try:
            if mailbox is not None and self._spin(ready, source):
                return
            while True:
                with self.lock:
                    self._poll()
                    if ready():
                        return
                    request = self._request
                left = deadline - time.monotonic()
                if left <= 0:
                    who = "any rank" if peer is None else f"rank {peer}"
                    raise CommTimeoutError(f"no message from {who} within {self.timeout:g} s")
                try:
                    driver = getattr(request, "_driver", None)
                    if mailbox is not None:
                        mailbox.sleep(min(left, _MAIL_SLICE))
                        woke = False  # look at lost peers too: a sleep cannot tell
                    elif driver is not None:  # wake on the next envelope or on ``ready``, whichever first
                        woke = driver.run_until(_either(request.done, ready), min(left, _SLICE))
                    else:
                        request.wait(min(left, _SLICE))
                        woke = True
                except CommTimeoutError:
                    woke = False
                if woke:
                    continue
                # Who left, then what came: all a peer sent before it was seen gone still counts.
                lost = self.transport.lost_peers()
                with self.lock:
                    self._poll()
                    if ready():
                        return
                if peer is not None and peer in lost:
                    raise PeerLostError(peer, "it left before sending the message received")
                if peer is None and lost >= set(self.ranks) - {self.ranks[self._me()]}:
                    raise PeerLostError(min(lost), "every other member left")
        except CommError as exc:
            raise exceptions.as_mpi(exc) from None

    def _fetch(self, envelope: Envelope, into: np.ndarray) -> None:
        """Read a lent payload into ``into`` and tell its sender (hold the lock); a failure is
        kept on the envelope for the receive that takes it."""
        assert self._domain is not None and self._mailbox is not None
        try:
            self._domain.read(envelope.source, into.ctypes.data, envelope.lent, envelope.nbytes)
        except CommError as exc:
            envelope.failure = exceptions.as_mpi(exc)
            envelope.inline = None
        envelope.lent = 0
        answer = _HEAD.pack(0, 0, envelope.sequence, _RETURNED, 0)
        if not self._mailbox.push(envelope.source, answer):
            self._owed.append((envelope.source, answer))

    def settle(self) -> None:
        """Wait until every receiver has read what this engine lent it, or left, within the
        job's timeout: before the communicator goes, and at exit (a send returns before its
        receiver read it, and the receiver reads this process's memory). Never raises."""
        deadline = time.monotonic() + self.timeout
        domain = self._domain
        while self._lent and domain is not None:
            try:
                with self.lock:
                    self._poll()
            except (CommError, exceptions.Exception):
                pass  # a lost peer's messages: not what this waits for
            with self.lock:
                gone = {dest for dest, _ in self._lent.values() if domain.slots.departed(dest)}
                if gone:
                    self._lent = {key: value for key, value in self._lent.items() if value[0] not in gone}
            if not self._lent:
                break
            if time.monotonic() > deadline:
                log.warning("tensorcomm.MPI: %d message(s) sent were not read by their receivers "
                            "within %g s; they are dropped", len(self._lent), self.timeout)
                self._lent.clear()
                break
            time.sleep(0.0005)

    def _spin(self, ready: Callable[[], bool], source: int) -> bool:
        """Poll until ``ready()`` (True) or the spin is over (False, ``_Spin``). Between full
        polls it looks only at what can bring ``source``'s message (its ring, or any ring for
        ``ANY_SOURCE``, and the transport's next envelope), ``_SPIN_POLLS`` times at most."""
        mailbox = self._mailbox
        assert mailbox is not None
        look = mailbox.waiting if source == ANY_SOURCE else lambda: mailbox.pending(source)
        spin = _Spin(self._apart, source)
        while True:
            with self.lock:
                self._poll()
                if ready():
                    return True
                request = self._request
            if not _came(look, request) and not spin.idle():
                return False

    def _me(self) -> int:
        return self.index[self.transport.rank]

    def finish_transfer(self, request: TransportRequest) -> None:
        """Wait for one transport request within the job's timeout (errors made MPI's)."""
        try:
            request.wait(self.timeout)
        except CommError as exc:
            raise exceptions.as_mpi(exc) from None


_lenders: WeakSet[Engine] = WeakSet()  # engines that lent payloads
_exit_hook: list[bool] = []


def _settle_before_closing(engine: Engine, domain: ShmDomain) -> None:
    """Make closing ``domain``, and the end of the process, settle ``engine`` first."""
    domain.before_close(engine.settle)
    _lenders.add(engine)
    if not _exit_hook:
        _exit_hook.append(True)
        atexit.register(settle_all)  # after init's and Finalize's: it runs before them


def settle_all() -> None:
    """``Engine.settle`` every engine that lent a payload not read yet (at ``Finalize`` and exit)."""
    for engine in list(_lenders):
        engine.settle()
