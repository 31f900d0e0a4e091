"""``ProcessGroupTensorcomm``: torch.distributed's ProcessGroup interface over tensorcomm.

torch calls these methods with lists of tensors and an options object; each one translates
ranks (torch passes group ranks, tensorcomm's functions take global ones) and reduction ops, then
calls tensorcomm's own functional collective on the tensors themselves, which enter through
the torch adapter (zero-copy for contiguous CPU tensors).

Collectives complete before they return, also for ``async_op=True``: the returned ``Work`` holds
an already-completed future. That is deliberate. DDP reads every gradient bucket's result
through the Work's future, and a future completed with an exception during backward takes the
process down (torch 2.13 exits with SIGSEGV); running the call inline raises the error at the
call instead, where DDP turns it into an ordinary exception from ``backward()``. Point-to-point
calls stay asynchronous (a blocking send before the matching receive is posted would deadlock);
their errors are raised by ``Work.wait``.

Imports torch; only ``tensorcomm.torch`` imports this module.
"""

from __future__ import annotations

import datetime
from typing import Any, Sequence

import torch
import torch.distributed as dist

from ..core.group import Group
from ..core.work import Work
from ..types import ReduceOp, ReduceOpLike
from . import functional as F

BACKEND_NAME = "tensorcomm"

_OPS = {
    dist.ReduceOp.RedOpType.SUM: ReduceOp.SUM, dist.ReduceOp.RedOpType.AVG: ReduceOp.AVG,
    dist.ReduceOp.RedOpType.PRODUCT: ReduceOp.PROD, dist.ReduceOp.RedOpType.MIN: ReduceOp.MIN,
    dist.ReduceOp.RedOpType.MAX: ReduceOp.MAX, dist.ReduceOp.RedOpType.BAND: ReduceOp.BAND,
    dist.ReduceOp.RedOpType.BOR: ReduceOp.BOR, dist.ReduceOp.RedOpType.BXOR: ReduceOp.BXOR,
}


def _reduce_op(op: Any) -> ReduceOpLike:
    kind = op.op
    if kind == dist.ReduceOp.RedOpType.PREMUL_SUM:
        factor = op.factor
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        return ReduceOp.premul_sum(float(factor))
    return _OPS[kind]


def _one(tensors: Sequence[torch.Tensor], what: str) -> torch.Tensor:
    # torch >= 2.0 passes one tensor per call; lists of several came from multi-GPU-per-process
    # use, which a CPU backend has no reason to support.
    if len(tensors) != 1:
        raise ValueError(f"tensorcomm backend: {what} takes exactly one tensor per process, "
                         f"got {len(tensors)}")
    return tensors[0]


def _seconds(timeout: datetime.timedelta | None) -> float | None:
    # torch encodes "no timeout" as a zero or negative duration.
    if timeout is None or timeout.total_seconds() <= 0:
        return None
    return timeout.total_seconds()


class TensorcommWork(dist._Work):
    """A torch ``Work`` over a finished collective or a pending tensorcomm point-to-point call."""

    def __init__(self, result: list[torch.Tensor], pending: Work | None = None) -> None:
        super().__init__()
        self._pending = pending
        self._future: torch.futures.Future = torch.futures.Future()
        if pending is None:
            self._future.set_result(result)
        else:
            pending.after(lambda: self._future.set_result(result))

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Block until done; re-raise the call's error (point-to-point calls only can fail here)."""
        if self._pending is not None:
            self._pending.wait(_seconds(timeout))
        return True

    def is_completed(self) -> bool:
        """Whether the call has finished."""
        return self._pending is None or self._pending.is_completed()

    def get_future(self) -> torch.futures.Future:
        """A future whose value is the list of output tensors."""
        return self._future


def _done(outputs: list[torch.Tensor]) -> TensorcommWork:
    return TensorcommWork(outputs)


