"""torch.distributed / MindSpore ``mint.distributed`` style: in place, ``async_op`` -> ``Work``.

Every function validates its arguments on the calling rank, then calls ``core.collectives``.
Ranks in ``src``/``dst`` are global ranks, as in torch and MindSpore; the rooted calls also take
``group_src``/``group_dst``, a rank of the group, as torch does. With ``async_op=False`` a
call returns ``None`` once done; with ``async_op=True`` it returns a ``Work`` at once and the
outputs are written when the call completes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core import collectives, p2p
from ..core.group import Group
from ..core.lifecycle import current_world
from ..core.work import Work
from ..types import SUPPORTED, ReduceOp, ReduceOpLike
from . import calls, validate
from .arrays import Staged
from .uneven import agree_if_uneven

_ndarray = np.ndarray
_SUPPORTED = SUPPORTED  # bfloat16 joins it once an array of it went through ``Staged``


def _plain(x: Any) -> bool:
    """Whether ``x`` goes to the core as it is: a numpy array of a supported dtype with at least
    one dimension, C-contiguous, aligned and writable, which a ``Staged`` would pass through
    untouched (its ``buf`` the array, nothing to commit). The small-call paths take such arrays
    without staging them; anything else, and every error, goes through ``Staged``."""
    return type(x) is _ndarray and x.flags.carray and x.ndim != 0 and x.dtype in _SUPPORTED


def _plain_blocks(whole: Any, block: Any, size: int) -> bool:
    """Whether ``whole`` and ``block`` are ``_plain`` arrays of one dtype and ``whole`` holds
    ``size`` blocks of ``block``'s size: the common call of the gather/scatter tensor forms."""
    return _plain(whole) and _plain(block) and whole.dtype == block.dtype \
        and whole.size == block.size * size


def _root(value: Any, group_value: Any, argument: str, fn: str, g: Group) -> int:
    """``validate.root``, with the common case (a global rank as a plain int, a member) looked up
    without a call."""
    if group_value is None and type(value) is int:
        found = g._index.get(value)
        if found is not None:
            return found
    return validate.root(value, group_value, argument, fn, g)


