"""The lowercase collectives on Python objects (``bcast`` ... ``exscan``), over tensorcomm's
object collectives (``frontends.object_collectives``, which pickle and unpickle: **use among
trusted processes only**). Reductions gather the objects and apply the op in rank order.
Imports ``frontends.object_collectives`` and the MPI package's ``op``."""

from __future__ import annotations

from functools import reduce as fold
from typing import Any

from ..core import collectives as core
from ..core.group import Group as TcGroup
from ..frontends import object_collectives as objects
from . import exceptions
from .op import SUM, Op


def _apply(op: Any, values: list[Any]) -> Any:
    """``values[0] op ... op values[-1]`` (``op``: an ``MPI.Op`` or a Python callable)."""
    return fold(lambda x, y: op(x, y), values)


class ObjectCollectives:
    """Mixin of ``Comm``: collectives on objects. ``_tc()`` is the tensorcomm group."""

    def _tc(self) -> TcGroup:
        raise NotImplementedError

    def _root(self, root: Any, fn: str) -> int:
        raise NotImplementedError

    def _all(self, obj: Any) -> list[Any]:
        g = self._tc()
        out: list[Any] = [None] * g.size
        objects.all_gather_object(out, obj, g)
        return out

    def barrier(self) -> None:
        """Wait until every member has called it."""
        core.barrier(self._tc(), False)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        """The root's ``obj``, on every member."""
        g = self._tc()
        r = self._root(root, "bcast")
        box = [obj if g.rank == r else None]
        objects.broadcast_object_list(box, g.ranks[r], g)
        return box[0]

    def gather(self, sendobj: Any, root: int = 0) -> list[Any] | None:
        """Every member's ``sendobj`` in a list on the root (None elsewhere)."""
        g = self._tc()
        r = self._root(root, "gather")
        out: list[Any] | None = [None] * g.size if g.rank == r else None
        objects.gather_object(sendobj, out, g.ranks[r], g)
        return out

    def scatter(self, sendobj: Any, root: int = 0) -> Any:
        """Item ``i`` of the root's sequence, on member ``i``."""
        g = self._tc()
        r = self._root(root, "scatter")
        items = None
        if g.rank == r:
            items = list(sendobj) if sendobj is not None else None
            if items is None or len(items) != g.size:
                raise exceptions.error(exceptions.ERR_COUNT, f"scatter: the root needs a sequence of "
                                       f"{g.size} objects, got {None if items is None else len(items)}")
        box: list[Any] = [None]
        objects.scatter_object_list(box, items, g.ranks[r], g)
        return box[0]

    def allgather(self, sendobj: Any) -> list[Any]:
        """Every member's ``sendobj``, in a list on every member."""
        return self._all(sendobj)

    def alltoall(self, sendobj: Any) -> list[Any]:
        """Item ``j`` of member ``i``'s sequence lands at place ``i`` on member ``j``."""
        g = self._tc()
        items = list(sendobj)
        if len(items) != g.size:
            raise exceptions.error(exceptions.ERR_COUNT, f"alltoall: expected a sequence of {g.size} "
                                   f"objects, got {len(items)}")
        everyone = self._all(items)
        return [everyone[i][g.rank] for i in range(g.size)]

    def reduce(self, sendobj: Any, op: Any = SUM, root: int = 0) -> Any:
        """``op`` over every member's ``sendobj``, in rank order, on the root (None elsewhere)."""
        _check(op, "reduce")
        values = self.gather(sendobj, root)
        return None if values is None else _apply(op, values)

    def allreduce(self, sendobj: Any, op: Any = SUM) -> Any:
        """``op`` over every member's ``sendobj``, in rank order, on every member."""
        _check(op, "allreduce")
        return _apply(op, self._all(sendobj))

    def scan(self, sendobj: Any, op: Any = SUM) -> Any:
        """``op`` over members ``0..rank``' objects."""
        _check(op, "scan")
        values = self._all(sendobj)
        return _apply(op, values[:self._tc().rank + 1])

    def exscan(self, sendobj: Any, op: Any = SUM) -> Any:
        """``op`` over members ``0..rank-1``' objects (None on rank 0)."""
        _check(op, "exscan")
        values = self._all(sendobj)
        rank = self._tc().rank
        return None if rank == 0 else _apply(op, values[:rank])


def _check(op: Any, fn: str) -> None:
    if isinstance(op, Op):
        op._check()
    elif not callable(op):
        raise TypeError(f"{fn}: op must be an MPI.Op or a callable, got {type(op).__name__}")
