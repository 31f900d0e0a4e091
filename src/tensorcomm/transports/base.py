"""The narrow interface every transport implements and every algorithm talks through.

Ranks here are *global* ranks; algorithms see group ranks through ``algorithms.base.Ctx``.
Messages between one pair of ranks that carry the same tag are matched in FIFO order. A message
whose size differs from the posted buffer is an error (``CollectiveMismatchError``), never a
partial or overflowing write.
"""

from __future__ import annotations

import abc
import struct
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ..errors import CollectiveMismatchError, CommError, CommTimeoutError, GroupAbortedError, PeerLostError
from ..signature import Signature

ANY_SOURCE = -1

# Tag layout: collective messages carry (group id, call sequence number, step within the call);
# point-to-point messages set the top bit and carry (channel, group id, user tag), the channel
# keeping the object point-to-point calls' messages apart from arrays sent with the same user tag.
# Transports read the group id back to fail every pending message of an aborted group.
GROUP_BITS = 15
SEQ_BITS = 32
STEP_BITS = 16
P2P_FLAG = 1 << 63
_GROUP_MASK = (1 << GROUP_BITS) - 1


def collective_tag(group_id: int, seq: int, step: int) -> int:
    """Tag of message ``step`` of call ``seq`` in group ``group_id``."""
    if not 0 <= step < (1 << STEP_BITS):
        raise ValueError(f"step {step} out of range")
    return (group_id << (SEQ_BITS + STEP_BITS)) | ((seq & ((1 << SEQ_BITS) - 1)) << STEP_BITS) | step


P2P_CHANNEL_BITS = 15  # bits 47..61, above the group id


def p2p_tag(group_id: int, user_tag: int, channel: int = 0) -> int:
    """Tag of a user send/recv on a group (``channel`` 0: arrays); disjoint from every collective tag."""
    return P2P_FLAG | (channel << (32 + GROUP_BITS)) | (group_id << 32) | (user_tag & 0xFFFFFFFF)


def call_of_tag(tag: int) -> tuple[int, int] | None:
    """``(group id, call sequence number)`` of a collective tag; None for point-to-point."""
    if tag & P2P_FLAG:
        return None
    return tag >> (SEQ_BITS + STEP_BITS), (tag >> STEP_BITS) & ((1 << SEQ_BITS) - 1)


def group_of_tag(tag: int) -> int:
    """The group id a tag belongs to."""
    if tag & P2P_FLAG:
        return (tag >> 32) & _GROUP_MASK
    return (tag >> (SEQ_BITS + STEP_BITS)) & _GROUP_MASK


class Request(Protocol):
    """A pending send or receive."""

    def wait(self, timeout: float | None = None) -> int:
        """Block until done; return the peer's global rank.

        Raises:
            CommTimeoutError: not done within ``timeout`` seconds (``None`` waits forever).
            PeerLostError: the peer went away.
            CollectiveMismatchError: the message did not fit the posted buffer.
        """
        ...

    def done(self) -> bool:
        """Whether the request has finished (successfully or not)."""
        ...


class Together:
    """Requests waited for as one, in their order (``Transport.exchange``'s default)."""

    __slots__ = ("requests",)

    def __init__(self, requests: list[Request]) -> None:
        self.requests = requests

    def done(self) -> bool:
        return all(request.done() for request in self.requests)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        for request in self.requests:
            request.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return ANY_SOURCE


