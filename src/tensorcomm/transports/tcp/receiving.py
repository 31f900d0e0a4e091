"""The TCP transport's receive matching: post receives, check messages against them, finish requests.

Matching state itself: ``transports/matching.py``; frames are read in ``reading.py``.
"""

from __future__ import annotations

from ...errors import CollectiveMismatchError
from ...signature import Signature
from ..base import P2P_FLAG, SEQ_BITS, STEP_BITS, call_of_tag, signature_mismatch
from .messages import TcpRequest
from .state import TcpState

_CALL_SHIFT = SEQ_BITS + STEP_BITS  # a collective tag's group id, above its call's sequence number
_SEQ_MASK = (1 << SEQ_BITS) - 1


class Receiving(TcpState):
    """Posting and matching receives of ``TcpTransport``."""

    def irecv(self, peer: int, out: memoryview, tag: int,
              signature: Signature | None = None) -> TcpRequest:
        buffer = out.cast("B") if out.format != "B" else out
        request = TcpRequest(self._run_until, peer, tag, buffer, signature)
        if tag >> STEP_BITS != self._noted and signature is not None:
            mismatch = self._note_call(tag, signature)
            if mismatch is not None:
                self._complete(request, peer, mismatch)
                return request
        match = self._match
        with self._lock:
            source, entry = match.take_unexpected(peer, tag) if match.unexpected else (peer, None)
            if entry is None:
                error = match.refusal(peer, tag) if match.aborted or match.aborted_groups or \
                    match.lost else None
                if error is None:
                    self._match.post(peer, tag, request)
                    return request
            elif not entry.complete:
                error = self._check(request, source, len(entry.data), entry.signature)
                if error is None:
                    entry.request = request  # the driver moves it into ``out`` as it arrives
                    return request
        if entry is None:
            self._complete(request, peer, error)
        elif entry.complete:
            self._fill(request, source, entry)
        else:
            self._reject(request, source, error)  # type: ignore[arg-type]
        return request

    def _note_call(self, tag: int, signature: Signature | None) -> BaseException | None:
        """Remember this rank's signature for the tag's call; check messages already queued for it.

        Once per call: the requests that follow for the same call skip it (``_noted``); messages
        that arrive later are checked on arrival (``_check_late``). Returns the error to fail the
        request with when a queued message disagrees (the group is then aborted everywhere).
        """
        if tag & P2P_FLAG or signature is None:
            return None
        call = (tag >> _CALL_SHIFT, (tag >> STEP_BITS) & _SEQ_MASK)  # ``call_of_tag``, inline
        with self._lock:
            mismatch = self._match.note_call(call, signature)
        if mismatch is not None:
            self.abort_group(call[0], mismatch)
            return mismatch
        self._noted = tag >> STEP_BITS
        return None

    def _check_late(self, source: int, tag: int, signature: Signature | None) -> None:
        """Abort the group if an unmatched message contradicts the call this rank made."""
        late = self._match.late_mismatch(source, tag, signature)
        if late is not None:
            self.abort_group(*late)

    def _check(self, request: TcpRequest, source: int, nbytes: int,
               signature: Signature | None) -> BaseException | None:
        """The error a message of ``nbytes`` with ``signature`` raises for ``request``, if any."""
        mine = request.signature
        if signature is not None and mine is not None and signature != mine:
            return signature_mismatch(source, signature, self.rank, mine)
        assert request.out is not None
        if nbytes != len(request.out):
            return CollectiveMismatchError(
                f"rank {source} sent a {nbytes}-byte message where a {len(request.out)}-byte one was "
                "expected: the ranks called collectives with different sizes, dtypes or orders")
        return None

    def _reject(self, request: TcpRequest, source: int, error: BaseException) -> None:
        """Fail ``request`` for a message that does not fit it, and abort its group everywhere."""
        call = call_of_tag(request.tag)
        if call is not None:
            self.abort_group(call[0], error)
        self._complete(request, source, error)

    def _complete(self, request: TcpRequest, source: int, error: BaseException | None = None) -> None:
        """Finish ``request`` and wake whoever waits for it in another thread."""
        request.source = source
        request._error = error
        request._done = True
        self._role.completed()
