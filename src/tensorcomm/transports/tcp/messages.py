"""What the TCP transport keeps per request, per queued frame and per peer socket."""

from __future__ import annotations

import socket
import threading
from collections import deque
from collections.abc import Callable

import numpy as np

from ...errors import CommTimeoutError
from ...signature import Signature
from ..base import ANY_SOURCE
from . import sealing
from .sealing import Sealer

RunUntil = Callable[[Callable[[], bool], float | None], bool]


class TcpRequest:
    """A send or receive; completed by whichever thread drives the transport."""

    __slots__ = ("peer", "tag", "out", "signature", "source", "_done", "_error", "_run_until")

    def __init__(self, run_until: RunUntil | None, peer: int, tag: int,
                 out: memoryview | None = None, signature: Signature | None = None) -> None:
        self.peer = peer
        self.tag = tag
        self.out = out
        self.signature = signature
        self.source = peer
        self._done = False
        self._error: BaseException | None = None
        self._run_until = run_until  # the transport's: drives it until done or timed out

    def done(self) -> bool:
        return self._done

    def wait(self, timeout: float | None = None) -> int:
        if not self._done and (self._run_until is None or not self._run_until(self.done, timeout)):
            who = "any rank" if self.peer == ANY_SOURCE else f"rank {self.peer}"
            raise CommTimeoutError(f"no message from {who} within {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self.source


def completed(peer: int, error: BaseException | None = None) -> TcpRequest:
    request = TcpRequest(None, peer, 0)
    request._error = error
    request._done = True
    return request


class Unexpected:
    """A message that arrived before its receive was posted (``complete`` once all is in).

    A receive posted while it is still arriving attaches itself (``request``); the driver then
    copies what came so far and reads the rest straight into the request's buffer.
    """

    __slots__ = ("data", "signature", "complete", "request", "spare")

    def __init__(self, data: memoryview, signature: Signature | None, complete: bool,
                 spare: np.ndarray | None = None) -> None:
        self.data = data
        self.spare = spare  # the transport's reusable buffer behind ``data``, if it is one
        self.signature = signature
        self.complete = complete
        self.request: TcpRequest | None = None


class Send:
    """A frame queued on a link: what is left of it, its request and its deadline."""

    __slots__ = ("parts", "request", "deadline", "started")

    def __init__(self, parts: list[memoryview], request: TcpRequest | None, deadline: float) -> None:
        self.parts = parts
        self.request = request
        self.deadline = deadline
        self.started = False

    def advance(self, sent: int) -> bool:
        """Drop ``sent`` bytes from the front; return whether the frame is all out."""
        self.started = True
        while sent:
            head = self.parts[0]
            if sent < len(head):
                self.parts[0] = head[sent:]
                return False
            sent -= len(head)
            self.parts.pop(0)
        return not self.parts


class Link:
    """One peer's socket: its sealer, its send queue and the frame being read from it."""

    __slots__ = ("peer", "sock", "sealer", "fd", "send_lock", "queue", "header", "header_got", "kind",
                 "tag", "nbytes", "got", "signature", "target", "request", "entry", "closed", "polled",
                 "opened", "sent")

    def __init__(self, peer: int, sock: socket.socket, sealer: Sealer) -> None:
        self.peer = peer
        self.sock = sock
        self.sealer = sealer
        self.fd = sock.fileno()
        self.send_lock = threading.Lock()  # guards ``queue`` and writing to the socket
        self.queue: deque[Send] = deque()
        self.header = memoryview(bytearray(sealing.HEADER_BYTES))
        self.header_got = 0
        self.kind = 0  # of the frame being read; 0 while reading a header
        self.tag = 0
        self.nbytes = 0
        self.got = 0
        self.signature: Signature | None = None
        self.target: memoryview | None = None  # where the payload goes (None: discard it)
        self.request: TcpRequest | None = None  # the posted receive it fills
        self.entry: Unexpected | None = None  # or the unexpected message it fills
        self.closed = False  # no more reading: the peer is gone or said goodbye
        self.polled = 0  # the poll events registered for it
        self.opened: tuple[bytes, int, bytes] = (b"", 0, b"")  # the frame's header, number, payload tag
        self.sent = completed(peer)  # what a send the socket took whole at once returns (never changes)
