"""``Work``: the handle an ``async_op=True`` call returns."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ..errors import CommTimeoutError

log = logging.getLogger("tensorcomm.work")


class Work:
    """A pending collective or point-to-point call.

    ``wait`` blocks until it completes and re-raises its error on the waiting thread, as
    torch.distributed's ``Work.wait`` does. A collective's ``algorithm`` (a row of
    docs/algorithms.md) and ``transport`` (``"shm"``, ``"tcp"``, ``"mpi"``, ``"loopback"``,
    ``"hier"``) say what runs it; both are None for point-to-point calls.
    """

    def __init__(self, description: str) -> None:
        self._description = description
        self._completed = False  # set (under _lock) once the call and its done hooks have finished
        self._event: threading.Event | None = None  # made by the first waiter that must block
        self._error: BaseException | None = None
        self._result: Any = None
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self._finished = False  # result and error final; set under _lock before the done hooks run
        self._done_hooks: list[Callable[[Work], None]] = []
        # Set by the engine that queued the call: runs it on the waiting thread if it has not
        # started yet (see ``Engine._run_here``).
        self._run_here: Callable[[Work], None] | None = None
        self.algorithm: str | None = None  # set by the group that issues a collective
        self.transport: str | None = None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the call completes; return True.

        Args:
            timeout: seconds to wait; ``None`` waits as long as the group's own timeout allows.

        Raises:
            CommTimeoutError: not complete within ``timeout``.
            CommError: the call itself failed (its own exception is re-raised).
        """
        if not self._completed:
            if timeout is None and self._run_here is not None:
                self._run_here(self)
            if not self._completed:
                with self._lock:  # an event only when a thread must block: most waits need none
                    event = None if self._completed else self._event or threading.Event()
                    self._event = event
                if event is not None and not event.wait(timeout):
                    raise CommTimeoutError(f"{self._description} did not complete within {timeout:g} s")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        """Whether the call has finished, successfully or not."""
        return self._completed

    def is_success(self) -> bool:
        """Whether the call has finished without an error."""
        return self._completed and self._error is None

    def exception(self) -> BaseException | None:
        """The call's error once it has failed, else ``None``."""
        return self._error

    def result(self) -> Any:
        """What the call produced (e.g. the sender's rank for ``irecv``) after ``wait``."""
        self.wait()
        return self._result

    def _after(self, callback: Callable[[], None]) -> None:
        """Run ``callback()`` once the call succeeds, before ``wait`` returns.

        Frontends use it to copy results into the caller's own array. An exception from the
        callback becomes the call's error.
        """
        with self._lock:
            if not self._finished:
                self._callbacks.append(callback)
                return
        if self._error is None:
            callback()

    def _on_done(self, hook: Callable[[Work], None]) -> None:
        """Run ``hook(work)`` once the call has finished, successfully or not, before ``wait``
        returns (at once, on this thread, if it has finished already).

        For frameworks whose own handles must learn the outcome, failures included (the torch
        backend completes torch futures here). Hooks run on the thread that completes the call
        (an engine's worker for async collectives) after ``_after`` callbacks; ``exception()``
        tells how it ended. An exception from a hook is logged, never raised: the call's
        outcome is decided already.
        """
        with self._lock:
            if not self._finished:
                self._done_hooks.append(hook)
                return
        _run_hook(hook, self)

    def _complete(self, result: Any = None, error: BaseException | None = None) -> None:
        with self._lock:
            callbacks, self._callbacks = self._callbacks, []
            if error is None:
                try:
                    for callback in callbacks:
                        callback()
                except BaseException as exc:  # noqa: BLE001 - surfaced by wait(), as the call's errors are
                    error = exc
            self._result = result
            self._error = error
            self._finished = True
            hooks, self._done_hooks = self._done_hooks, []
        for hook in hooks:  # outside the lock: a hook may look at this Work again
            _run_hook(hook, self)
        with self._lock:
            self._completed = True
            event = self._event
        if event is not None:
            event.set()

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self._completed else "pending"
        return f"<Work {self._description} {state}>"


def _run_hook(hook: Callable[[Work], None], work: Work) -> None:
    try:
        hook(work)
    except Exception:
        log.exception("a completion hook of %s raised; the call's own outcome stands", work._description)
