"""Runs one group's calls strictly in issue order.

A blocking call runs inline on the caller's thread when nothing is queued ahead of it (the common
case, and the one whose latency matters); otherwise it queues behind the pending async calls and
waits. Async calls run on one worker thread per group, started on first use. The issue order
fixes each call's sequence number, which tags its messages.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable

from .work import Work

Body = Callable[[int], Any]  # takes the call's sequence number


class Engine:
    """Per-group executor: sequence numbers, inline fast path, async worker."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._mutex = threading.Lock()  # taken directly on the inline path (cheaper than the Condition)
        self._lock = threading.Condition(self._mutex)
        self._queue: deque[tuple[int, Body, Work]] = deque()
        self._busy = False
        self._seq = 0
        self._worker: threading.Thread | None = None
        self._stopped: BaseException | None = None

    def enter(self) -> int | None:
        """Claim the engine for a blocking call to run inline on the caller's thread.

        Returns the call's sequence number, or None when the call must queue (something is
        running or queued ahead of it, or the engine stopped): then use ``submit``. After a
        successful ``enter`` the caller runs the call and must ``leave()``, even if it fails.
        """
        with self._mutex:
            if self._busy or self._queue or self._stopped is not None:
                return None
            seq = self._seq
            self._seq = seq + 1
            self._busy = True
            return seq

    def leave(self) -> None:
        """End the inline call claimed by ``enter``."""
        # Without the lock: the worker (the only thread waiting on the condition) either sees
        # _busy cleared when it next looks, or finds its call queued here and is woken.
        self._busy = False
        if self._queue:
            with self._mutex:
                self._lock.notify_all()

    def submit(self, description: str, body: Body, async_op: bool) -> Work | Any:
        """Run ``body(seq)`` in issue order; return a ``Work`` if async, else body's result."""
        if not async_op:
            seq = self.enter()
            if seq is not None:
                try:
                    return body(seq)
                finally:
                    self.leave()
        return self._submit_queued(description, body, async_op)

    def _submit_queued(self, description: str, body: Body, async_op: bool) -> Work | Any:
        with self._mutex:
            if self._stopped is not None:
                raise self._stopped
            seq = self._seq
            self._seq += 1
            inline = not async_op and not self._busy and not self._queue
            if inline:
                self._busy = True
            else:
                work = Work(description)
                self._queue.append((seq, body, work))
                self._ensure_worker()
                self._lock.notify_all()
        if inline:
            try:
                return body(seq)
            finally:
                with self._mutex:
                    self._busy = False
                    if self._queue:
                        self._lock.notify_all()
        if async_op:
            return work
        work.wait()
        return work._result

    def _ensure_worker(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._run, daemon=True,
                                            name=f"tensorcomm-engine-{self._name}")
            self._worker.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                while (self._busy or not self._queue) and self._stopped is None:
                    self._lock.wait()
                if self._stopped is not None and not self._queue:
                    return
                seq, body, work = self._queue.popleft()
                self._busy = True
            try:
                work._complete(result=body(seq))
            except BaseException as exc:  # delivered to whoever waits on the Work
                work._complete(error=exc)
            finally:
                with self._lock:
                    self._busy = False
                    self._lock.notify_all()

    def stop(self, error: BaseException) -> None:
        """Refuse new calls with ``error``; fail queued ones; let the running one finish."""
        with self._lock:
            self._stopped = error
            pending = list(self._queue)
            self._queue.clear()
            self._lock.notify_all()
        for _, _, work in pending:
            work._complete(error=error)
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout=5)
