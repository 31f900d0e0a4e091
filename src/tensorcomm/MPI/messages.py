"""The messages and pending calls of MPI point-to-point: an ``Envelope`` that arrived, a posted
``Receive``, a ``Send`` handed to the transport, and the checks and unpickling they share. The
matching ``Engine`` (``p2p.py``) makes and completes them; ``pt2pt.py`` hands them to requests.
Imports the MPI package's ``constants``, ``exceptions`` and ``status``, and ``transports.base``
for the request type; an engine is duck-typed here (``Receive`` and ``Send`` call its ``poll``,
``wait_for``, ``finish_transfer`` and ``lock``).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..transports.base import Request as TransportRequest
from . import exceptions
from .constants import ANY_SOURCE, ANY_TAG, PROC_NULL, TAG_UB
from .status import Status

if TYPE_CHECKING:
    from .p2p import Engine

# An envelope's flags: a synchronous send; a payload lent at an address; a lent one was read.
SYNC, LENT, RETURNED = 1, 2, 4


class Envelope:
    """A message that arrived: who sent it (communicator rank), its tag and length, and its
    payload when it came inline."""

    __slots__ = ("source", "peer", "tag", "nbytes", "sequence", "inline", "sync", "order", "lent",
                 "failure")

    def __init__(self, source: int, peer: int, fields: tuple[int, ...], inline: np.ndarray | None,
                 lent: int = 0) -> None:
        self.source, self.peer = source, peer
        self.tag, self.nbytes, self.sequence, flags, self.order = fields
        self.sync = bool(flags & SYNC)
        self.inline = inline
        self.lent = lent  # the payload's address in the sender's memory, until it is read
        self.failure: BaseException | None = None  # reading the lent payload failed

    def fits(self, source: int, tag: int) -> bool:
        return (source == ANY_SOURCE or source == self.source) and (tag == ANY_TAG or tag == self.tag)


class Receive:
    """A posted receive: into ``buffer`` (a flat uint8 view), or of an object (``buffer`` None)."""

    __slots__ = ("engine", "source", "tag", "buffer", "envelope", "payload", "error", "cancelled",
                 "data")

    def __init__(self, engine: Engine | None, source: int, tag: int, buffer: np.ndarray | None) -> None:
        self.engine, self.source, self.tag, self.buffer = engine, source, tag, buffer
        self.envelope: Envelope | None = None
        self.payload: TransportRequest | None = None
        self.error: BaseException | None = None
        self.cancelled = False
        self.data: np.ndarray | None = None  # an object's pickle

    def matched(self) -> bool:
        return self.envelope is not None or self.cancelled or self.engine is None

    def done(self) -> bool:
        if not self.matched():
            assert self.engine is not None
            self.engine.poll()
            if not self.matched():
                return False
        return self.payload is None or self.payload.done()

    def finish(self) -> Any:
        engine = self.engine
        if engine is not None:
            if not self.matched():
                engine.wait_for(self.matched, self.source)
            if self.payload is not None:
                engine.finish_transfer(self.payload)
                self.payload = None
        if self.error is not None:
            raise self.error
        if self.buffer is None and self.data is not None:
            return unpickle(self.data) if self.data.size else None
        return None

    def describe(self, status: Status) -> None:
        envelope = self.envelope
        if self.cancelled:
            status._set(ANY_SOURCE, ANY_TAG, 0, cancelled=True)
        elif envelope is None:
            status._set(PROC_NULL, ANY_TAG, 0)
        else:
            status._set(envelope.source, envelope.tag, envelope.nbytes,
                        exceptions.ERR_TRUNCATE if self.error is not None else 0)

    def cancel(self) -> bool:
        engine = self.engine
        if engine is None:
            return False
        with engine.lock:
            if self.matched():
                return False
            engine.posted.remove(self)
            self.cancelled = True
            return True


class Send:
    """A message handed to the transport: done when its envelope and payload are sent."""

    __slots__ = ("engine", "requests", "keep")

    def __init__(self, engine: Engine | None, requests: list[TransportRequest], keep: Any = None) -> None:
        self.engine, self.requests, self.keep = engine, requests, keep

    def _sent(self) -> bool:
        return all(request.done() for request in self.requests)

    def done(self) -> bool:
        if self.engine is not None:
            self.engine.poll()  # a synchronous send to this rank is matched here
        return self._sent()

    def finish(self) -> Any:
        engine = self.engine
        if engine is not None and self.requests:  # none: the mailbox has the whole message
            if not self._sent():
                engine.wait_for(self._sent, ANY_SOURCE, spin=False)
            for request in self.requests:
                engine.finish_transfer(request)
        self.keep = None
        return None

    def describe(self, status: Status) -> None:
        status._clear()

    def cancel(self) -> bool:
        return False


def unpickle(data: np.ndarray | bytes) -> Any:
    """The object a message carried. **Runs code the sender chose**, as every unpickling does:
    use object messages among trusted processes only (docs/security.md)."""
    return pickle.loads(data.data if isinstance(data, np.ndarray) else data)


unpickle_bytes: Callable[[bytes], Any] = pickle.loads
"""``unpickle`` of bytes, with no frame of its own (the blocking object receive's way)."""


def check_tag(tag: Any, fn: str, wildcard: bool) -> int:
    """``tag`` as an int, checked (``ANY_TAG`` only where ``wildcard``)."""
    if type(tag) is not int:
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)):
            raise TypeError(f"{fn}: tag must be an int, got {type(tag).__name__}")
        tag = int(tag)
    if not (0 <= tag <= TAG_UB or (wildcard and tag == ANY_TAG)):
        raise exceptions.error(exceptions.ERR_TAG, f"{fn}: tag {tag} is outside 0..{TAG_UB}")
    return tag
