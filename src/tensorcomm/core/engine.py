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

A call may be deferred (``submit(..., defer=True)``: a persistent call's ``start()``): it is
queued without waking the worker, and runs when the issuing thread waits for it or makes its next
call on the group (as MPICH progresses a started request inside the next MPI call: no thread
hand-off), or else on the worker once it has stood at the head of the queue for a whole
``DEFER_SECONDS``, so that a thread that waits on something else first cannot hang its peers.
The worker therefore wakes every ``DEFER_SECONDS`` while deferred calls come (not at all once it
has seen none for ``IDLE_WAKEUPS`` wake-ups), and ``kick`` has it run whatever is queued at once.

A blocking call that runs inline may also stop half way (``park``: a persistent call's
``start()`` that posted this rank's part and returns, as ``MPI_Start`` does): its rest is then
owed before anything else runs on the engine, and whoever holds ``_running`` next runs it first
(the issuing thread's ``wait``, through ``settle``, or the next call on the group, which takes
the queued path to get there). A parked call needs no worker to go on where the peers need only
its post, which is made; one parked *watched* (the peers may need its later rounds) is finished
by the worker, as a deferred call is run, if nobody has come back for it within
``DEFER_SECONDS``.

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
from typing import Any, Protocol

from ..errors import ConcurrentUseError
from ..transports.threads import mark_worker
from .work import Work

Call = Callable[[int, Any], Any]  # call(seq, job): seq is the call's sequence number
DEFER_SECONDS = 0.01  # how often the worker looks for deferred calls nobody came back for
IDLE_WAKEUPS = 100  # wake-ups without a deferred call, after which the worker sleeps until told


class Parked(Protocol):
    """A call that stopped half way (``Engine.park``): ``finish()`` runs the rest of it, and
    never raises (its error goes to whoever waits for the call)."""

    def finish(self) -> None: ...


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
        self._hurry = False  # a queued call must run now (not deferred, or kicked); guarded by _mutex
        self._napping = False  # the worker waits until told (it looks for deferred calls no more)
        self._patience = 0  # wake-ups the worker has left to look for deferred calls; guarded by _mutex
        self._parked: Parked | None = None  # a call begun and not finished (``park``)
        self._parked_by: int | None = None  # the thread that parked it
        self._watched: Parked | None = None  # a parked call the worker finishes if nobody does

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

    def submit(self, description: str, call: Call, async_op: bool, job: Any = None,
               defer: bool = False) -> Work | Any:
        """Run ``call(seq, job)`` in issue order; return a ``Work`` if async, else its result.

        A blocking call runs inline on the caller's thread when nothing runs or waits ahead of
        it; otherwise it queues, and the caller waits for it (running it, and the calls ahead of
        it, itself if the worker has not started them). An async call with ``defer`` waits in
        the queue for the caller to come back (see the module docstring).

        Raises:
            ConcurrentUseError: another thread's calls on this group are in flight.
        """
        if not async_op:
            seq = self.enter()
            if seq >= 0:
                try:
                    return call(seq, job)
                finally:
                    self.leave()
        work = Work(description)
        work._run_here = self._run_here
        me = get_ident()
        with self._mutex:
            if self._stopped is not None:
                raise self._stopped
            inline, parked_by = self._inline, self._parked_by
            other = inline if inline is not None and inline != me else \
                self._issuer if self._queued and self._issuer != me else \
                parked_by if self._parked is not None and parked_by != me else None
            if other is not None:
                raise ConcurrentUseError(
                    f"{description} was called from thread {me} while thread {other}'s calls on the "
                    "same group are in flight: their order would differ between ranks. Use one "
                    "group per thread, or finish one thread's calls before the other starts")
            self._issuer = me
            self._queued += 1
            self._queue.append((call, job, work))
            self._ensure_worker()
            if defer:
                self._patience = IDLE_WAKEUPS
            else:
                self._hurry = True
            if not defer or self._napping:
                self._wakeup.notify_all()
        if async_op:
            return work
        work.wait()
        return work._result

    def enter(self) -> int:
        """Begin running a blocking call inline, on this thread: return its sequence number, or
        -1 when another call runs or waits ahead of it (queued, or parked), or the engine stopped
        (then ``submit`` it). A call that got a number must ``leave()`` or ``park()`` when it is
        done, whatever happens."""
        running = self._running
        if not running.acquire(False):
            return -1
        if self._queue or self._stopped is not None or self._parked is not None:  # that goes first
            running.release()
            return -1
        self._inline = get_ident()
        seq = self._seq
        self._seq = seq + 1
        return seq

    def leave(self) -> None:
        """End the inline call ``enter`` began."""
        self._inline = None
        self._running.release()

    def park(self, call: Parked, watched: bool = False) -> None:
        """End the inline call ``enter`` began without finishing it: ``call.finish()`` runs the
        rest, before any other call of the engine, on whichever thread runs on it next (``settle``
        for the caller's own wait). ``watched``: the peers may need more of it than what it
        posted (a call that may go on with more rounds), so the worker finishes it, as it runs a
        deferred call, if nobody has within ``DEFER_SECONDS``."""
        self._parked, self._parked_by = call, self._inline
        self._inline = None
        if watched:
            with self._mutex:
                self._watched = call
                self._patience = IDLE_WAKEUPS
                self._ensure_worker()
                if self._napping:
                    self._wakeup.notify_all()
        self._running.release()

    def settle(self, call: Parked, timeout: float = -1) -> bool:
        """Finish the parked ``call`` on this thread unless another has (or the engine stopped
        and dropped it); waits for a call that runs meanwhile, at most ``timeout`` seconds
        (negative: as long as it takes). Returns False only when that time ran out."""
        running = self._running
        if not running.acquire(False) and not running.acquire(timeout=timeout):
            return False
        try:
            if self._parked is call:
                self._parked = self._watched = None
                call.finish()
        finally:
            running.release()
        return True

    def _run_here(self, work: Work) -> None:
        """Run the queued calls up to ``work`` on this thread if none of them has started."""
        if not self._running.acquire(False):
            return  # the worker (or an inline caller) is running: wait for it instead
        try:
            while True:
                with self._mutex:
                    queue = self._queue
                    if not queue or (queue[0][2] is not work and not any(q is work for _, _, q in queue)):
                        return  # taken by the worker before we held _running, or failed by stop()
                    call, job, queued = queue.popleft()
                self._run_one(call, job, queued)
                if queued is work:
                    return
        finally:
            self._running.release()

    def _run_one(self, call: Call, job: Any, work: Work) -> None:
        """Run one dequeued call (the caller holds ``_running``) and complete its ``Work``."""
        parked = self._parked
        if parked is not None:  # the call issued before it stopped half way: its rest comes first
            self._parked = self._watched = None
            parked.finish()
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
        seen: Any = None  # the deferred call at the head of the queue at the last wake-up
        while True:
            with self._mutex:
                while True:
                    queue, watched = self._queue, self._watched
                    if queue and (self._hurry or queue[0] is seen):
                        break
                    if watched is not None and watched is seen:
                        break
                    if not queue and self._stopped is not None:
                        return
                    if queue or watched is not None:
                        seen = queue[0] if queue else watched
                    else:
                        seen, self._hurry = None, False
                        self._patience = max(0, self._patience - 1)
                    self._napping = not self._patience
                    self._wakeup.wait(None if self._napping else DEFER_SECONDS)
                self._napping = False
            with self._running:
                parked = self._parked
                if parked is not None and parked is self._watched:  # nobody came back for it
                    self._parked = self._watched = None
                    parked.finish()
                    continue
                with self._mutex:
                    queue = self._queue
                    if not queue or not (self._hurry or queue[0] is seen):  # failed by stop(), or run
                        continue  # by a waiter while we waited for _running
                    call, job, work = queue.popleft()
                self._run_one(call, job, work)

    def kick(self) -> None:
        """Have the worker run whatever is queued now, deferred calls included."""
        with self._mutex:
            if self._queue:
                self._hurry = True
                self._wakeup.notify_all()

    def stop(self, error: BaseException) -> None:
        """Refuse new calls with ``error``; fail queued ones; let the running one finish."""
        with self._mutex:
            self._stopped = error
            self._parked = self._watched = None  # its owner finds it unfinished, and raises ``error``
            pending = list(self._queue)
            self._queue.clear()
            self._queued -= len(pending)
            self._wakeup.notify_all()
        for _, _, work in pending:
            work._complete(error=error)
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout=5)