def _unaliased(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``validate.unaliased``, without its numpy call (a few hundred ns) for two arrays that
    each own their memory: distinct ones cannot overlap."""
    if source is not target and source.flags.owndata and target.flags.owndata:
        return source
    return validate.unaliased(source, target)


def _resolved(group: Any, async_op: Any, fn: str) -> Group:
    """The call's group, with ``async_op`` checked; the common values (the default group or a
    ``Group`` this process belongs to, False) take no further call."""
    if group is None:
        g = current_world().world_group
    elif type(group) is Group and group._team is not None:
        g = group
    else:
        g = validate.group(group, fn)
    if async_op is not False:
        validate.flag(async_op, "async_op", fn)
    return g


def _done(result: Work | None, outputs: Sequence[Staged], async_op: bool) -> Work | None:
    """Write outputs back to the callers' objects now (sync) or on completion (async).

    The small-call paths skip it when there is nothing to do: a sync call whose outputs are the
    callers' own contiguous numpy arrays (no ``needs_commit``).
    """
    if async_op:
        def commit() -> None:
            for staged in outputs:
                staged.commit()

        assert result is not None
        result._after(commit)
        return result
    for staged in outputs:
        if staged.needs_commit:  # else the call wrote into the caller's own array
            staged.commit()
    return None


def all_reduce(tensor: Any, op: ReduceOpLike = ReduceOp.SUM, group: Any = None,
               async_op: bool = False) -> Work | None:
    """Reduce ``tensor`` across the group; every member ends with the result, in place.

    Bool tensors reduce logically: SUM/MAX are "or", PROD/MIN are "and".

    Raises:
        TypeError: a non-array tensor, unsupported dtype, or a bad ``op``/``group``/``async_op``.
        ValueError: an op the dtype does not support, or a read-only tensor.
    """
    fn = "all_reduce"
    if async_op is False and type(tensor) is _ndarray and tensor.flags.carray and tensor.ndim \
            and tensor.dtype in _SUPPORTED:  # ``_plain`` inline: the common call, nothing staged
        g = current_world().world_group if group is None else _resolved(group, False, fn)
        collectives.all_reduce(g, tensor, op, False)
        return None
    g = _resolved(group, async_op, fn)
    call = calls.in_place(tensor, g, fn)
    (x,) = call.args
    return _done(collectives.all_reduce(g, x, op, async_op), call.outputs, async_op)


def scan(tensor: Any, op: ReduceOpLike = ReduceOp.SUM, group: Any = None,
         async_op: bool = False) -> Work | None:
    """Inclusive prefix reduction, in place (MPI's ``Scan``): group rank ``r`` ends with the
    reduction of ranks ``0..r``'s tensors.

    Every op and dtype of ``all_reduce`` works, with its accumulation rule (half-precision sums
    combine in float32); ``AVG`` is the running mean (the prefix's sum divided by ``r + 1``).

    Raises:
        TypeError: a non-array tensor, unsupported dtype, or a bad ``op``/``group``/``async_op``.
        ValueError: an op the dtype does not support, or a read-only tensor.
    """
    return _scan(tensor, op, group, async_op, True, "scan")


def exscan(tensor: Any, op: ReduceOpLike = ReduceOp.SUM, group: Any = None,
           async_op: bool = False) -> Work | None:
    """Exclusive prefix reduction, in place (MPI's ``Exscan``): group rank ``r`` ends with the
    reduction of ranks ``0..r-1``'s tensors; group rank 0's tensor is left as it is (MPI leaves
    it undefined).

    Ops and dtypes as ``scan``; ``AVG`` divides the prefix's sum by ``r``.

    Raises:
        TypeError: a non-array tensor, unsupported dtype, or a bad ``op``/``group``/``async_op``.
        ValueError: an op the dtype does not support, or a read-only tensor.
    """
    return _scan(tensor, op, group, async_op, False, "exscan")


def _scan(tensor: Any, op: ReduceOpLike, group: Any, async_op: bool, inclusive: bool,
          fn: str) -> Work | None:
    g = _resolved(group, async_op, fn)
    call = calls.in_place(tensor, g, fn)
    (x,) = call.args
    return _done(collectives.scan(g, x, op, inclusive, async_op, fn), call.outputs, async_op)


def reduce(tensor: Any, dst: int = 0, op: ReduceOpLike = ReduceOp.SUM, group: Any = None,
           async_op: bool = False, *, group_dst: int | None = None) -> Work | None:
    """Reduce ``tensor`` across the group onto global rank ``dst`` (or group rank ``group_dst``);
    others' tensors are unchanged."""
    fn = "reduce"
    g = _resolved(group, async_op, fn)
    call = calls.reduce(tensor, dst, group_dst, g, fn)
    x, root = call.args
    return _done(collectives.reduce(g, x, root, op, async_op), call.outputs, async_op)


def broadcast(tensor: Any, src: int = 0, group: Any = None, async_op: bool = False, *,
              group_src: int | None = None) -> Work | None:
    """Copy global rank ``src``'s (or group rank ``group_src``'s) ``tensor`` into every member's."""
    fn = "broadcast"
    g = _resolved(group, async_op, fn)
    root = _root(src, group_src, "src", fn, g)
    if async_op is False and _plain(tensor):  # the common call: nothing staged, nothing to commit
        collectives.broadcast(g, tensor, root, False)
        return None
    call = calls.broadcast(tensor, root, g, fn)
    return _done(collectives.broadcast(g, call.args[0], root, async_op), call.outputs, async_op)


def all_gather(tensor_list: Any, tensor: Any, group: Any = None, async_op: bool = False) -> Work | None:
    """Every member's ``tensor`` lands in ``tensor_list[member]`` on every member.

    The list's arrays must all have ``tensor``'s dtype; their shapes may differ per member (the
    "v" variant): ``tensor_list[i]`` must be shaped like member ``i``'s ``tensor``.
    """
    fn = "all_gather"
    g = _resolved(group, async_op, fn)
    call = calls.all_gather(tensor_list, tensor, g, fn)
    send, out, counts = call.args
    return _done(collectives.all_gather(g, send, out, counts, async_op), call.outputs, async_op)


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None,
                           async_op: bool = False) -> Work | None:
    """Concatenate every member's ``input_tensor`` (in rank order, along dim 0) into ``output_tensor``."""
    fn = "all_gather_into_tensor"
    g = _resolved(group, async_op, fn)
    if async_op is False and _plain_blocks(output_tensor, input_tensor, len(g._ranks)):  # unstaged
        collectives.all_gather(g, _unaliased(input_tensor, output_tensor), output_tensor,
                               (input_tensor.size,) * len(g._ranks), False)
        return None
    call = calls.all_gather_into_tensor(output_tensor, input_tensor, g, fn)
    send, out, counts = call.args
    return _done(collectives.all_gather(g, send, out, counts, async_op), call.outputs, async_op)


def gather(tensor: Any, gather_list: Any = None, dst: int = 0, group: Any = None,
           async_op: bool = False, *, group_dst: int | None = None) -> Work | None:
    """Collect every member's ``tensor`` into ``gather_list`` on global rank ``dst`` (or group
    rank ``group_dst``) only.

    Other ranks may pass ``None`` or a list; a list passed there is left untouched.
    """
    fn = "gather"
    g = _resolved(group, async_op, fn)
    call = calls.gather(tensor, gather_list, dst, group_dst, g, fn)
    send, out, counts, root = call.args
    return _done(collectives.gather(g, send, out, counts, root, async_op), call.outputs, async_op)


def scatter(tensor: Any, scatter_list: Any = None, src: int = 0, group: Any = None,
            async_op: bool = False, *, group_src: int | None = None) -> Work | None:
    """Send ``scatter_list[i]`` from global rank ``src`` (or group rank ``group_src``) into
    member ``i``'s ``tensor``."""
    fn = "scatter"
    g = _resolved(group, async_op, fn)
    call = calls.scatter(tensor, scatter_list, src, group_src, g, fn)
    send, out, counts, root = call.args
    return _done(collectives.scatter(g, send, out, counts, root, async_op), call.outputs, async_op)


def reduce_scatter(output: Any, input_list: Any, op: ReduceOpLike = ReduceOp.SUM, group: Any = None,
                   async_op: bool = False) -> Work | None:
    """Reduce ``input_list[i]`` across members into member ``i``'s ``output``.

    The blocks may differ in size (MPI's ``Reduce_scatter`` with ``recvcounts``):
    ``input_list[i]`` holds as many elements as member ``i``'s ``output``, every member passes
    blocks of the same sizes, and a few int64s travel first so that members that disagree all get
    a ``CollectiveMismatchError`` (that exchange finishes before an ``async_op`` call returns).
    """
    fn = "reduce_scatter"
    g = _resolved(group, async_op, fn)
    call = calls.reduce_scatter(output, input_list, g, fn)
    send, out, counts = call.args
    agree_if_uneven(g, send, counts, op, fn)
    return _done(collectives.reduce_scatter(g, send, out, counts, op, async_op, fn), call.outputs, async_op)


def reduce_scatter_tensor(output: Any, input: Any, op: ReduceOpLike = ReduceOp.SUM,  # noqa: A002
                          group: Any = None, async_op: bool = False) -> Work | None:
    """Reduce ``input`` across members; member ``i`` gets the i-th of ``size`` equal dim-0 blocks."""
    fn = "reduce_scatter_tensor"
    g = _resolved(group, async_op, fn)
    if async_op is False and _plain_blocks(input, output, len(g._ranks)):  # the common call, unstaged
        collectives.reduce_scatter(g, _unaliased(input, output), output,
                                   (output.size,) * len(g._ranks), op, False, fn)
        return None
    call = calls.reduce_scatter_tensor(output, input, g, fn)
    send, out, counts = call.args
    return _done(collectives.reduce_scatter(g, send, out, counts, op, async_op, fn), call.outputs, async_op)


def all_to_all(output_tensor_list: Any, input_tensor_list: Any, group: Any = None,
               async_op: bool = False) -> Work | None:
    """Member ``i``'s ``input_tensor_list[j]`` lands in member ``j``'s ``output_tensor_list[i]``."""
    fn = "all_to_all"
    g = _resolved(group, async_op, fn)
    call = calls.all_to_all(output_tensor_list, input_tensor_list, g, fn)
    send, send_counts, out, recv_counts = call.args
    return _done(collectives.all_to_all(g, send, send_counts, out, recv_counts, async_op), call.outputs,
                 async_op)


def all_to_all_single(output: Any, input: Any, output_split_sizes: Sequence[int] | None = None,  # noqa: A002
                      input_split_sizes: Sequence[int] | None = None, group: Any = None,
                      async_op: bool = False) -> Work | None:
    """Split ``input`` along dim 0 (equally, or by ``input_split_sizes``), send block i to member i,
    and concatenate what arrives into ``output`` (split by ``output_split_sizes``)."""
    fn = "all_to_all_single"
    g = _resolved(group, async_op, fn)
    size = len(g._ranks)
    if async_op is False and input_split_sizes is None and output_split_sizes is None and _plain(output) \
            and _plain(input) and input.dtype == output.dtype and input.shape == output.shape \
            and not input.shape[0] % size:  # the common call (equal splits), unstaged
        counts = (input.size // size,) * size
        collectives.all_to_all(g, _unaliased(input, output), counts, output, counts, False)
        return None
    call = calls.all_to_all_single(output, input, output_split_sizes, input_split_sizes, g, fn)
    send, send_counts, out, recv_counts = call.args
    return _done(collectives.all_to_all(g, send, send_counts, out, recv_counts, async_op), call.outputs,
                 async_op)


def barrier(group: Any = None, async_op: bool = False) -> Work | None:
    """Block until every member of the group has called ``barrier``."""
    fn = "barrier"
    return collectives.barrier(_resolved(group, async_op, fn), async_op)


def isend(tensor: Any, dst: int, group: Any = None, tag: int = 0) -> Work:
    """Start sending ``tensor`` to global rank ``dst``; return a ``Work``."""
    fn = "isend"
    g = validate.group(group, fn)
    validate.rank(dst, "dst", fn, g)
    staged = validate.array(tensor, "tensor", fn)
    return p2p.isend(g, staged.buf, dst, validate.tag(tag, fn))


def irecv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0) -> Work:
    """Post a receive into ``tensor`` from global rank ``src`` (``None``: any member).

    ``Work.result()`` is the sender's global rank.
    """
    fn = "irecv"
    g = validate.group(group, fn)
    if src is not None:
        validate.rank(src, "src", fn, g)
    staged = validate.array(tensor, "tensor", fn, writable=True)
    work = p2p.irecv(g, staged.buf, src, validate.tag(tag, fn))
    work._after(staged.commit)
    return work


def send(tensor: Any, dst: int, group: Any = None, tag: int = 0) -> None:
    """Send ``tensor`` to global rank ``dst``, matched by ``recv`` with the same ``tag``."""
    isend(tensor, dst, group, tag).wait()


def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0) -> int:
    """Receive into ``tensor`` from global rank ``src`` (``None``: any member); return the sender."""
    work = irecv(tensor, src, group, tag)
    work.wait()
    return work.result()
