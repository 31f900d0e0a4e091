"""The narrow interface every transport implements and every algorithm talks through.

Ranks here are *global* ranks; algorithms see group ranks through ``algorithms.base.Ctx``.
Messages between one pair of ranks that carry the same tag are matched in FIFO order. A message
whose size differs from the posted buffer is an error (``CollectiveMismatchError``), never a
partial or overflowing write.
"""

from __future__ import annotations

import abc
from typing import Protocol

import numpy as np

ANY_SOURCE = -1


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


class Transport(abc.ABC):
    """Tagged, FIFO-per-tag, point-to-point byte messages between the ranks of one job."""

    rank: int
    size: int

    @abc.abstractmethod
    def isend(self, peer: int, data: memoryview, tag: int) -> Request:
        """Start sending ``data`` (a byte view) to ``peer``; ``data`` must stay valid until done."""

    @abc.abstractmethod
    def irecv(self, peer: int, out: memoryview, tag: int) -> Request:
        """Post a receive of exactly ``len(out)`` bytes from ``peer`` (or ``ANY_SOURCE``)."""

    def send(self, peer: int, data: memoryview, tag: int, timeout: float | None = None) -> None:
        """Send and wait until ``data`` may be reused."""
        self.isend(peer, data, tag).wait(timeout)

    def recv(self, peer: int, out: memoryview, tag: int, timeout: float | None = None) -> int:
        """Receive into ``out``; return the sender's global rank."""
        return self.irecv(peer, out, tag).wait(timeout)

    @abc.abstractmethod
    def abort(self, error: BaseException) -> None:
        """Fail every pending and future request with ``error`` (callable from any thread)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release sockets, threads and memory; idempotent."""


def as_bytes(array: np.ndarray) -> memoryview:
    """A writable-if-possible, zero-copy byte view of a C-contiguous array of any dtype."""
    if not array.flags.c_contiguous:
        raise ValueError("transport buffers must be C-contiguous")
    return memoryview(array.reshape(-1).view(np.uint8))
