"""torch ``Work`` and ``Future`` objects over tensorcomm's ``Work``, for the torch backend.

The backend's collectives run on the group's worker thread, so DDP's gradient all-reduces go on
beside the rest of backward; the torch future of each call is completed by the thread that runs
it (that worker, or a thread that waits for the call before the worker started it) when the call
ends (``Work._on_done``).

How a failure reaches torch. ``torch.futures.Future.set_exception`` does not mark the C++ future
as failed: it stores the exception object as the future's *value*, and only Python's
``wait()``/``value()`` raise it. DDP's reducer reads a bucket's value in C++
(``Reducer::finalize_backward`` -> ``detail::parseCppCommHookResult``), finds no tensor in an
exception object, and indexes the empty list it got: SIGSEGV in the thread that runs backward
(torch 2.13, reproduced whatever thread completes the future, even one failed before it is
returned). So a failed call completes its future with a ``_Failed`` value instead: Python
readers get the call's error from the future's unwrap function, and C++ readers, which extract
tensors by pickling the value, get it from ``_Failed.__reduce_ex__`` as a C++ exception, which
DDP lets out of ``backward()``.

Callbacks. A Python callback attached with ``then``/``add_done_callback`` runs on the thread that
attaches it, after the call has finished (attaching waits for it). Callbacks may issue further
collectives (PowerSGD's and ZeRO's DDP hooks do); run on the worker, they would be issued in a
different order on each rank. Those hooks therefore lose the overlap; DDP's built-in all-reduce
attaches no Python callback and keeps it.

Imports torch; only the torch backend imports this module.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..core.work import Work


class _Failed:
    """The value of a torch future whose call failed: reading it raises the call's error."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __reduce_ex__(self, protocol: Any) -> Any:
        # torch's C++ side extracts the tensors of a Python value by pickling it.
        raise self.error

    def __repr__(self) -> str:
        return f"<failed: {self.error!r}>"


def _unwrap(value: Any) -> Any:
    if type(value) is _Failed:
        raise value.error
    return value


def timeout_seconds(timeout: datetime.timedelta | None) -> float | None:
    # torch encodes "no timeout" as a zero or negative duration.
    if timeout is None or timeout.total_seconds() <= 0:
        return None
    return timeout.total_seconds()


def _settle(work: Work) -> None:
    """Wait until ``work`` has finished; its error, if any, travels in the future's value."""
    try:
        work.wait()
    except BaseException:
        if not work.is_completed():  # interrupted, not failed: let it through
            raise


class TensorcommFuture(torch.futures.Future[Any]):
    """A torch future over a tensorcomm call; Python callbacks run on the attaching thread."""

    def __init__(self, work: Work | None) -> None:
        super().__init__()
        self._work = work
        self._set_unwrap_func(_unwrap)

    def wait(self) -> Any:
        """Block until the call has finished; return the output tensors or raise its error."""
        if self._work is not None:
            _settle(self._work)  # a point-to-point call completes when someone waits for it
        return super().wait()

    def then(self, callback: Callable[[Any], Any]) -> Any:
        """Run ``callback(self)`` once the call has finished, on this thread; return its future."""
        if self._work is not None:
            _settle(self._work)
        return super().then(callback)

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        """Run ``callback(self)`` once the call has finished, on this thread."""
        if self._work is not None:
            _settle(self._work)
        super().add_done_callback(callback)


Value = Sequence[Any]  # tensors, or lists of tensors (several output lists, as Gloo's)


class TensorcommWork(dist.Work):
    """torch's ``Work`` over a tensorcomm ``Work``; the future's value is ``result``.

    Args:
        work: the pending call, or None for one that had nothing to do.
        result: what the future yields once the call succeeds: the output tensors, or lists of
            them where Gloo's future yields lists of lists (``result()`` then refuses, as Gloo's).
    """

    def __init__(self, work: Work | None, result: Value) -> None:
        super().__init__()
        self._work = work
        self._future = TensorcommFuture(work)
        outputs = self._outputs = list(result)
        if work is None:
            self._future.set_result(outputs)
            return
        future = self._future

        def finish(done: Work) -> None:
            error = done.exception()
            future.set_result(outputs if error is None else _Failed(error))

        work._on_done(finish)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Block until the call has finished; raise its error if it failed.

        Raises:
            CommTimeoutError: not finished within ``timeout`` (the call goes on).
            CommError: the call failed.
        """
        if self._work is not None:
            self._work.wait(timeout_seconds(timeout))
        return True

    def is_completed(self) -> bool:
        """Whether the call has finished, successfully or not."""
        return self._work is None or self._work.is_completed()

    def is_success(self) -> bool:
        """Whether the call has finished without an error."""
        return self._work is None or self._work.is_success()

    def exception(self) -> BaseException | None:
        """The call's error once it has failed, else None."""
        return None if self._work is None else self._work.exception()

    def result(self) -> list[torch.Tensor]:
        """The call's output tensors, once it has finished (waits; raises its error).

        Raises:
            RuntimeError: the value is lists of tensors (Gloo's message: use the future).
        """
        if any(isinstance(item, list) for item in self._outputs):
            raise RuntimeError("work result does not support list of lists, use .getFuture() instead")
        self.wait()
        return list(self._outputs)

    def get_future(self) -> torch.futures.Future[Any]:
        """A future whose value is the list of output tensors (reading it raises a failure)."""
        return self._future
