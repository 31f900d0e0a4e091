"""Runs one group's calls strictly in issue order.

A blocking call runs inline on the caller's thread when nothing is queued ahead of it (the common
case, and the one whose latency matters); otherwise it queues behind the pending async calls and
waits. Async calls run on one worker thread per group, started on first use. Each call's sequence
number, which tags its messages, is its position in that order. A thread that waits (with no
time limit) for a queued call the worker has not started yet runs it, and the calls queued ahead
of it, itself: the caller waits anyway, and a hop to the worker and back costs two thread
wake-ups (DDP's buffer broadcast in every forward waits at once for its async call).

Every call is ``call(seq, job)``, run by ``submit`` on whichever thread gets to it (``job``: the
caller's one argument, a tuple to unpack if it needs several: a call spelled ``call(seq, *args)``
costs Python a frame of C recursion, ~0.13 us, on the small-call path). Whoever runs a
call (an inline caller, the worker, or a waiter) holds ``_running``; sequence numbers are handed
out only by its holder, so they follow the order calls actually run in. A queued call stays at the
head of the queue until the worker holds ``_running``, so an inline caller can never jump ahead of
it. The inline path costs a non-blocking lock acquire and release, no condition variable, and
tries once: a blocking call that cannot run inline queues at once.

One group, one issuing thread at a time: calls issued from two threads while either's calls are
still in flight would run in a different order on each rank and pair the wrong arrays silently,
so such a call raises ``ConcurrentUseError`` instead (sequential use from several threads is
fine). Different groups may be used from different threads at once.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from threading import get_ident
from typing import Any

from ..errors import ConcurrentUseError
from ..transports.threads import mark_worker
from .work import Work

Call = Callable[[int, Any], Any]  # call(seq, job): seq is the call's sequence number


class Engine:
    """Per-group executor: sequence numbers, inline fast path, async worker."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._mutex = threading.Lock()  # guards _queue, _worker and _stopped
        self._wakeup = threading.Condition(self._mutex)  # the worker waits here for queued calls
        self._running = threading.Lock()  # held while a call of this group runs
        self._queue: deque[tuple[Call, Any, Work]] = deque()
        self._seq = 0  # the next call's sequence number; only the holder of _running changes it
        self._worker: threading.Thread | None = None
        self._stopped: BaseException | None = None
        self._inline: int | None = None  # thread running an inline call (set by its holder)
        self._issuer: int | None = None  # thread whose queued calls are in flight
        self._queued = 0  # calls submitted and not yet finished; guarded by _mutex

    @classmethod
    def refusing(cls, name: str, error: BaseException) -> Engine:
        """An engine that refuses every call with ``error``."""
        engine = cls(name)
        engine._stopped = error
        return engine

    @property
    def stopped(self) -> BaseException | None:
        """The error every call is refused with once the engine stopped, else None."""
        return self._stopped

    def submit(self, description: str, call: Call, async_op: bool, job: Any = None) -> Work | Any:
        """Run ``call(seq, job)`` in issue order; return a ``Work`` if async, else its result.

        A blocking call runs inline on the caller's thread when nothing runs or waits ahead of
        it; otherwise it queues, and the caller waits for it (running it, and the calls ahead of
        it, itself if the worker has not started them).

        Raises:
            ConcurrentUseError: another thread's calls on this group are in flight.
        """
        running = self._running
        if not async_op and running.acquire(False):
            if self._queue or self._stopped is not None:  # queued or stopped: that goes first
                running.release()
            else:
                self._inline = get_ident()
                seq = self._seq
                self._seq = seq + 1
                try:
                    return call(seq, job)
                finally:
                    self._inline = None
                    running.release()
        work = Work(description)
        work._run_here = self._run_here
        me = get_ident()
        with self._mutex:
            if self._stopped is not None:
                raise self._stopped
            inline = self._inline
            other = inline if inline is not None and inline != me else \
                self._issuer if self._queued and self._issuer != me else None
            if other is not None:
                raise ConcurrentUseError(
                    f"{description} was called from thread {me} while thread {other}'s calls on the "
                    "same group are in flight: their order would differ between ranks. Use one "
                    "group per thread, or finish one thread's calls before the other starts")
            self._issuer = me
            self._queued += 1
            self._queue.append((call, job, work))
            self._ensure_worker()
            self._wakeup.notify_all()
        if async_op:
            return work
        work.wait()
        return work._result

    def _run_here(self, work: Work) -> None:
        """Run the queued calls up to ``work`` on this thread if none of them has started."""
        if not self._running.acquire(False):
            return  # the worker (or an inline caller) is running: wait for it instead
        try:
            while True:
                with self._mutex:
                    if not any(queued is work for _, _, queued in self._queue):
                        return  # taken by the worker before we held _running, or failed by stop()
                    call, job, queued = self._queue.popleft()
                self._run_one(call, job, queued)
                if queued is work:
                    return
        finally:
            self._running.release()

    def _run_one(self, call: Call, job: Any, work: Work) -> None:
        """Run one dequeued call (the caller holds ``_running``) and complete its ``Work``."""
        seq = self._seq
        self._seq = seq + 1
        try:
            work._complete(result=call(seq, job))
        except BaseException as exc:  # noqa: BLE001 - delivered to whoever waits on the Work
            work._complete(error=exc)
        with self._mutex:
            self._queued -= 1

    def _ensure_worker(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, daemon=True,
                                            name=f"tensorcomm-engine-{self._name}")
            self._worker.start()

    def _run(self) -> None:
        mark_worker()
        while True:
            with self._mutex:
                while not self._queue and self._stopped is None:
                    self._wakeup.wait()
                if not self._queue:  # stopped
                    return
            with self._running:
                with self._mutex:
                    if not self._queue:  # failed by stop() while we waited for _running
                        continue
                    call, job, work = self._queue.popleft()
                self._run_one(call, job, work)

    def stop(self, error: BaseException) -> None:
        """Refuse new calls with ``error``; fail queued ones; let the running one finish."""
        with self._mutex:
            self._stopped = error
            pending = list(self._queue)
            self._queue.clear()
            self._queued -= len(pending)
            self._wakeup.notify_all()
        for _, _, work in pending:
            work._complete(error=error)
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout=5)
