"""``ProcessGroupTensorcomm``: torch.distributed's ProcessGroup interface over tensorcomm.

torch calls these methods with lists of tensors and an options object; each one translates
ranks (torch passes group ranks, tensorcomm's functions take global ones) and reduction ops, then
calls tensorcomm's own functional collective on the tensors themselves, which enter through
the torch adapter (zero-copy for CPU tensors).

When it runs. torch says in every options object whether its caller waits at once
(``opts.asyncOp``: False for ``dist.all_reduce(..., async_op=False)``); such calls run inline, on
the calling thread, and raise their errors there. Every other call (DDP's gradient buckets,
FSDP's prefetches, ``async_op=True``) is queued on the group's worker thread and returns at
once, so DDP's all-reduces go on beside the rest of backward; its future completes when the call
ends, with the call's error if it failed (``torch_work.py`` says how that reaches ``backward()``
without crashing torch). Point-to-point calls are always asynchronous.

The c10d convenience forms of ``ProcessGroup`` (``pg.allreduce(tensor)``,
``pg.broadcast(tensor, root=0)``, ``pg.reduce_scatter(output, inputs)``, ...) are accepted beside
torch's own ``(tensor lists, options)`` calls: a Python subclass's method hides every pybind
overload of its name, so each method here reads both.

Imports torch; only ``tensorcomm.torch`` imports this module.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

from ..core.group import Group
from ..types import ReduceOp, ReduceOpLike
from . import functional as F
from .torch_c10d import BACKEND_NAME, register_cpu_backend
from .torch_monitored import monitored_barrier
from .torch_sparse import SparseRunner, is_sparse
from .torch_work import TensorcommWork, Value, timeout_seconds

_OPS = {
    dist.ReduceOp.SUM: ReduceOp.SUM, dist.ReduceOp.AVG: ReduceOp.AVG,
    dist.ReduceOp.PRODUCT: ReduceOp.PROD, dist.ReduceOp.MIN: ReduceOp.MIN,
    dist.ReduceOp.MAX: ReduceOp.MAX, dist.ReduceOp.BAND: ReduceOp.BAND,
    dist.ReduceOp.BOR: ReduceOp.BOR, dist.ReduceOp.BXOR: ReduceOp.BXOR,
}


def _reduce_op(op: Any) -> ReduceOpLike:
    """tensorcomm's op for torch's ``ReduceOp`` object, ``RedOpType`` member, or None (SUM)."""
    if op is None:
        return ReduceOp.SUM
    kind = op if isinstance(op, dist.ReduceOp.RedOpType) else op.op
    if kind == dist.ReduceOp.PREMUL_SUM:
        factor = op.factor
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        return ReduceOp.premul_sum(float(factor))
    if kind not in _OPS:
        raise ValueError(f"tensorcomm backend: reduce op {kind} is not supported")
    return _OPS[kind]


def _options(opts: Any) -> tuple[Any, bool]:
    """(torch's options object or None, whether the caller lets the call run asynchronously).

    ``opts`` may also be what a convenience overload passes in its place (a root rank, a reduce
    op, a timeout): those callers get the returned Work and may wait when they like.
    """
    if opts is None or isinstance(opts, (int, datetime.timedelta, dist.ReduceOp, dist.ReduceOp.RedOpType)):
        return None, True
    return opts, getattr(opts, "asyncOp", True)


def _op_of(opts: Any, op: Any) -> ReduceOpLike:
    """The reduce op from an options object, or from a positional/keyword ``op``."""
    if op is not None:
        return _reduce_op(op)
    if isinstance(opts, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
        return _reduce_op(opts)
    return _reduce_op(getattr(opts, "reduceOp", None))


def _root_of(opts: Any, root: int | None) -> int:
    """The root (group rank) from an options object, or from a positional/keyword ``root``;
    c10d's default, 0, when neither gives one."""
    if root is not None:
        return root
    if isinstance(opts, int) and not isinstance(opts, bool):
        return opts
    return int(getattr(opts, "rootRank", 0))


def _one(tensors: Any, what: str) -> torch.Tensor:
    """The single tensor of a call (a tensor, or a list holding exactly one)."""
    if isinstance(tensors, torch.Tensor):
        return tensors
    return _single(tensors, what)


def _single(items: Any, what: str) -> Any:
    """The single item of torch's per-process list: a tensor, or a list of tensors."""
    # Several tensors per process come from torch's multi-GPU-per-process mode, gone since
    # torch 2.0 from the torch.distributed functions; a CPU backend has no use for it.
    if len(items) != 1:
        raise ValueError(f"tensorcomm backend: {what} takes exactly one tensor per process, "
                         f"got a list of {len(items)}")
    return items[0]


def _pairs(outputs: list[torch.Tensor], inputs: list[torch.Tensor],
           what: str) -> zip[tuple[torch.Tensor, torch.Tensor]]:
    """The (output, input) pairs of a coalesced call, which must hold as many of each."""
    if len(outputs) != len(inputs):
        raise ValueError(f"tensorcomm backend: {what} takes as many outputs as inputs, got "
                         f"{len(outputs)} outputs and {len(inputs)} inputs")
    return zip(outputs, inputs, strict=True)


def _combine(tensors: list[torch.Tensor], op: ReduceOpLike) -> torch.Tensor:
    """Several same-shaped tensors reduced into one, locally, by ``op`` (AVG: their mean; a
    pre-multiplied sum: their plain sum, which the group's call then scales)."""
    if len({(t.dtype, t.shape) for t in tensors}) != 1:
        raise ValueError("tensorcomm backend: allreduce's tensors must share one dtype and shape, "
                         f"got {[(str(t.dtype), list(t.shape)) for t in tensors]}")
    stacked = torch.stack([t.detach() for t in tensors])
    kind = op if isinstance(op, (ReduceOp, str)) else ReduceOp.SUM  # PremulSum: a sum
    kind = ReduceOp(kind) if isinstance(kind, str) else kind
    if kind in _LOCAL:
        return _LOCAL[kind](stacked)
    bitwise = _BITWISE[kind]
    combined = stacked[0].clone()
    for tensor in stacked[1:]:
        combined = bitwise(combined, tensor)
    return combined


def _mean(stacked: torch.Tensor) -> torch.Tensor:
    """The mean over the first dimension; for integers rounded toward zero, as the core's AVG."""
    if stacked.is_floating_point() or stacked.is_complex():
        return stacked.mean(0)
    if stacked.dtype == torch.bool:
        return stacked.all(0)
    return torch.div(stacked.sum(0, dtype=stacked.dtype), len(stacked), rounding_mode="trunc")


_LOCAL = {
    ReduceOp.SUM: lambda t: t.sum(0, dtype=t.dtype), ReduceOp.AVG: lambda t: _mean(t),
    ReduceOp.PROD: lambda t: t.prod(0, dtype=t.dtype), ReduceOp.MIN: lambda t: t.amin(0),
    ReduceOp.MAX: lambda t: t.amax(0),
}
_BITWISE = {ReduceOp.BAND: torch.bitwise_and, ReduceOp.BOR: torch.bitwise_or,
            ReduceOp.BXOR: torch.bitwise_xor}


class _BackendFacts:
    """What torch's Python code asks of a group's backend object (``pg._get_backend(device)``)
    before it picks a path, on torch 2.13, where no backend object can be built in Python."""

    supports_coalescing = False
    supports_splitting = False
    supports_shrinking = False
    supports_time_estimate = False

    def supports_tensor_alloc(self, device: Any) -> bool:
        """No backend-allocated tensors: torch allocates them itself."""
        return False

    def name(self) -> str:
        """``"tensorcomm"``."""
        return BACKEND_NAME


class ProcessGroupTensorcomm(dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on a tensorcomm ``Group``.

    Args:
        group: the tensorcomm group with the same members, in the same rank order.
        on_shutdown: called once by ``shutdown``/``abort`` (ends the tensorcomm world when this
            process group created it).
    """

    def __init__(self, group: Group, on_shutdown: Any = None) -> None:
        # torch's stub lists only __init__(store, rank, size); the binding has (rank, size) too.
        super().__init__(group.rank, group.size)  # type: ignore[call-arg]
        self._group = group
        self._on_shutdown = on_shutdown
        self._group_name = ""
        self._group_desc = ""
        self._sparse = SparseRunner(group, lambda: f"sparse-twin/{group._group_id}/{self._group_name}")
        # torch asks a process group which devices it serves (DCP, DeviceMesh, DTensor) and, from
        # 2.15, reads the CPU backend object (health check, flight recorder).
        self._backend = register_cpu_backend(self)

    def getBackendName(self) -> str:  # noqa: N802 (torch's names)
        """``"tensorcomm"``."""
        return BACKEND_NAME

    def getGroupName(self) -> str:  # noqa: N802
        """The name torch registered this group under (functional collectives look it up)."""
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        """Keep the name torch gives the group."""
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        """The description torch gave the group."""
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        """Keep the description torch gives the group."""
        self._group_desc = desc

    def _get_backend(self, device: Any) -> Any:
        """The group's backend object on ``device`` (the CPU only; on torch 2.13, where it cannot
        be built, an object that answers torch's capability questions)."""
        if torch.device(device).type != "cpu":
            raise RuntimeError(f"tensorcomm backend: no backend for device {device}; tensorcomm "
                               f"serves CPU tensors")
        return self._backend or _BackendFacts()

    def _work(self, work: Any, outputs: Value) -> TensorcommWork:
        return TensorcommWork(work, outputs)

    # -- reductions -------------------------------------------------------------------------

    def allreduce(self, tensors: Any, opts: Any = None, timeout: Any = None, *,
                  op: Any = None) -> TensorcommWork:
        """Reduce in place across the group (also ``allreduce(tensor, op)``).

        With several tensors per process, as on Gloo, every tensor ends with the reduction of
        all of them on every member. Sparse COO tensors (SUM, AVG) run on a thread of their own,
        in issue order: ``torch_sparse.py``.
        """
        _, run_async = _options(opts)
        reduce_op = _op_of(opts, op)
        if is_sparse(tensors):
            tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
            return self._work(self._sparse.submit(tensors, reduce_op, wait=not run_async), tensors)
        if isinstance(tensors, torch.Tensor) or len(tensors) == 1:
            tensor = _one(tensors, "allreduce")
            return self._work(F.all_reduce(tensor, reduce_op, self._group, run_async), [tensor])
        tensors = list(tensors)
        combined = _combine(tensors, reduce_op)

        def unpack() -> None:
            with torch.no_grad():
                for tensor in tensors:
                    tensor.copy_(combined)

        return self._finish(F.all_reduce(combined, reduce_op, self._group, run_async), unpack, tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> TensorcommWork:
        """Reduce several tensors of one dtype in place, as one flat message."""
        options, run_async = _options(opts)
        if not tensors:
            return self._work(None, [])
        if len({t.dtype for t in tensors}) != 1:
            raise ValueError("tensorcomm backend: allreduce_coalesced needs tensors of one dtype, got "
                             f"{sorted({str(t.dtype) for t in tensors})}")
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])

        def unpack() -> None:
            with torch.no_grad():
                for tensor, part in zip(tensors, flat.split([t.numel() for t in tensors]), strict=True):
                    tensor.copy_(part.view_as(tensor))

        work = F.all_reduce(flat, _op_of(options, None), self._group, run_async)
        return self._finish(work, unpack, tensors)

    def _finish(self, work: Any, unpack: Any, outputs: Value) -> TensorcommWork:
        """Copy a flat result out now (inline call) or when the call succeeds (queued call).

        The copies run in the caller's inference mode, whichever thread runs them: outputs made
        under ``torch.inference_mode()`` take in-place writes only inside it, and the group's
        worker thread is outside it.
        """
        inference = torch.is_inference_mode_enabled()

        def copy_out() -> None:
            with torch.inference_mode(inference):
                unpack()

        if work is None:
            copy_out()
        else:
            work._after(copy_out)
        return self._work(work, outputs)

    def reduce(self, tensors: Any, opts: Any = None, op: Any = None, timeout: Any = None, *,
               root: int | None = None) -> TensorcommWork:
        """Reduce one tensor onto the root (also ``reduce(tensor, root, op)``)."""
        options, run_async = _options(opts)
        tensor = _one(tensors, "reduce")
        work = F.reduce(tensor, 0, _op_of(options, op), self._group, run_async,
                        group_dst=_root_of(opts, root))
        return self._work(work, [tensor])

    def reduce_scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None,
                       timeout: Any = None, *, op: Any = None) -> TensorcommWork:
        """Reduce ``inputs[i]`` across members into member ``i``'s output.

        Members' outputs may differ in size (``inputs[i]`` has member ``i``'s output's size), as
        on Gloo. Also ``reduce_scatter(output, inputs, op)``.
        """
        _, run_async = _options(opts)
        output = _one(output_tensors, "reduce_scatter")
        inputs = input_tensors if isinstance(output_tensors, torch.Tensor) else \
            _single(input_tensors, "reduce_scatter")
        work = F.reduce_scatter(output, list(inputs), _op_of(opts, op), self._group, run_async)
        return self._work(work, [output])

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                              opts: Any = None) -> TensorcommWork:
        """Reduce ``input``; member ``i`` gets its i-th dim-0 block in ``output``."""
        options, run_async = _options(opts)
        work = F.reduce_scatter_tensor(output, input, _op_of(options, None), self._group, run_async)
        return self._work(work, [output])

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]  # torch's stub: other names

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> TensorcommWork:
        """``reduce_scatter_single`` of several output/input pairs."""
        options, run_async = _options(opts)
        op = _op_of(options, None)
        work = None
        for output, tensor in _pairs(outputs, inputs, "reduce_scatter_tensor_coalesced"):
            work = F.reduce_scatter_tensor(output, tensor, op, self._group, run_async)
        return self._work(work, outputs)  # calls run in order: the last ends after the others

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]  # torch's stub: other names

    # -- data movement ----------------------------------------------------------------------

    def broadcast(self, tensors: Any, opts: Any = None, timeout: Any = None, *,
                  root: int | None = None) -> TensorcommWork:
        """Copy the root's tensor into everyone's (also ``broadcast(tensor, root)``; root 0 when
        neither names one).

        With several tensors per process, as on Gloo, the root's ``tensors[opts.rootTensor]``
        lands in every tensor of every member.
        """
        _, run_async = _options(opts)
        group_root = _root_of(opts, root)
        if isinstance(tensors, torch.Tensor) or len(tensors) == 1:
            tensor = _one(tensors, "broadcast")
            work = F.broadcast(tensor, 0, self._group, run_async, group_src=group_root)
            return self._work(work, [tensor])
        tensors = list(tensors)
        source = int(getattr(opts, "rootTensor", 0))
        if not 0 <= source < len(tensors):
            raise ValueError(f"tensorcomm backend: broadcast rootTensor={source} is out of range "
                             f"for {len(tensors)} tensors")
        tensor = tensors[source]

        def unpack() -> None:
            with torch.no_grad():
                for other in tensors:
                    if other is not tensor:
                        other.copy_(tensor)

        work = F.broadcast(tensor, 0, self._group, run_async, group_src=group_root)
        return self._finish(work, unpack, tensors)

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> TensorcommWork:
        """Gather everyone's tensor into a list on every member.

        torch's form is ``allgather([outputs], [tensor], opts)``; also ``allgather(outputs, tensor)``.
        """
        _, run_async = _options(opts)
        if isinstance(input_tensors, torch.Tensor):
            outputs, tensor = list(output_tensors), input_tensors
        elif len(input_tensors) != 1:
            return self._allgather_several(list(output_tensors), list(input_tensors), run_async)
        else:
            outputs, tensor = _single(output_tensors, "allgather"), _one(input_tensors, "allgather")
        work = F.all_gather(outputs, tensor, self._group, run_async)
        return self._work(work, outputs)

    def _allgather_several(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                           run_async: bool) -> TensorcommWork:
        # Gloo's form: n inputs per process, n output lists of size * n tensors each, every list
        # holding member r's input i at r * n + i.
        size, n = self._group.size, len(inputs)
        if len(output_lists) != n or any(len(outputs) != size * n for outputs in output_lists):
            raise ValueError(f"tensorcomm backend: allgather with {n} inputs needs {n} output lists "
                             f"of {size * n} tensors, got {[len(o) for o in output_lists]}")
        if len({(t.dtype, t.shape) for t in inputs}) != 1:
            raise ValueError("tensorcomm backend: allgather's inputs must share one dtype and shape")
        joined = inputs[0].new_empty((size * n, *inputs[0].shape))
        work = F.all_gather_into_tensor(joined, torch.stack([t.detach() for t in inputs]),
                                        self._group, run_async)

        def unpack() -> None:
            with torch.no_grad():
                for outputs in output_lists:
                    for output, part in zip(outputs, joined, strict=True):
                        output.copy_(part)

        return self._finish(work, unpack, output_lists)  # Gloo's future yields the lists

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          opts: Any = None) -> TensorcommWork:
        """Concatenate everyone's tensor along dim 0 into ``output``; the future yields its
        per-member blocks, as Gloo's."""
        _, run_async = _options(opts)
        work = F.all_gather_into_tensor(output, input, self._group, run_async)
        return self._work(work, list(output.chunk(self._group.size)))

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]],
                            input_tensors: list[torch.Tensor], opts: Any = None) -> TensorcommWork:
        """Gather several tensors at once: ``output_lists[r][i]`` gets member ``r``'s
        ``input_tensors[i]``, as one message."""
        _, run_async = _options(opts)
        size = self._group.size
        if len(output_lists) != size or any(len(outputs) != len(input_tensors) for outputs in output_lists):
            raise ValueError(f"tensorcomm backend: allgather_coalesced needs output_lists of {size} "
                             f"lists (one per member) of {len(input_tensors)} tensors each, got "
                             f"{[len(outputs) for outputs in output_lists]}")
        if not input_tensors:
            return self._work(None, [])
        flat = torch.cat([t.detach().reshape(-1) for t in input_tensors])
        joined = flat.new_empty(size * flat.numel())
        sizes = [t.numel() for t in input_tensors]

        def unpack() -> None:
            with torch.no_grad():
                for outputs, block in zip(output_lists, joined.split(flat.numel()), strict=True):
                    for output, part in zip(outputs, block.split(sizes), strict=True):
                        output.copy_(part.view_as(output))

        work = F.all_gather_into_tensor(joined, flat, self._group, run_async)
        return self._finish(work, unpack, output_lists)  # Gloo's future yields the lists

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> TensorcommWork:
        """``all_gather_single`` of several output/input pairs; the future yields, as Gloo's, one
        list per member of its block of every output."""
        _, run_async = _options(opts)
        work = None
        for output, tensor in _pairs(outputs, inputs, "allgather_into_tensor_coalesced"):
            work = F.all_gather_into_tensor(output, tensor, self._group, run_async)
        blocks = [output.chunk(self._group.size) for output in outputs]
        # the calls run in order: the last ends after the others
        return self._work(work, [[b[r] for b in blocks] for r in range(self._group.size)])

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]  # torch's stub: other names

    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None, timeout: Any = None,
               *, root: int | None = None) -> TensorcommWork:
        """Collect everyone's tensor on the root only.

        torch's form is ``gather([outputs] on the root else [], [tensor], opts)``; also
        ``gather(outputs, tensor, root)``.
        """
        _, run_async = _options(opts)
        group_root = _root_of(opts, root)
        if isinstance(input_tensors, torch.Tensor):
            tensor, outputs = input_tensors, list(output_tensors)
        else:
            tensor = _one(input_tensors, "gather")
            outputs = _single(output_tensors, "gather") if self._group.rank == group_root else []
        gather_list = outputs if self._group.rank == group_root else None
        work = F.gather(tensor, gather_list, 0, self._group, run_async, group_dst=group_root)
        return self._work(work, outputs)

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None, timeout: Any = None,
                *, root: int | None = None) -> TensorcommWork:
        """Send the root's ``inputs[i]`` into member ``i``'s tensor.

        torch's form is ``scatter([tensor], [inputs] on the root else [], opts)``; also
        ``scatter(tensor, inputs, root)``.
        """
        _, run_async = _options(opts)
        group_root = _root_of(opts, root)
        tensor = _one(output_tensors, "scatter")
        if self._group.rank != group_root:
            inputs = None
        elif isinstance(output_tensors, torch.Tensor):
            inputs = list(input_tensors)
        else:
            inputs = _single(input_tensors, "scatter")
        work = F.scatter(tensor, inputs, 0, self._group, run_async, group_src=group_root)
        return self._work(work, [tensor])

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          output_split_sizes: list[int], input_split_sizes: list[int],
                          opts: Any = None) -> TensorcommWork:
        """Block ``i`` of ``input`` (dim 0) goes to member ``i``; torch's ``[]`` means equal splits."""
        _, run_async = _options(opts)
        work = F.all_to_all_single(output, input, list(output_split_sizes) or None,
                                   list(input_split_sizes) or None, self._group, run_async)
        return self._work(work, [output])

    alltoall_base = all_to_all_single  # type: ignore[assignment]  # torch's stub: other names

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> TensorcommWork:
        """``input_tensors[j]`` goes to member ``j``'s ``output_tensors[my rank]``."""
        _, run_async = _options(opts)
        work = F.all_to_all(output_tensors, input_tensors, self._group, run_async)
        return self._work(work, output_tensors)

    def barrier(self, opts: Any = None, timeout: Any = None) -> TensorcommWork:
        """Return once every member has entered the barrier (the Work, when asynchronous)."""
        _, run_async = _options(opts)
        return self._work(F.barrier(self._group, run_async), [])

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """A barrier that names the members that did not arrive within ``timeout``.

        Group rank 0 waits for every other member in turn, then releases them all. Raises
        RuntimeError naming the first member that did not arrive (every such member with
        ``wait_all_ranks=True``); on the others, when rank 0 does not release them in time.
        """
        monitored_barrier(self._group, timeout_seconds(timeout), wait_all_ranks)

    # -- point to point ---------------------------------------------------------------------

    def send(self, tensors: Any, dst: int, tag: int = 0) -> TensorcommWork:
        """Start sending one tensor to group rank ``dst``."""
        tensor = _one(tensors, "send")
        return self._work(F.isend(tensor, self._group.global_rank(dst), self._group, tag), [tensor])

    def recv(self, tensors: Any, src: int, tag: int = 0) -> TensorcommWork:
        """Start receiving one tensor from group rank ``src``."""
        tensor = _one(tensors, "recv")
        return self._work(F.irecv(tensor, self._group.global_rank(src), self._group, tag), [tensor])

    def recv_anysource(self, tensors: Any, tag: int = 0) -> TensorcommWork:
        """Not supported: torch reads the sender from a C++ field a Python Work cannot set."""
        raise ValueError("tensorcomm backend: recv needs src= (receiving from any source is not "
                         "supported; torch cannot read the sender from a Python backend's Work)")

    # -- groups and lifecycle ---------------------------------------------------------------

    def split_group(self, ranks: list[int], timeout: Any = None, opts: Any = None,
                    group_name: str | None = None, group_desc: str | None = None,
                    device_types: Any = None) -> ProcessGroupTensorcomm | None:
        """The group of ``ranks`` (this group's ranks, in their order), or None for a
        non-member (``torch.distributed.split_group`` calls this on every member)."""
        if self._group.rank not in ranks:
            return None
        members = [self._group.global_rank(r) for r in ranks]
        child = ProcessGroupTensorcomm(self._group._world.new_group(members))
        child.setGroupName(group_name or "")
        child.setGroupDesc(group_desc or "")
        return child

    # -- lifecycle --------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Release this group (and the tensorcomm world, if this group created it)."""
        self._sparse.close()
        callback, self._on_shutdown = self._on_shutdown, None
        if callback is not None:
            callback()

    def abort(self) -> None:
        """Same as ``shutdown``: pending calls fail, connections close."""
        self.shutdown()

    def __repr__(self) -> str:
        return f"ProcessGroupTensorcomm(rank={self._group.rank}, size={self._group.size})"
