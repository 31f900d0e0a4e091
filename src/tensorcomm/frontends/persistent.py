"""Persistent collectives: ``all_reduce_init`` and its kin, each returning a ``Prequest``.

MPI 4's persistent collectives (``MPI_Allreduce_init``, mpi4py's ``Comm.Allreduce_init``): a call
repeated with the same arrays is checked and planned once, when every member creates it, then
run many times (``start()``/``wait()``, or calling the request). Each function takes its
ordinary collective's arguments (``tensorcomm.all_reduce``'s and so on, less ``async_op``),
checked as the ordinary call checks them (``calls``), and binds the request to the arrays given:
a run reads and writes them where they lie, so values written into them between runs are the
ones a run uses; an array that is no longer the one given (another memory, shape or dtype: a
numpy array resized or given another dtype in place, a torch tensor given other storage with
``set_``) makes the next run raise ``ValueError``. Arrays that had to be staged (strided, lists
joined into one buffer, inputs that overlap their output) are copied in before each run and
results copied back after it, as the ordinary call does once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core import collectives
from ..core.persistent import Binding, Prequest
from ..types import ReduceOp, ReduceOpLike
from . import calls
from .functional import _resolved, _root
from .uneven import agree_if_uneven

_ndarray = np.ndarray


def _where(array: np.ndarray) -> tuple[Any, ...]:
    """Where and what ``array`` is: its address, shape, strides and dtype."""
    return array.__array_interface__["data"][0], array.shape, array.strides, array.dtype


def _binding(call: calls.Call, fn: str) -> Binding:
    """The hold of a request made by ``fn`` on ``call``'s arrays (``core.persistent.Binding``)."""
    plain = tuple((s.obj, s.obj.shape, s.obj.dtype) for s in call.staged if type(s.obj) is _ndarray)
    viewed = tuple((s, _where(s.array)) for s in call.staged if type(s.obj) is not _ndarray)
    copies = tuple(call.copies)
    outputs = tuple(o for o in call.outputs if o.needs_commit)

    def check() -> None:
        for array, shape, dtype in plain:  # a numpy array moves only with its shape (resize)
            if array.shape != shape or array.dtype is not dtype:
                raise _changed(fn, f"{dtype}{list(shape)}", f"{array.dtype}{list(array.shape)}")
        for staged, where in viewed:
            now = _where(staged.adapter.as_numpy(staged.obj, staged.writable))
            if now != where:
                raise _changed(fn, f"{where[3]}{list(where[1])} at {where[0]:#x}",
                               f"{now[3]}{list(now[1])} at {now[0]:#x}")
        for buffer, source in copies:
            buffer[...] = source

    def commit() -> None:
        for output in outputs:
            output.commit()

    return Binding(check if plain or viewed or copies else None, commit if outputs else None)


def _changed(fn: str, was: str, now: str) -> ValueError:
    return ValueError(f"{fn}: an array this persistent request is bound to is not the one it was made "
                      f"with any more (it was {was}, it is {now}); a request runs on the arrays it "
                      "was made with: write new values into them, or make a new request for others")


def all_reduce_init(tensor: Any, op: ReduceOpLike = ReduceOp.SUM, group: Any = None) -> Prequest:
    """``all_reduce(tensor, op, group)`` made persistent (MPI's ``Allreduce_init``): every member
    makes it, then runs it as often as it likes; each run reduces ``tensor`` in place.

    Raises:
        TypeError, ValueError: as ``all_reduce``.
        CollectiveMismatchError: another member made another call at this step.
    """
    fn = "all_reduce_init"
    g = _resolved(group, False, fn)
    call = calls.in_place(tensor, g, fn)
    (x,) = call.args
    return collectives.persistent(g, _binding(call, fn), collectives.all_reduce, x, op, fn=fn)


def scan_init(tensor: Any, op: ReduceOpLike = ReduceOp.SUM, group: Any = None) -> Prequest:
    """``scan(tensor, op, group)`` made persistent (MPI's ``Scan_init``)."""
    return _scan_init(tensor, op, group, True, "scan_init")


def exscan_init(tensor: Any, op: ReduceOpLike = ReduceOp.SUM, group: Any = None) -> Prequest:
    """``exscan(tensor, op, group)`` made persistent (MPI's ``Exscan_init``)."""
    return _scan_init(tensor, op, group, False, "exscan_init")


def _scan_init(tensor: Any, op: ReduceOpLike, group: Any, inclusive: bool, fn: str) -> Prequest:
    g = _resolved(group, False, fn)
    call = calls.in_place(tensor, g, fn)
    (x,) = call.args
    return collectives.persistent(g, _binding(call, fn), collectives.scan, x, op, inclusive, fn=fn)


def reduce_init(tensor: Any, dst: int = 0, op: ReduceOpLike = ReduceOp.SUM, group: Any = None, *,
                group_dst: int | None = None) -> Prequest:
    """``reduce(tensor, dst, op, group)`` made persistent (MPI's ``Reduce_init``)."""
    fn = "reduce_init"
    g = _resolved(group, False, fn)
    call = calls.reduce(tensor, dst, group_dst, g, fn)
    x, root = call.args
    return collectives.persistent(g, _binding(call, fn), collectives.reduce, x, root, op, fn=fn)


