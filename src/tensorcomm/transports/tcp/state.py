"""The state and methods the parts of ``TcpTransport`` share, declared once for the type checker.

``transport.TcpTransport`` is put together from ``sending.Sending``, ``reading.Reading``,
``receiving.Receiving`` and ``control.Control``; each part calls the others' methods, declared
here as abstract methods (one plain method call each, as in a single class).
"""

from __future__ import annotations

import abc
import select
import threading
from collections.abc import Callable

import numpy as np

from ...errors import PeerLostError
from ...signature import Signature
from ..base import Transport
from ..matching import Matching
from .driving import Driving
from .messages import Link, TcpRequest, Unexpected


class TcpState(Transport):
    """Attributes set by ``TcpTransport.__init__`` and the methods one part calls on another."""

    send_timeout: float
    _links: dict[int, Link]
    _by_fd: dict[int, Link]
    _lock: threading.Lock  # guards the matching state
    _noted: int  # the call (tag >> STEP_BITS) whose signature was noted last
    _match: Matching[TcpRequest, Unexpected]
    _progress: dict[tuple[int, int], tuple[int, Signature | None]]
    _peer_failures: dict[int, BaseException]
    _on_peer_lost: Callable[[int, BaseException], None] | None
    _discard: memoryview
    _spares: dict[int, list[np.ndarray]]
    _spare_bytes: int
    _role: Driving
    _run_until: Callable[[Callable[[], bool], float | None], bool]
    _poller: select.poll

    @abc.abstractmethod
    def _enqueue(self, link: Link, header: bytes, payload: memoryview,
                 tag: int | None) -> TcpRequest | None: ...

    @abc.abstractmethod
    def _deliver(self, source: int, tag: int, data: memoryview, signature: Signature | None) -> None: ...

    @abc.abstractmethod
    def _fill(self, request: TcpRequest, source: int, entry: Unexpected) -> None: ...

    @abc.abstractmethod
    def _note_call(self, tag: int, signature: Signature | None) -> BaseException | None: ...

    @abc.abstractmethod
    def _check_late(self, source: int, tag: int, signature: Signature | None) -> None: ...

    @abc.abstractmethod
    def _check(self, request: TcpRequest, source: int, nbytes: int,
               signature: Signature | None) -> BaseException | None: ...

    @abc.abstractmethod
    def _reject(self, request: TcpRequest, source: int, error: BaseException) -> None: ...

    @abc.abstractmethod
    def _complete(self, request: TcpRequest, source: int, error: BaseException | None = None) -> None: ...

    @abc.abstractmethod
    def _link_failed(self, link: Link, error: PeerLostError) -> None: ...

    @abc.abstractmethod
    def _cause(self, request: TcpRequest, error: BaseException) -> BaseException: ...

    @abc.abstractmethod
    def _peer_gone(self, peer: int, error: PeerLostError) -> None: ...

    @abc.abstractmethod
    def _send_control(self, peer: int, kind: int, tag: int, payload: bytes,
                      signature: Signature | None = None) -> None: ...
