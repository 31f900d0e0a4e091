"""The buffer collectives of a communicator (``Bcast`` ... ``Exscan``), their nonblocking
``I`` forms and persistent ``_init`` forms, over ``core.collectives``.

Each collective is written once, as ``_name(..., nonblocking) -> Pending``: the message
specifications become numpy views of the callers' memory (``buffers.py``), the core call runs
on them (moved as bytes where nothing is reduced, so any datatype moves), and the ``Pending``
does what is left once it is done. The blocking form finishes it at once; the ``I`` form returns
it in a ``Request``; the ``_init`` form makes a ``Prequest`` that runs it again at every
``Start``. A reduction runs inside tensorcomm when the op and dtype are one of its own
(``Op.native``); any other (``MAXLOC``, a logical op on numbers, ``PROD`` on complex numbers,
``Op.Create``) gathers the members' data and reduces it in rank order on each rank that needs
the result, as MPI orders a non-commutative op. Imports ``core`` and the MPI package's
``buffers``, ``op``, ``request`` and ``exceptions``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core import collectives as core
from ..core.group import Group as TcGroup
from ..errors import CommError
from . import exceptions
from .buffers import IN_PLACE, Message, Vector, message, vector
from .datatype import Datatype
from .op import SUM, Op
from .request import Pending, Prequest, Request, WorkPending

_U8 = np.dtype(np.uint8)
_ndarray = np.ndarray
_I64 = np.dtype(np.int64)


def _bytes(array: np.ndarray) -> np.ndarray:
    return array.view(_U8)


def _fold(op: Op, blocks: Sequence[np.ndarray], out: np.ndarray, datatype: Datatype) -> None:
    """``out = blocks[0] op blocks[1] op ... op blocks[-1]``, the MPI order."""
    acc = np.array(blocks[-1], copy=True)
    for block in reversed(blocks[:-1]):
        op.reduce_arrays(block, acc, datatype)
    out[...] = acc


def _standard(counts: Sequence[int], displs: Sequence[int]) -> bool:
    """Whether the blocks lie back to back from displacement 0."""
    at = 0
    for count, displ in zip(counts, displs, strict=True):
        if displ != at:
            return False
        at += count
    return True


class Collectives:
    """Mixin of ``Comm``: the buffer collectives. ``_tc()`` is the tensorcomm group, ``_me()``
    this process's rank in it."""

    def _tc(self) -> TcGroup:
        raise NotImplementedError

    def _root(self, root: Any, fn: str) -> int:
        raise NotImplementedError

    def _live(self) -> TcGroup | None:
        """The tensorcomm group when it is made already (None: resolve it the long way)."""
        raise NotImplementedError

    # -- the collectives, once each -------------------------------------------------------------

    def _barrier(self, nonblocking: bool) -> Pending:
        return WorkPending(core.barrier(self._tc(), nonblocking))

    def _bcast(self, buf: Any, root: Any, nonblocking: bool) -> Pending:
        g = self._tc()
        r = self._root(root, "Bcast")
        msg = message(buf, "Bcast", r != g.rank)
        data = _bytes(msg.array)
        if data.size == 0:
            return WorkPending(core.barrier(g, nonblocking))
        return WorkPending(core.broadcast(g, data, r, nonblocking))

    def _reduce_inputs(self, sendbuf: Any, recvbuf: Any, fn: str,
                       receives: bool) -> tuple[Message, Message | None]:
        """(what this rank contributes, where the result goes on this rank)."""
        if sendbuf is IN_PLACE or (sendbuf is None and receives):
            if not receives:
                raise exceptions.error(exceptions.ERR_BUFFER, f"{fn}: IN_PLACE is for the root only")
            both = message(recvbuf, fn, True)
            return both, both
        send = message(sendbuf, fn, False)
        recv = message(recvbuf, fn, True) if receives else None
        if recv is not None and recv.array.nbytes < send.array.nbytes:
            raise exceptions.error(exceptions.ERR_TRUNCATE, f"{fn}: recvbuf holds {recv.length} x "
                                   f"{recv.datatype.name}, sendbuf {send.length} x {send.datatype.name}")
        return send, recv

    def _gathered(self, send: np.ndarray, nonblocking: bool,
                  then: Callable[[list[np.ndarray]], None]) -> Pending:
        """All-gather every member's ``send`` and hand the blocks, in rank order, to ``then``."""
        g = self._tc()
        n = g.size
        raw = _bytes(send)
        out = np.empty(raw.size * n, _U8)
        work = core.all_gather(g, raw, out, [raw.size] * n, nonblocking) if raw.size else None
        blocks = [out[i * raw.size:(i + 1) * raw.size].view(send.dtype) for i in range(n)]
        return WorkPending(work, lambda: then(blocks))

    def _allreduce(self, sendbuf: Any, recvbuf: Any, op: Op, nonblocking: bool,
                   fn: str = "Allreduce") -> Pending:
        g = self._tc()
        send, recv = self._reduce_inputs(sendbuf, recvbuf, fn, True)
        assert recv is not None
        x = recv.array[:send.array.size]
        native = op.native(x.dtype)
        if native is not None:
            if send is not recv:
                x[...] = send.array
            if x.size == 0:
                return WorkPending(None)
            return WorkPending(core.all_reduce(g, x, native, nonblocking, fn))
        op._check()
        own = np.array(send.array, copy=True)
        return self._gathered(own, nonblocking, lambda blocks: _fold(op, blocks, x, recv.datatype))

    def _reduce(self, sendbuf: Any, recvbuf: Any, op: Op, root: Any, nonblocking: bool) -> Pending:
        g = self._tc()
        r = self._root(root, "Reduce")
        mine = g.rank == r
        send, recv = self._reduce_inputs(sendbuf, recvbuf, "Reduce", mine)
        native = op.native(send.array.dtype)
        if native is not None:
            if send.array.size == 0:
                return WorkPending(core.barrier(g, nonblocking))
            if not mine:
                return WorkPending(core.reduce(g, send.array, r, native, nonblocking))
            assert recv is not None
            x = recv.array[:send.array.size]
            if send is not recv:
                x[...] = send.array
            return WorkPending(core.reduce(g, x, r, native, nonblocking))
        op._check()
        own = np.array(send.array, copy=True)
        if not mine:
            return self._gathered(own, nonblocking, lambda blocks: None)
        assert recv is not None
        target = recv.array[:send.array.size]
        return self._gathered(own, nonblocking, lambda blocks: _fold(op, blocks, target, recv.datatype))

    def _scan(self, sendbuf: Any, recvbuf: Any, op: Op, inclusive: bool, nonblocking: bool) -> Pending:
        fn = "Scan" if inclusive else "Exscan"
        g = self._tc()
        send, recv = self._reduce_inputs(sendbuf, recvbuf, fn, True)
        assert recv is not None
        x = recv.array[:send.array.size]
        native = op.native(x.dtype)
        if native is not None:
            if send is not recv:
                x[...] = send.array
            if x.size == 0:
                return WorkPending(core.barrier(g, nonblocking))
            return WorkPending(core.scan(g, x, native, inclusive, nonblocking, fn.lower()))
        op._check()
        me = g.rank
        own = np.array(send.array, copy=True)

        def prefix(blocks: list[np.ndarray]) -> None:
            upto = me + 1 if inclusive else me
            if upto > 0:
                _fold(op, blocks[:upto], x, recv.datatype)
        return self._gathered(own, nonblocking, prefix)

    def _reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int] | None, op: Op,
                        nonblocking: bool, fn: str) -> Pending:
        g = self._tc()
        n, me = g.size, g.rank
        in_place = sendbuf is IN_PLACE or sendbuf is None
        recv = message(recvbuf, fn, True)
        per = recv.datatype.count
        if fn == "Reduce_scatter_block":
            counts = [recv.length // n if in_place else recv.length] * n
        elif recvcounts is None:  # as mpi4py: every member's receive count, gathered
            mine = np.array([recv.length // n if in_place else recv.length], _I64)
            gathered = np.empty(n, _I64)
            core.all_gather(g, mine, gathered, [1] * n, False)
            counts = [int(c) for c in gathered]
        else:
            counts = [int(c) for c in recvcounts]
        if len(counts) != n:
            raise exceptions.error(exceptions.ERR_COUNT, f"{fn}: expected {n} recvcounts, got {len(counts)}")
        elements = [c * per for c in counts]
        total = sum(elements)
        if in_place:
            send = np.array(recv.array[:total], copy=True)
        else:
            send = message(sendbuf, fn, False).array[:total]
        out = recv.array[:elements[me]]
        if send.size < total or out.size < elements[me]:
            raise exceptions.error(exceptions.ERR_COUNT, f"{fn}: the buffers hold fewer elements than "
                                   f"the counts {counts} say")
        if not in_place and np.may_share_memory(send, out):
            send = send.copy()
        native = op.native(out.dtype)
        if native is not None:
            if total == 0:
                return WorkPending(core.barrier(g, nonblocking))
            return WorkPending(core.reduce_scatter(g, send, out, elements, native, nonblocking, fn))
        op._check()
        start = sum(elements[:me])
        own = np.array(send, copy=True)
        return self._gathered(own, nonblocking, lambda blocks: _fold(
            op, [b[start:start + elements[me]] for b in blocks], out, recv.datatype))

    def _agreed_counts(self, counts: Sequence[int] | None, root: int) -> list[int]:
        """The root's per-member byte counts, on every member (a broadcast from the root)."""
        g = self._tc()
        known = np.zeros(g.size, _I64) if counts is None else np.array(counts, _I64)
        core.broadcast(g, known, root, False)
        return [int(c) for c in known]

    def _gather(self, sendbuf: Any, recvbuf: Any, root: Any, nonblocking: bool, uneven: bool) -> Pending:
        fn = "Gatherv" if uneven else "Gather"
        g = self._tc()
        r = self._root(root, fn)
        n, me = g.size, g.rank
        mine = me == r
        recv: Vector | None = vector(recvbuf, n, fn, True) if mine else None
        if sendbuf is IN_PLACE or (sendbuf is None and recv is not None):
            if recv is None:
                raise exceptions.error(exceptions.ERR_BUFFER, f"{fn}: IN_PLACE is for the root only")
            per = recv.datatype.count
            send = recv.array[recv.displs[me] * per:(recv.displs[me] + recv.counts[me]) * per].copy()
        else:
            send = message(sendbuf, fn, False).array
        raw = _bytes(send)
        if recv is not None:
            width = recv.array.itemsize * recv.datatype.count
            counts = [c * width for c in recv.counts]
            if counts[me] != raw.size:
                raise exceptions.error(exceptions.ERR_TRUNCATE, f"{fn}: the root's block holds "
                                       f"{counts[me]} bytes and its sendbuf {raw.size}")
        else:
            counts = None
        if uneven:
            counts = self._agreed_counts(counts, r)
        elif counts is None:
            counts = [raw.size] * n
        if sum(counts) == 0:
            return WorkPending(core.barrier(g, nonblocking))
        if recv is None:
            return WorkPending(core.gather(g, raw, None, counts, r, nonblocking))
        width = recv.array.itemsize * recv.datatype.count
        flat = _bytes(recv.array)
        displs = [d * width for d in recv.displs]
        if _standard(counts, displs):
            return WorkPending(core.gather(g, raw, flat[:sum(counts)], counts, r, nonblocking))
        scratch = np.empty(sum(counts), _U8)

        def place() -> None:
            at = 0
            for count, displ in zip(counts, displs, strict=True):
                flat[displ:displ + count] = scratch[at:at + count]
                at += count
        return WorkPending(core.gather(g, raw, scratch, counts, r, nonblocking), place)

    def _scatter(self, sendbuf: Any, recvbuf: Any, root: Any, nonblocking: bool, uneven: bool) -> Pending:
        fn = "Scatterv" if uneven else "Scatter"
        g = self._tc()
        r = self._root(root, fn)
        n, me = g.size, g.rank
        mine = me == r
        send: Vector | None = vector(sendbuf, n, fn, False) if mine else None
        if recvbuf is IN_PLACE or (recvbuf is None and send is not None):
            if send is None:
                raise exceptions.error(exceptions.ERR_BUFFER, f"{fn}: IN_PLACE is for the root only")
            out = np.empty(0, _U8)
            in_place = True
        else:
            out = _bytes(message(recvbuf, fn, True).array)
            in_place = False
        counts: list[int] | None = None
        flat = displs = None
        if send is not None:
            width = send.array.itemsize * send.datatype.count
            counts = [c * width for c in send.counts]
            displs = [d * width for d in send.displs]
            flat = _bytes(send.array)
            if in_place:
                out = flat[displs[me]:displs[me] + counts[me]].copy()
        if uneven:
            counts = self._agreed_counts(counts, r)
        elif counts is None:
            counts = [out.size] * n
        target = out[:counts[me]]
        if target.size < counts[me]:
            raise exceptions.error(exceptions.ERR_TRUNCATE, f"{fn}: a block of {counts[me]} bytes does "
                                   f"not fit the {out.size}-byte recvbuf")
        if sum(counts) == 0:
            return WorkPending(core.barrier(g, nonblocking))
        data = None
        if flat is not None and displs is not None:
            data = flat[:sum(counts)] if _standard(counts, displs) else \
                np.concatenate([flat[d:d + c] for c, d in zip(counts, displs, strict=True)])
        return WorkPending(core.scatter(g, data, target if not in_place else out, counts, r, nonblocking))

    def _allgather(self, sendbuf: Any, recvbuf: Any, nonblocking: bool, uneven: bool) -> Pending:
        fn = "Allgatherv" if uneven else "Allgather"
        g = self._tc()
        n, me = g.size, g.rank
        recv = vector(recvbuf, n, fn, True)
        width = recv.array.itemsize * recv.datatype.count
        counts = [c * width for c in recv.counts]
        displs = [d * width for d in recv.displs]
        flat = _bytes(recv.array)
        if sendbuf is IN_PLACE or sendbuf is None:
            raw = flat[displs[me]:displs[me] + counts[me]].copy()
        else:
            raw = _bytes(message(sendbuf, fn, False).array)
        if raw.size != counts[me]:
            raise exceptions.error(exceptions.ERR_TRUNCATE, f"{fn}: this rank's block holds "
                                   f"{counts[me]} bytes and its sendbuf {raw.size}")
        if sum(counts) == 0:
            return WorkPending(core.barrier(g, nonblocking))
        if _standard(counts, displs):
            return WorkPending(core.all_gather(g, raw, flat[:sum(counts)], counts, nonblocking))
        scratch = np.empty(sum(counts), _U8)

        def place() -> None:
            at = 0
            for count, displ in zip(counts, displs, strict=True):
                flat[displ:displ + count] = scratch[at:at + count]
                at += count
        return WorkPending(core.all_gather(g, raw, scratch, counts, nonblocking), place)

    def _alltoall(self, sendbuf: Any, recvbuf: Any, nonblocking: bool, uneven: bool) -> Pending:
        fn = "Alltoallv" if uneven else "Alltoall"
        g = self._tc()
        n = g.size
        recv = vector(recvbuf, n, fn, True)
        rwidth = recv.array.itemsize * recv.datatype.count
        rcounts = [c * rwidth for c in recv.counts]
        rdispls = [d * rwidth for d in recv.displs]
        rflat = _bytes(recv.array)
        if sendbuf is IN_PLACE or sendbuf is None:
            scounts, sdispls, sflat = rcounts, rdispls, rflat.copy()
        else:
            send = vector(sendbuf, n, fn, False)
            swidth = send.array.itemsize * send.datatype.count
            scounts = [c * swidth for c in send.counts]
            sdispls = [d * swidth for d in send.displs]
            sflat = _bytes(send.array)
        data = sflat[:sum(scounts)] if _standard(scounts, sdispls) else \
            np.concatenate([sflat[d:d + c] for c, d in zip(scounts, sdispls, strict=True)]
                           or [np.empty(0, _U8)])
        if _standard(rcounts, rdispls):
            return WorkPending(core.all_to_all(g, data, scounts, rflat[:sum(rcounts)], rcounts, nonblocking))
        scratch = np.empty(sum(rcounts), _U8)

        def place() -> None:
            at = 0
            for count, displ in zip(rcounts, rdispls, strict=True):
                rflat[displ:displ + count] = scratch[at:at + count]
                at += count
        return WorkPending(core.all_to_all(g, data, scounts, scratch, rcounts, nonblocking), place)

    # -- the public forms: blocking, nonblocking (I...) and persistent (..._init) ----------------

    def Barrier(self) -> None:
        """Wait until every member has called it."""
        self._barrier(False).finish()

    def Ibarrier(self) -> Request:
        """Nonblocking ``Barrier``."""
        return _request(self._barrier(True))

    def Barrier_init(self, info: Any = None) -> Prequest:
        """Persistent ``Barrier``."""
        return Prequest._made(lambda: self._barrier(True))

    def Bcast(self, buf: Any, root: int = 0) -> None:
        """Copy the root's ``buf`` into every member's."""
        self._bcast(buf, root, False).finish()

    def Ibcast(self, buf: Any, root: int = 0) -> Request:
        """Nonblocking ``Bcast``."""
        return _request(self._bcast(buf, root, True))

    def Bcast_init(self, buf: Any, root: int = 0, info: Any = None) -> Prequest:
        """Persistent ``Bcast``."""
        return Prequest._made(lambda: self._bcast(buf, root, True))

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, root: int = 0) -> None:
        """Reduce every member's ``sendbuf`` into the root's ``recvbuf``."""
        self._reduce(sendbuf, recvbuf, op, root, False).finish()

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, root: int = 0) -> Request:
        """Nonblocking ``Reduce``."""
        return _request(self._reduce(sendbuf, recvbuf, op, root, True))

    def Reduce_init(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, root: int = 0,
                    info: Any = None) -> Prequest:
        """Persistent ``Reduce``."""
        return Prequest._made(lambda: self._reduce(sendbuf, recvbuf, op, root, True))

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:
        """Reduce every member's ``sendbuf`` into every member's ``recvbuf``."""
        try:
            g = self._live()
            if g is not None and type(recvbuf) is _ndarray and recvbuf.flags.carray and recvbuf.size:
                # the common call, as ``_allreduce`` would run it, without its message objects
                native = op.native(recvbuf.dtype)
                if native is not None:
                    if sendbuf is IN_PLACE:
                        core.all_reduce(g, recvbuf, native, False, "Allreduce")
                        return
                    if type(sendbuf) is _ndarray and sendbuf.shape == recvbuf.shape \
                            and sendbuf.dtype == recvbuf.dtype:
                        np.copyto(recvbuf, sendbuf)
                        core.all_reduce(g, recvbuf, native, False, "Allreduce")
                        return
            self._allreduce(sendbuf, recvbuf, op, False).finish()
        except CommError as exc:
            raise exceptions.as_mpi(exc) from None

    Allreduce._translates = True  # type: ignore[attr-defined]

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> Request:
        """Nonblocking ``Allreduce``."""
        return _request(self._allreduce(sendbuf, recvbuf, op, True))

    def Allreduce_init(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, info: Any = None) -> Prequest:
        """Persistent ``Allreduce``."""
        return Prequest._made(lambda: self._allreduce(sendbuf, recvbuf, op, True))

    def Scan(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:
        """Inclusive prefix reduction in rank order."""
        self._scan(sendbuf, recvbuf, op, True, False).finish()

    def Iscan(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> Request:
        """Nonblocking ``Scan``."""
        return _request(self._scan(sendbuf, recvbuf, op, True, True))

    def Scan_init(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, info: Any = None) -> Prequest:
        """Persistent ``Scan``."""
        return Prequest._made(lambda: self._scan(sendbuf, recvbuf, op, True, True))

    def Exscan(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:
        """Exclusive prefix reduction (rank 0's ``recvbuf`` is left as it is)."""
        self._scan(sendbuf, recvbuf, op, False, False).finish()

    def Iexscan(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> Request:
        """Nonblocking ``Exscan``."""
        return _request(self._scan(sendbuf, recvbuf, op, False, True))

    def Exscan_init(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, info: Any = None) -> Prequest:
        """Persistent ``Exscan``."""
        return Prequest._made(lambda: self._scan(sendbuf, recvbuf, op, False, True))

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:
        """Reduce, then block ``i`` of the result to member ``i``."""
        self._reduce_scatter(sendbuf, recvbuf, None, op, False, "Reduce_scatter_block").finish()

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> Request:
        """Nonblocking ``Reduce_scatter_block``."""
        return _request(self._reduce_scatter(sendbuf, recvbuf, None, op, True, "Reduce_scatter_block"))

    def Reduce_scatter_block_init(self, sendbuf: Any, recvbuf: Any, op: Op = SUM,
                                  info: Any = None) -> Prequest:
        """Persistent ``Reduce_scatter_block``."""
        return Prequest._made(lambda: self._reduce_scatter(sendbuf, recvbuf, None, op, True,
                                                           "Reduce_scatter_block"))

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int] | None = None,
                       op: Op = SUM) -> None:
        """Reduce, then ``recvcounts[i]`` elements of the result to member ``i``."""
        self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, False, "Reduce_scatter").finish()

    def Ireduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int] | None = None,
                        op: Op = SUM) -> Request:
        """Nonblocking ``Reduce_scatter``."""
        return _request(self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, True, "Reduce_scatter"))

    def Reduce_scatter_init(self, sendbuf: Any, recvbuf: Any, recvcounts: Sequence[int] | None = None,
                            op: Op = SUM, info: Any = None) -> Prequest:
        """Persistent ``Reduce_scatter``."""
        return Prequest._made(lambda: self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, True,
                                                           "Reduce_scatter"))

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """Every member's ``sendbuf`` into its block of the root's ``recvbuf``."""
        self._gather(sendbuf, recvbuf, root, False, False).finish()

    def Igather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        """Nonblocking ``Gather``."""
        return _request(self._gather(sendbuf, recvbuf, root, True, False))

    def Gather_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: Any = None) -> Prequest:
        """Persistent ``Gather``."""
        return Prequest._made(lambda: self._gather(sendbuf, recvbuf, root, True, False))

    def Gatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """``Gather`` with per-member counts and displacements."""
        self._gather(sendbuf, recvbuf, root, False, True).finish()

    def Igatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        """Nonblocking ``Gatherv``."""
        return _request(self._gather(sendbuf, recvbuf, root, True, True))

    def Gatherv_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: Any = None) -> Prequest:
        """Persistent ``Gatherv``."""
        return Prequest._made(lambda: self._gather(sendbuf, recvbuf, root, True, True))

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """Block ``i`` of the root's ``sendbuf`` into member ``i``'s ``recvbuf``."""
        self._scatter(sendbuf, recvbuf, root, False, False).finish()

    def Iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        """Nonblocking ``Scatter``."""
        return _request(self._scatter(sendbuf, recvbuf, root, True, False))

    def Scatter_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: Any = None) -> Prequest:
        """Persistent ``Scatter``."""
        return Prequest._made(lambda: self._scatter(sendbuf, recvbuf, root, True, False))

    def Scatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """``Scatter`` with per-member counts and displacements."""
        self._scatter(sendbuf, recvbuf, root, False, True).finish()

    def Iscatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:
        """Nonblocking ``Scatterv``."""
        return _request(self._scatter(sendbuf, recvbuf, root, True, True))

    def Scatterv_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: Any = None) -> Prequest:
        """Persistent ``Scatterv``."""
        return Prequest._made(lambda: self._scatter(sendbuf, recvbuf, root, True, True))

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        """Every member's ``sendbuf`` into its block of every member's ``recvbuf``."""
        self._allgather(sendbuf, recvbuf, False, False).finish()

    def Iallgather(self, sendbuf: Any, recvbuf: Any) -> Request:
        """Nonblocking ``Allgather``."""
        return _request(self._allgather(sendbuf, recvbuf, True, False))

    def Allgather_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Prequest:
        """Persistent ``Allgather``."""
        return Prequest._made(lambda: self._allgather(sendbuf, recvbuf, True, False))

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:
        """``Allgather`` with per-member counts and displacements."""
        self._allgather(sendbuf, recvbuf, False, True).finish()

    def Iallgatherv(self, sendbuf: Any, recvbuf: Any) -> Request:
        """Nonblocking ``Allgatherv``."""
        return _request(self._allgather(sendbuf, recvbuf, True, True))

    def Allgatherv_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Prequest:
        """Persistent ``Allgatherv``."""
        return Prequest._made(lambda: self._allgather(sendbuf, recvbuf, True, True))

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        """Block ``j`` of member ``i``'s ``sendbuf`` into block ``i`` of member ``j``'s ``recvbuf``."""
        self._alltoall(sendbuf, recvbuf, False, False).finish()

    def Ialltoall(self, sendbuf: Any, recvbuf: Any) -> Request:
        """Nonblocking ``Alltoall``."""
        return _request(self._alltoall(sendbuf, recvbuf, True, False))

    def Alltoall_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Prequest:
        """Persistent ``Alltoall``."""
        return Prequest._made(lambda: self._alltoall(sendbuf, recvbuf, True, False))

    def Alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:
        """``Alltoall`` with per-member counts and displacements."""
        self._alltoall(sendbuf, recvbuf, False, True).finish()

    def Ialltoallv(self, sendbuf: Any, recvbuf: Any) -> Request:
        """Nonblocking ``Alltoallv``."""
        return _request(self._alltoall(sendbuf, recvbuf, True, True))

    def Alltoallv_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Prequest:
        """Persistent ``Alltoallv``."""
        return Prequest._made(lambda: self._alltoall(sendbuf, recvbuf, True, True))

    def Alltoallw(self, *args: Any) -> None:
        """Not offered: raises NotImplementedError."""
        raise NotImplementedError("Comm.Alltoallw: per-block datatypes are not offered by "
                                  "tensorcomm.MPI; see docs/mpi.md")


def _request(pending: Pending) -> Request:
    request = Request()
    request._pending = pending
    return request
