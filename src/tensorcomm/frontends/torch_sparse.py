"""Sparse COO tensors in the torch backend's ``allreduce``, as Gloo takes them.

Several tensors per process are summed locally first; the sum across the group
(``frontends/sparse.py``) replaces every tensor's contents, coalesced, on every member. SUM and
AVG; the tensors must share one size and dtype.

When they run. A sparse all-reduce is several core calls, each sized by the one before, so it
cannot be one queued call on the group's worker. Each process group runs its sparse all-reduces
instead, in issue order, on a thread of their own (``SparseRunner``) over a twin of the group
(the same members, made by that thread at the first sparse call: making a group is collective,
and no caller waits for it), so DDP's sparse gradient buckets go on beside backward as the dense
ones do, and their messages never meet the group's own calls. A blocking call waits for its turn
there.

Imports torch; only the torch backend imports this module.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import torch

from ..core.group import Group
from ..core.work import Work
from ..types import ReduceOpLike
from .sparse import sparse_all_reduce


def is_sparse(tensors: object) -> bool:
    """Whether ``tensors`` (a tensor or a list of them) holds a sparse COO tensor."""
    if isinstance(tensors, torch.Tensor):
        return tensors.is_sparse
    return isinstance(tensors, (list, tuple)) and any(
        isinstance(t, torch.Tensor) and t.is_sparse for t in tensors)


def check(tensors: list[torch.Tensor]) -> None:
    """Raise ValueError for dense and sparse tensors mixed, or tensors of different sizes or
    dtypes."""
    what = "tensorcomm backend: sparse allreduce"
    if not all(t.is_sparse for t in tensors):
        raise ValueError(f"{what}: invalid tensor layout: every tensor must be sparse COO, got "
                         f"{[str(t.layout) for t in tensors]}")
    if len({(tuple(t.shape), t.dtype) for t in tensors}) != 1:
        raise ValueError(f"{what}: invalid tensor size or dtype: the tensors must share one, got "
                         f"{[(list(t.shape), str(t.dtype)) for t in tensors]}")


def sparse_allreduce(tensors: list[torch.Tensor], op: ReduceOpLike, group: Group) -> None:
    """Reduce sparse COO ``tensors`` (checked by ``check``) across ``group``, in place.

    Raises:
        ValueError: an op other than SUM/AVG (on every member).
    """
    local = tensors[0].detach()
    for tensor in tensors[1:]:
        local = local + tensor.detach()
    indices, values = sparse_all_reduce(local._indices(), local._values(), tuple(local.shape),
                                        op=op, group=group)
    result = torch.sparse_coo_tensor(torch.from_numpy(indices), values, local.shape,
                                     is_coalesced=True)
    with torch.no_grad():
        for tensor in tensors:
            tensor.copy_(result)


class SparseRunner:
    """Runs one process group's sparse all-reduces in issue order on a thread of its own, over a
    twin of ``group`` that thread makes first (members only, as every sparse call is).

    Args:
        group: the process group's tensorcomm group.
        name: gives the twin's name, the same on every member and unique to the process group
            (read at the first call: torch names its groups after making them).
    """

    def __init__(self, group: Group, name: Callable[[], str]) -> None:
        self._group = group
        self._name = name
        self._calls: queue.SimpleQueue[tuple[Callable[[Group], None], Work] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, tensors: list[torch.Tensor], op: ReduceOpLike, wait: bool) -> Work:
        """Queue ``sparse_allreduce(tensors, op)``; its ``Work`` (waited for when ``wait``).

        Raises:
            ValueError: as ``check``, at once.
        """
        check(tensors)
        if self._thread is None:  # the first sparse call
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"tensorcomm-sparse-{self._group.name}")
            self._thread.start()
        work = Work("sparse all_reduce")
        self._calls.put((lambda twin: sparse_allreduce(tensors, op, twin), work))
        if wait:
            work.wait()
        return work

    def _run(self) -> None:
        twin: Group | None = None
        while (item := self._calls.get()) is not None:
            call, work = item
            try:
                if twin is None:
                    twin = self._twin()
                call(twin)
            except BaseException as exc:  # noqa: BLE001 - the call's error, raised by its Work
                work._complete(error=exc)
            else:
                work._complete()

    def _twin(self) -> Group:
        """The twin group, made now, or kept from an earlier process group of the same name in
        the same world (torch may reuse a name after ``destroy_process_group``)."""
        world, name = self._group._world, self._name()
        try:
            return world.named_group(name)
        except ValueError:
            return world.new_group(self._group.ranks, name)

    def close(self) -> None:
        """Let the thread end once the calls queued so far have run."""
        if self._thread is not None:
            self._calls.put(None)