def broadcast_init(tensor: Any, src: int = 0, group: Any = None, *, group_src: int | None = None) -> Prequest:
    """``broadcast(tensor, src, group)`` made persistent (MPI's ``Bcast_init``): each run copies
    the root's ``tensor``, as it is then, into every member's."""
    fn = "broadcast_init"
    g = _resolved(group, False, fn)
    call = calls.broadcast(tensor, _root(src, group_src, "src", fn, g), g, fn)
    x, root = call.args
    return collectives.persistent(g, _binding(call, fn), collectives.broadcast, x, root)


def all_gather_init(tensor_list: Any, tensor: Any, group: Any = None) -> Prequest:
    """``all_gather(tensor_list, tensor, group)`` made persistent (MPI's ``Allgatherv_init``)."""
    fn = "all_gather_init"
    g = _resolved(group, False, fn)
    call = calls.all_gather(tensor_list, tensor, g, fn)
    send, out, counts = call.args
    return collectives.persistent(g, _binding(call, fn), collectives.all_gather, send, out, counts)


def all_gather_into_tensor_init(output_tensor: Any, input_tensor: Any, group: Any = None) -> Prequest:
    """``all_gather_into_tensor(output_tensor, input_tensor, group)`` made persistent (MPI's
    ``Allgather_init``)."""
    fn = "all_gather_into_tensor_init"
    g = _resolved(group, False, fn)
    call = calls.all_gather_into_tensor(output_tensor, input_tensor, g, fn)
    send, out, counts = call.args
    return collectives.persistent(g, _binding(call, fn), collectives.all_gather, send, out, counts)


def gather_init(tensor: Any, gather_list: Any = None, dst: int = 0, group: Any = None, *,
                group_dst: int | None = None) -> Prequest:
    """``gather(tensor, gather_list, dst, group)`` made persistent (MPI's ``Gather_init``)."""
    fn = "gather_init"
    g = _resolved(group, False, fn)
    call = calls.gather(tensor, gather_list, dst, group_dst, g, fn)
    send, out, counts, root = call.args
    return collectives.persistent(g, _binding(call, fn), collectives.gather, send, out, counts, root)


def scatter_init(tensor: Any, scatter_list: Any = None, src: int = 0, group: Any = None, *,
                 group_src: int | None = None) -> Prequest:
    """``scatter(tensor, scatter_list, src, group)`` made persistent (MPI's ``Scatter_init``)."""
    fn = "scatter_init"
    g = _resolved(group, False, fn)
    call = calls.scatter(tensor, scatter_list, src, group_src, g, fn)
    send, out, counts, root = call.args
    return collectives.persistent(g, _binding(call, fn), collectives.scatter, send, out, counts, root)


def reduce_scatter_init(output: Any, input_list: Any, op: ReduceOpLike = ReduceOp.SUM,
                        group: Any = None) -> Prequest:
    """``reduce_scatter(output, input_list, op, group)`` made persistent (MPI's
    ``Reduce_scatter_init``); blocks of different sizes are checked across members once, here."""
    fn = "reduce_scatter_init"
    g = _resolved(group, False, fn)
    call = calls.reduce_scatter(output, input_list, g, fn)
    send, out, counts = call.args
    agree_if_uneven(g, send, counts, op, fn)
    return collectives.persistent(g, _binding(call, fn), collectives.reduce_scatter, send, out, counts, op,
                                  fn=fn)


def reduce_scatter_tensor_init(output: Any, input: Any, op: ReduceOpLike = ReduceOp.SUM,  # noqa: A002
                               group: Any = None) -> Prequest:
    """``reduce_scatter_tensor(output, input, op, group)`` made persistent (MPI's
    ``Reduce_scatter_block_init``)."""
    fn = "reduce_scatter_tensor_init"
    g = _resolved(group, False, fn)
    call = calls.reduce_scatter_tensor(output, input, g, fn)
    send, out, counts = call.args
    return collectives.persistent(g, _binding(call, fn), collectives.reduce_scatter, send, out, counts, op,
                                  fn=fn)


def all_to_all_init(output_tensor_list: Any, input_tensor_list: Any, group: Any = None) -> Prequest:
    """``all_to_all(output_tensor_list, input_tensor_list, group)`` made persistent (MPI's
    ``Alltoallv_init``)."""
    fn = "all_to_all_init"
    g = _resolved(group, False, fn)
    call = calls.all_to_all(output_tensor_list, input_tensor_list, g, fn)
    send, send_counts, out, recv_counts = call.args
    return collectives.persistent(g, _binding(call, fn), collectives.all_to_all, send, send_counts, out,
                                  recv_counts)


def all_to_all_single_init(output: Any, input: Any,  # noqa: A002
                           output_split_sizes: Sequence[int] | None = None,
                           input_split_sizes: Sequence[int] | None = None, group: Any = None) -> Prequest:
    """``all_to_all_single(output, input, ...)`` made persistent (MPI's ``Alltoall_init``)."""
    fn = "all_to_all_single_init"
    g = _resolved(group, False, fn)
    call = calls.all_to_all_single(output, input, output_split_sizes, input_split_sizes, g, fn)
    send, send_counts, out, recv_counts = call.args
    return collectives.persistent(g, _binding(call, fn), collectives.all_to_all, send, send_counts, out,
                                  recv_counts)


def barrier_init(group: Any = None) -> Prequest:
    """``barrier(group)`` made persistent (MPI's ``Barrier_init``)."""
    return collectives.persistent(_resolved(group, False, "barrier_init"), None, collectives.barrier)