class Transport(abc.ABC):
    """Tagged, FIFO-per-tag, point-to-point byte messages between the ranks of one job."""

    rank: int
    size: int
    # The dtype float32 sums travel as (compression, ``algorithms/wire.py``), or None: full bits.
    wire_dtype: np.dtype | None = None

    @abc.abstractmethod
    def isend(self, peer: int, data: memoryview, tag: int,
              signature: Signature | None = None) -> Request:
        """Start sending ``data`` (a byte view) to ``peer``; ``data`` must stay valid until done.

        ``signature`` describes the collective call the message belongs to; the receiver
        compares it with its own and fails with ``CollectiveMismatchError`` if they differ.
        """

    @abc.abstractmethod
    def irecv(self, peer: int, out: memoryview, tag: int,
              signature: Signature | None = None) -> Request:
        """Post a receive of exactly ``len(out)`` bytes from ``peer`` (or ``ANY_SOURCE``)."""

    def send(self, peer: int, data: memoryview, tag: int, timeout: float | None = None) -> None:
        """Send and wait until ``data`` may be reused."""
        self.isend(peer, data, tag).wait(timeout)

    def recv(self, peer: int, out: memoryview, tag: int, timeout: float | None = None) -> int:
        """Receive into ``out``; return the sender's global rank."""
        return self.irecv(peer, out, tag).wait(timeout)

    def exchange(self, receives: Sequence[tuple[int, memoryview]], sends: Sequence[tuple[int, memoryview]],
                 tag: int, signature: Signature | None = None) -> Request:
        """Post every receive ``(peer, out)``, then start every send ``(peer, data)``, all with
        ``tag``; one request for them all, done when every one is. Each peer appears at most once
        in each list (so their order does not matter). Its ``wait`` raises the first failure in
        that order and returns ``ANY_SOURCE``. A transport may do it in one go (TCP: one lock,
        one look at the call's signature); this one posts them one by one."""
        return Together([*(self.irecv(peer, out, tag, signature) for peer, out in receives),
                         *(self.isend(peer, data, tag, signature) for peer, data in sends)])

    def progress(self, group_id: int, peers: Sequence[int],
                 timeout: float) -> dict[int, tuple[int, Signature | None] | None]:
        """Which call of ``group_id`` each of ``peers`` has reached, and that call's signature
        (None: no answer in time).

        Asked only when a wait stalls or times out, to find a peer in another call or name the
        ranks that did not arrive. A transport that cannot ask returns an empty dict.
        """
        return {}

    def lost_peers(self) -> frozenset[int]:
        """Peers this transport knows are gone for good (dead, departed, or their link broke);
        a transport that cannot tell returns an empty set. ``Group.shrink`` leaves them out."""
        return frozenset()

    def abort_cause(self, group_id: int, grace: float) -> BaseException | None:
        """The failure of its own (not a lost peer it passed on) that a peer reported for
        ``group_id``, if one came or comes within ``grace`` seconds; None otherwise. Asked when a
        call failed on a lost peer, after this rank told the others: the peer that failed first
        may have said why before the link to another broke. A transport whose aborts arrive with
        its failures returns None at once."""
        return None

    @abc.abstractmethod
    def abort_group(self, group_id: int, error: BaseException, tell_peers: bool = True) -> None:
        """Fail every pending and future message of ``group_id`` here and (``tell_peers``) on
        every peer."""

    @abc.abstractmethod
    def abort(self, error: BaseException) -> None:
        """Fail every pending and future request with ``error`` (callable from any thread)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release sockets, threads and memory; idempotent."""


def signature_mismatch(peer: int, theirs: Signature | None, rank: int,
                       mine: Signature | None) -> CollectiveMismatchError | None:
    """The error for a message from ``peer`` whose call differs from this rank's, if it does."""
    if theirs is None or mine is None or theirs == mine:
        return None
    return CollectiveMismatchError(f"rank {peer} called {theirs.describe()} while rank {rank} "
                                   f"called {mine.describe()}")


# How an abort's cause travels between ranks: its class as a small code, the rank it names
# (PeerLostError) or -1, then its message in UTF-8; the receiving rank rebuilds the error.
_ABORT_RECORD = struct.Struct("<Bi")
_ERROR_CODES: tuple[type[CommError], ...] = (GroupAbortedError, PeerLostError, CollectiveMismatchError,
                                             CommTimeoutError)


def encode_abort(error: BaseException, max_bytes: int) -> bytes:
    """The payload that tells a peer why a group was aborted, at most ``max_bytes`` long."""
    code = next((i for i, kind in enumerate(_ERROR_CODES) if isinstance(error, kind)), 0)
    rank = error.rank if isinstance(error, PeerLostError) else -1
    message = str(error).encode("utf-8", "replace")[:max_bytes - _ABORT_RECORD.size]
    return _ABORT_RECORD.pack(code, rank) + message


def decode_abort(peer: int, payload: bytes | memoryview) -> CommError:
    """The error an abort payload from ``peer`` carries, rebuilt as its class."""
    if len(payload) < _ABORT_RECORD.size:
        return GroupAbortedError(f"rank {peer} aborted the group")
    code, rank = _ABORT_RECORD.unpack_from(payload)
    message = bytes(payload[_ABORT_RECORD.size:]).decode("utf-8", "replace")
    if "(reported by rank" not in message:
        message += f" (reported by rank {peer})"
    if code == 1:
        return PeerLostError(rank, message.removeprefix(f"peer rank {rank} was lost: "))
    return _ERROR_CODES[code if 0 <= code < len(_ERROR_CODES) else 0](message)


def as_bytes(array: np.ndarray) -> memoryview:
    """A writable-if-possible, zero-copy byte view of a C-contiguous array of any dtype."""
    if not array.flags.c_contiguous:
        raise ValueError("transport buffers must be C-contiguous")
    return array.reshape(-1).view(np.uint8).data