class ProcessGroupTensorcomm(dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on a tensorcomm ``Group``.

    Args:
        group: the tensorcomm group with the same members, in the same rank order.
        on_shutdown: called once by ``shutdown``/``abort`` (ends the tensorcomm world when this
            process group created it).
    """

    def __init__(self, group: Group, on_shutdown: Any = None) -> None:
        super().__init__(group.rank, group.size)
        self._group = group
        self._on_shutdown = on_shutdown

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        """``"tensorcomm"``."""
        return BACKEND_NAME

    def _global(self, group_rank: int) -> int:
        return self._group.global_rank(group_rank)

    # -- collectives ------------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> TensorcommWork:
        """Reduce one tensor in place across the group."""
        op = _reduce_op(opts.reduceOp) if opts is not None else ReduceOp.SUM
        F.all_reduce(_one(tensors, "allreduce"), op, self._group)
        return _done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> TensorcommWork:
        """Reduce several tensors of one dtype in place, as one flat message."""
        op = _reduce_op(opts.reduceOp) if opts is not None else ReduceOp.SUM
        if tensors:
            if len({t.dtype for t in tensors}) != 1:
                raise ValueError("tensorcomm backend: allreduce_coalesced needs tensors of one dtype")
            flat = torch.cat([t.detach().reshape(-1) for t in tensors])
            F.all_reduce(flat, op, self._group)
            with torch.no_grad():
                for tensor, part in zip(tensors, flat.split([t.numel() for t in tensors])):
                    tensor.copy_(part.view_as(tensor))
        return _done(tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> TensorcommWork:
        """Reduce one tensor onto ``opts.rootRank``."""
        F.reduce(_one(tensors, "reduce"), self._global(opts.rootRank), _reduce_op(opts.reduceOp),
                 self._group)
        return _done(tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> TensorcommWork:
        """Copy ``opts.rootRank``'s tensor into everyone's."""
        F.broadcast(_one(tensors, "broadcast"), self._global(opts.rootRank), self._group)
        return _done(tensors)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> TensorcommWork:
        """Gather everyone's tensor into ``output_tensors[0]`` on every member."""
        outputs = _one(output_tensors, "allgather")
        F.all_gather(outputs, _one(input_tensors, "allgather"), self._group)
        return _done(outputs)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          opts: Any = None) -> TensorcommWork:
        """Concatenate everyone's tensor along dim 0 into ``output``."""
        F.all_gather_into_tensor(output, input, self._group)
        return _done([output])

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]],
                            input_tensors: list[torch.Tensor], opts: Any = None) -> TensorcommWork:
        """``allgather`` of several tensors: ``output_lists[i]`` holds everyone's ``input_tensors[i]``."""
        for outputs, tensor in zip(output_lists, input_tensors):
            F.all_gather(outputs, tensor, self._group)
        return _done([t for outputs in output_lists for t in outputs])

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> TensorcommWork:
        """``all_gather_single`` of several output/input pairs."""
        for output, tensor in zip(outputs, inputs):
            F.all_gather_into_tensor(output, tensor, self._group)
        return _done(outputs)

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any) -> TensorcommWork:
        """Collect everyone's tensor into ``output_tensors[0]`` on ``opts.rootRank`` only."""
        root = opts.rootRank
        gather_list = _one(output_tensors, "gather") if self._group.rank == root else None
        F.gather(_one(input_tensors, "gather"), gather_list, self._global(root), self._group)
        return _done(gather_list or [])

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any) -> TensorcommWork:
        """Send ``input_tensors[0][i]`` from ``opts.rootRank`` into member ``i``'s tensor."""
        root = opts.rootRank
        scatter_list = _one(input_tensors, "scatter") if self._group.rank == root else None
        F.scatter(_one(output_tensors, "scatter"), scatter_list, self._global(root), self._group)
        return _done(output_tensors)

    def reduce_scatter(self, output_tensors: list[torch.Tensor],
                       input_tensors: list[list[torch.Tensor]], opts: Any) -> TensorcommWork:
        """Reduce ``input_tensors[0][i]`` across members into member ``i``'s output."""
        F.reduce_scatter(_one(output_tensors, "reduce_scatter"), _one(input_tensors, "reduce_scatter"),
                         _reduce_op(opts.reduceOp), self._group)
        return _done(output_tensors)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                              opts: Any) -> TensorcommWork:
        """Reduce ``input``; member ``i`` gets its i-th dim-0 block in ``output``."""
        F.reduce_scatter_tensor(output, input, _reduce_op(opts.reduceOp), self._group)
        return _done([output])

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any) -> TensorcommWork:
        """``reduce_scatter_single`` of several output/input pairs."""
        for output, tensor in zip(outputs, inputs):
            F.reduce_scatter_tensor(output, tensor, _reduce_op(opts.reduceOp), self._group)
        return _done(outputs)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          output_split_sizes: list[int], input_split_sizes: list[int],
                          opts: Any = None) -> TensorcommWork:
        """Block ``i`` of ``input`` (dim 0) goes to member ``i``; torch's ``[]`` means equal splits."""
        F.all_to_all_single(output, input, list(output_split_sizes) or None,
                            list(input_split_sizes) or None, self._group)
        return _done([output])

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> TensorcommWork:
        """``input_tensors[j]`` goes to member ``j``'s ``output_tensors[my rank]``."""
        F.all_to_all(output_tensors, input_tensors, self._group)
        return _done(output_tensors)

    def barrier(self, opts: Any = None) -> TensorcommWork:
        """Return once every member has entered the barrier."""
        F.barrier(self._group)
        return _done([])

    # -- point to point ---------------------------------------------------------------------

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> TensorcommWork:
        """Start sending one tensor to group rank ``dst``."""
        return TensorcommWork(tensors, F.isend(_one(tensors, "send"), self._global(dst), self._group, tag))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> TensorcommWork:
        """Start receiving one tensor from group rank ``src``."""
        return TensorcommWork(tensors, F.irecv(_one(tensors, "recv"), self._global(src), self._group, tag))

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> TensorcommWork:
        """Not supported: torch reads the sender from a C++ field a Python Work cannot set."""
        raise ValueError("tensorcomm backend: recv needs src= (receiving from any source is not "
                         "supported; torch cannot read the sender from a Python backend's Work)")

    # -- lifecycle --------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Release this group (and the tensorcomm world, if this group created it)."""
        callback, self._on_shutdown = self._on_shutdown, None
        if callback is not None:
            callback()

    def abort(self) -> None:
        """Same as ``shutdown``: pending calls fail, connections close."""
        self.shutdown()

    def __repr__(self) -> str:
        return f"ProcessGroupTensorcomm(rank={self._group.rank}, size={self._group.size})"
