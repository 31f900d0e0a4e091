"""Messages of the TCP transport that come before their receive: their record and their buffers.

A data frame whose receive is not posted yet is read into an ``Unexpected`` (by the link, in a
buffer of the ``Pool``); a receive posted later takes it from the transport's ``Matching`` and
``Pool.fill`` copies it in, or it attaches itself to one still arriving (``Link._switch``).
The pool keeps the buffers for reuse (fresh memory costs a page fault per page; see
``algorithms.base.Scratch``), checks a message against the receive it meets and against the call
this rank made (a disagreement aborts the group everywhere), and delivers the messages a rank
sends to itself. Imports ``config``, ``signature``, ``transports.base`` and
``transports.matching``; the aborting is the owner's (``abort_group``), so that this module needs
nothing of the transport's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from ... import config
from ...signature import Signature
from ..base import call_of_tag
from ..matching import Matching, MessageRequest, misfit


class Unexpected:
    """A message that arrived before its receive was posted (``complete`` once all is in).

    A receive posted while it is still arriving attaches itself (``request``); the link then
    copies what came so far and reads the rest straight into the request's buffer.
    """

    __slots__ = ("data", "signature", "complete", "request", "spare")

    def __init__(self, data: memoryview, signature: Signature | None, complete: bool,
                 spare: np.ndarray | None = None) -> None:
        self.data = data
        self.spare = spare  # the pool's reusable buffer behind ``data``, if it is one
        self.signature = signature
        self.complete = complete
        self.request: MessageRequest | None = None


class Pool:
    """The unexpected messages' buffers of one transport, and handing a message to its receive.

    ``match`` and ``lock`` are the transport's; ``abort_group(group_id, error)`` fails a group
    here and on every peer.
    """

    def __init__(self, rank: int, match: Matching[MessageRequest, Unexpected], lock: threading.Lock,
                 abort_group: Callable[[int, BaseException], None]) -> None:
        self._rank = rank
        self._match = match
        self._lock = lock  # guards ``match`` and the spares
        self._abort_group = abort_group
        self._spares: dict[int, list[np.ndarray]] = {}  # reusable unexpected-message buffers
        self._spare_bytes = 0

    def deliver(self, source: int, tag: int, data: memoryview, signature: Signature | None) -> None:
        """Hand a whole message to its posted receive, or queue it (a message to oneself)."""
        with self._lock:
            request = self._match.pop_posted(source, tag)
            if request is None:
                self._match.queue(source, tag, Unexpected(data, signature, True))
        if request is None:
            self.check_late(source, tag, signature)
        else:
            self.fill(request, source, Unexpected(data, signature, True))

    def check_late(self, source: int, tag: int, signature: Signature | None) -> None:
        """Abort the group if an unmatched message contradicts the call this rank made."""
        late = self._match.late_mismatch(source, tag, signature)
        if late is not None:
            self._abort_group(*late)

    def reject(self, request: MessageRequest, source: int, error: BaseException) -> None:
        """Fail ``request`` for a message that does not fit it, and abort its group everywhere."""
        call = call_of_tag(request.tag)
        if call is not None:
            self._abort_group(call[0], error)
        request.finish(source, error)

    def fill(self, request: MessageRequest, source: int, entry: Unexpected) -> None:
        """Copy a whole unexpected message into ``request`` (or fail it if they disagree)."""
        error = misfit(request, source, len(entry.data), entry.signature, self._rank)
        if error is None:
            request.out[:] = entry.data  # type: ignore[index]
        self.give_back(entry)
        if error is None:
            request.finish(source)
        else:
            self.reject(request, source, error)

    def take_spare(self, nbytes: int) -> np.ndarray:
        """A buffer for an unexpected message: a reused one of that size if there is one. Hold
        the transport's ``lock``."""
        kept = self._spares.get(nbytes)
        if kept:
            self._spare_bytes -= nbytes
            return kept.pop()
        return np.empty(nbytes, np.uint8)

    def give_back(self, entry: Unexpected) -> None:
        """Keep ``entry``'s buffer for the next unexpected message of its size, within bounds."""
        spare, entry.spare = entry.spare, None
        if spare is None or spare.size == 0:
            return
        with self._lock:
            if self._spare_bytes + spare.size <= config.SCRATCH_KEEP_BYTES:
                self._spares.setdefault(spare.size, []).append(spare)
                self._spare_bytes += spare.size
