"""``Prequest``: a collective call made persistent, as MPI 4's ``MPI_Allreduce_init`` makes one.

A persistent call is checked and planned once, when every member creates it (itself a collective:
the members check that they create the same call), and bound to its arrays; then it runs many
times, each run an ordinary call of its group (a step of the group's issue order, with its mismatch
check, failure handling, flight record and trace) that skips the argument checks and the plan
lookup. Each run is its ``core.bound.Bound``'s, made with the request. ``start()`` posts this
rank's part of a run at once and returns, as ``MPI_Start`` does, where the call starts with one
round on shared memory (the small calls), and finishes it there if every peer's part is in; its
rest runs when this thread waits for it (``wait``) or makes its next call on the group (or on the
group's worker after ``engine.DEFER_SECONDS`` where the peers may need more of it: all_to_all), so
work placed between the two overlaps the peers' arrival. Any other run is issued and deferred: it
goes ahead when this thread waits or makes its next call on the group, as MPICH progresses a
started request inside the next MPI call, or else on the group's worker thread after
``engine.DEFER_SECONDS``, so a program that waits on something else first cannot hang. Calling the
request runs it at once (``start()`` then ``wait()`` in one blocking call).

The arrays are the caller's (the run reads and writes them where they lie: values written into
them between runs are the ones used); the frontend's ``Binding`` checks before each run that
they are still the arrays the request was made with (same memory, shape and dtype), copies
arrays it had to stage into their contiguous buffers, and writes results back after a run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ..algorithms.base import Plan
from .bound import Bound
from .group import inside
from .work import Work

if TYPE_CHECKING:
    from .group import Group


class Binding(NamedTuple):
    """What a frontend adds to a persistent call: its hold on the caller's arrays.

    Attributes:
        check: before each run: raise ``ValueError`` if an array is no longer the one the call
            was made with; copy staged inputs into the buffers the call reads. None: nothing to do.
        commit: after each run that succeeded: write results into the caller's staged outputs.
            None: the call writes the caller's arrays themselves.
    """

    check: Callable[[], None] | None
    commit: Callable[[], None] | None


class Prequest:
    """A persistent collective call: made once by every member (``tensorcomm.all_reduce_init``
    and its kin), then run any number of times, bound to the arrays it was made with.

    ``start()`` begins a run and returns at once; ``wait()`` returns once it has finished
    (raising its error if it failed); ``is_completed()`` tells without waiting. Calling the
    request, ``request()``, runs it and returns once it has finished. Named after mpi4py's
    persistent request (``Comm.Allreduce_init`` returns a ``Prequest``); ``wait`` and
    ``is_completed`` are ``tensorcomm.Work``'s. A request belongs to its group: once the group is
    destroyed, aborted or has failed, starting it raises that error; ``free()`` lets go of it
    sooner.

    Attributes:
        algorithm: the row of docs/algorithms.md that runs it, chosen when it was made.
        transport: what carries it (as ``Work.transport``).
    """

    __slots__ = ("_group", "_plan", "_check", "_commit", "_bound", "_pending", "_label",
                 "algorithm", "transport", "__weakref__")

    def __init__(self, group: Group, plan: Plan, args: tuple[Any, ...], binding: Binding | None,
                 transport: str) -> None:
        self._group = group
        self._plan = plan
        self._label = plan.label
        self._check: Callable[[], None] | None = None if binding is None else binding.check
        self._commit: Callable[[], None] | None = None if binding is None else binding.commit
        self._bound: Bound | None = Bound(group, plan, args)  # None once freed
        self._pending: Work | Bound | None = None  # the started run: queued (Work) or posted (Bound)
        self.algorithm = plan.algorithm
        self.transport = transport
        inside(group).requests.add(self)

    def __call__(self) -> None:
        """Run the call now and return once it has finished (``start()`` then ``wait()``).

        Raises:
            ValueError: a run started earlier was not waited for, the request was freed, or an
                array it is bound to is not the one it was made with any more.
            CommError: the run failed, as the ordinary call would (the group then ends on every
                member); or the group was destroyed, aborted or failed earlier.
        """
        bound = self._bound
        if bound is None or self._pending is not None:
            raise self._refused()
        check = self._check
        if check is not None:
            check()
        if not bound.run_round():
            bound.run_ordinary()
        commit = self._commit
        if commit is not None:
            commit()

    def start(self) -> None:
        """Begin a run and return at once: this rank's part is posted now where the call is one
        round on shared memory, the rest runs when this thread waits for it or makes its next call
        on the group (or, for other calls, on the group's worker thread soon after).

        Raises:
            ValueError: the previous run was not waited for, the request was freed, or an array
                it is bound to is not the one it was made with any more.
            CommError: the group was destroyed, aborted or failed earlier.
        """
        bound = self._bound
        if bound is None or self._pending is not None:
            raise self._refused()
        if self._check is not None:
            self._check()
        if bound.post():
            self._pending = bound
            return
        work = bound.queue()
        work.algorithm, work.transport = self.algorithm, self.transport
        if self._commit is not None:
            work._after(self._commit)
        self._pending = work

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the started run has finished (at once if none is started); return True.

        Args:
            timeout: seconds to wait; None waits as long as the group's own timeout allows.

        Raises:
            CommTimeoutError: not finished within ``timeout`` (the run stays started: wait again).
            CommError: the run failed (its error is re-raised).
        """
        work = self._pending
        if work is None:
            return True
        if isinstance(work, Bound):
            try:
                work.wait(timeout)
            except BaseException:
                if not work.parked:
                    self._pending = None
                raise
            self._pending = None
            if self._commit is not None:
                self._commit()
            return True
        if timeout is not None:
            inside(self._group).engine.kick()  # the worker runs it: this thread waits at most timeout
        try:
            work.wait(timeout)
        except BaseException:
            if work.is_completed():
                self._pending = None
            raise
        self._pending = None
        return True

    def is_completed(self) -> bool:
        """Whether the started run has finished (True if none is started), without waiting."""
        work = self._pending
        return work is None or (work.test() if isinstance(work, Bound) else work.is_completed())

    def free(self) -> None:
        """Let go of the request and its arrays (``MPI_Request_free``); later runs raise
        ``ValueError``. Not collective.

        Raises:
            ValueError: a started run was not waited for.
        """
        if self._pending is not None:
            raise self._refused()
        self._check = self._commit = self._bound = None
        inside(self._group).requests.discard(self)

    def drop(self) -> None:
        """Let go of what the request holds of its group's shared memory (the group stops, or
        the process was forked): its bound round and its plan's state (views of the domain's
        memory, which cannot close under them); later runs take the ordinary path, which
        refuses them."""
        if self._bound is not None:
            self._bound.drop()
        self._plan.state = None

    def _refused(self) -> ValueError:
        if self._bound is None:
            return ValueError(f"{self._label}: this persistent request was freed; make a new one")
        return ValueError(f"{self._label}: the run started earlier was not waited for; call wait() "
                          "before starting it again")

    def __repr__(self) -> str:
        state = "freed" if self._bound is None else "started" if self._pending is not None else "idle"
        return f"<Prequest {self._label} {state}>"
