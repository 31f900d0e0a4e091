"""Every collective on numpy arrays: the one place frontends call into.

Arguments arrive validated by a frontend (types, lengths, shapes, writability, group ranks,
memory shared between inputs and outputs) as flat, C-contiguous numpy arrays, with per-member
element counts where blocks are involved (see ``algorithms/select.py`` for the layout). Each
function names the call's *shape* (collective, dtype, sizes, op, root) and looks up the group's
``Plan`` for it; the first call of a shape makes the plan: it parses the op and checks it
against the dtype, builds the signature peers compare, picks the algorithm and has it prepare
its per-shape state (``Row.prepare``). The plan's algorithm then runs in the group's issue order
(``Group._run``).

Each collective ``x`` has a persistent form, ``x_init`` (``core/persistent.py``): the plan made
once for the request, and every member's creation of it checked as a step of the group.

A failed call leaves arrays it updates in place (all_reduce, reduce's root, broadcast's
receivers) untouched or complete; outputs-only arrays may be left partly written by a failed
shared-memory call larger than one slot (see ``algorithms/shm_common.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from ..algorithms import kernels, select
from ..algorithms.base import Plan, make_plan
from ..signature import UNCHECKED, creation, signature
from ..trace import recorder
from ..types import PremulSum, ReduceOp, ReduceOpLike
from .group import Group
from .persistent import Binding, Prequest
from .work import Work

log = logging.getLogger("tensorcomm.plan")


def _make(group: Group, collective: str, nbytes: int, sig: Any, args: tuple[Any, ...],
          op: Any = None, reduction: kernels.Reduction | None = None) -> Plan:
    """The plan of a new call shape; ``args`` are its first call's arguments, as the algorithm
    gets them (its row's ``prepare`` reads their shape)."""
    team = group._member_team()
    stopped = group._engine.stopped
    if stopped is not None:  # destroyed or aborted: its memory may be gone, plan nothing
        raise stopped
    row = select.pick(collective, team, nbytes, group._world.algorithms.get(collective))
    log.debug("%s on group %r, %s: %s", collective, group.name, sig.describe(), row.name)
    return make_plan(row, f"{collective} on group {group.name!r}", sig, team, args, op, reduction)


def _op_key(op: ReduceOpLike) -> Hashable:
    """The op's part of a plan's key, always hashable: a bad op never finds a plan, and making
    one reports it."""
    kind = type(op)
    if kind is ReduceOp:  # Enum.__hash__ runs Python code; the member's value hashes in C
        return op._value_  # type: ignore[union-attr]  # `type(op) is` (fast) does not narrow
    return op if kind is str or kind is PremulSum else ("not an op", id(op))


def _flat(x: np.ndarray) -> np.ndarray:
    return x if x.ndim == 1 else x.reshape(-1)


def _reduction(group: Group, collective: str, fn: str, x: np.ndarray, op: ReduceOpLike,
               head: tuple[Any, ...], root: int = -1, count: int | None = None) -> Plan:
    """The plan of a reduction; the algorithm's arguments are ``head`` then the parsed op."""
    parsed = ReduceOp.parse(op, f"{fn}: op")
    kernels.check_op_dtype(parsed, x.dtype, f"{fn}: op")
    red = kernels.reduction(parsed, x.dtype)
    sig = signature(collective, x.dtype, x.size if count is None else count, parsed, root)
    return _make(group, collective, x.size * red.acc.itemsize, sig, (*head, parsed), parsed, red)


def _persistent(group: Group, plan: Plan, args: tuple[Any, ...], binding: Binding | None) -> Prequest:
    """The persistent request that runs ``plan`` on ``args``, once every member has made it: a
    step of the group (a barrier with the creation's signature) checks that they all create the
    same call, as any call checks its peers'."""
    team = group._member_team()
    label = plan.label.replace(" on group ", "_init on group ", 1)
    row = select.pick("barrier", team, 0, group._world.algorithms.get("barrier"))
    group._run(make_plan(row, label, creation(plan.signature), team, ()), False)
    return Prequest(group, plan, args, binding, recorder.transport_name(team))


def all_reduce(group: Group, x: np.ndarray, op: ReduceOpLike, async_op: bool,
               fn: str = "all_reduce") -> Work | None:
    """Reduce ``x`` across the group, in place on every member."""
    if x.ndim != 1:  # ``_flat`` and ``_op_key`` inline: this is the small-call path
        x = x.reshape(-1)
    key = ("all_reduce", x.dtype, x.size, op._value_ if type(op) is ReduceOp else _op_key(op))
    plan = group._plans.get(key)
    if plan is None:
        plan = group._keep_plan(key, _reduction(group, "all_reduce", fn, x, op, (x,)))
    return group._run(plan, async_op, x, plan.op)


def reduce(group: Group, x: np.ndarray, root: int, op: ReduceOpLike, async_op: bool,
           fn: str = "reduce") -> Work | None:
    """Reduce ``x`` onto group rank ``root``; other members' arrays are left as they are."""
    x = _flat(x)
    key = ("reduce", x.dtype, x.size, _op_key(op), root)
    plan = group._plans.get(key)
    if plan is None:
        plan = group._keep_plan(key, _reduction(group, "reduce", fn, x, op, (x, root), root))
    return group._run(plan, async_op, x, root, plan.op)


def broadcast(group: Group, x: np.ndarray, root: int, async_op: bool) -> Work | None:
    """Copy group rank ``root``'s ``x`` into every member's."""
    if x.ndim != 1:  # ``_flat`` inline: the small-call path
        x = x.reshape(-1)
    key = ("broadcast", x.dtype, x.size, root)
    plan = group._plans.get(key)
    if plan is None:
        plan = group._keep_plan(key, _make(group, "broadcast", x.nbytes,
                                          signature("broadcast", x.dtype, x.size, root=root), (x, root)))
    return group._run(plan, async_op, x, root)


def all_gather(group: Group, send: np.ndarray, out: np.ndarray, counts: Sequence[int],
               async_op: bool) -> Work | None:
    """Every member's ``send`` lands in its block of ``out`` (``counts[q]`` elements for member
    ``q``, back to back) on every member."""
    counts = tuple(counts)
    if send.ndim != 1:  # ``_flat`` inline: the small-call path
        send = send.reshape(-1)
    if out.ndim != 1:
        out = out.reshape(-1)
    key = ("all_gather", send.dtype, counts)
    plan = group._plans.get(key)
    if plan is None:
        plan = group._keep_plan(key, _make(group, "all_gather", out.nbytes,
                                          signature("all_gather", send.dtype, sum(counts)),
                                          (send, out, counts)))
    return group._run(plan, async_op, send, out, counts)


def gather(group: Group, send: np.ndarray, out: np.ndarray | None, counts: Sequence[int], root: int,
           async_op: bool) -> Work | None:
    """Member ``q``'s ``send`` lands in block ``q`` of ``out`` on ``root`` only (``out`` is None
    elsewhere)."""
    counts = tuple(counts)
    send, out = _flat(send), None if out is None else _flat(out)
    key = ("gather", send.dtype, counts, root)
    plan = group._plans.get(key)
    if plan is None:
        plan = group._keep_plan(key, _make(group, "gather", sum(counts) * send.itemsize,
                                          signature("gather", send.dtype, sum(counts), root=root),
                                          (send, out, counts, root)))
    return group._run(plan, async_op, send, out, counts, root)


def scatter(group: Group, send: np.ndarray | None, out: np.ndarray, counts: Sequence[int], root: int,
            async_op: bool) -> Work | None:
    """Block ``q`` of ``send`` on ``root`` (None elsewhere) lands in member ``q``'s ``out``."""
    counts = tuple(counts)
    send, out = None if send is None else _flat(send), _flat(out)
    key = ("scatter", out.dtype, counts, root)
    plan = group._plans.get(key)
    if plan is None:
        plan = group._keep_plan(key, _make(group, "scatter", sum(counts) * out.itemsize,
                                          signature("scatter", out.dtype, sum(counts), root=root),
                                          (send, out, counts, root)))
    return group._run(plan, async_op, send, out, counts, root)


def reduce_scatter(group: Group, send: np.ndarray, out: np.ndarray, counts: Sequence[int],
                   op: ReduceOpLike, async_op: bool, fn: str = "reduce_scatter") -> Work | None:
    """Block ``q`` of ``send`` (``counts[q]`` elements), reduced across members, lands in member
    ``q``'s ``out``."""
    counts = tuple(counts)
    if send.ndim != 1:  # ``_flat`` and ``_op_key`` inline: the small-call path
        send = send.reshape(-1)
    if out.ndim != 1:
        out = out.reshape(-1)
    key = ("reduce_scatter", send.dtype, counts, op._value_ if type(op) is ReduceOp else _op_key(op))
    plan = group._plans.get(key)
    if plan is None:
        plan = group._keep_plan(key, _reduction(group, "reduce_scatter", fn, send, op, (send, out, counts),
                                                count=sum(counts)))
    return group._run(plan, async_op, send, out, counts, plan.op)


def all_to_all(group: Group, send: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
               recv_counts: Sequence[int], async_op: bool) -> Work | None:
    """Block ``j`` of member ``i``'s ``send`` lands in block ``i`` of member ``j``'s ``out``.

    Members may send each other blocks of different sizes: the signature leaves the count
    unchecked, and the algorithms check each block against the size its receiver expects.
    """
    send_counts, recv_counts = tuple(send_counts), tuple(recv_counts)
    if send.ndim != 1:  # ``_flat`` inline: the small-call path
        send = send.reshape(-1)
    if out.ndim != 1:
        out = out.reshape(-1)
    key = ("all_to_all", send.dtype, send_counts, recv_counts)
    plan = group._plans.get(key)
    if plan is None:
        plan = group._keep_plan(key, _make(group, "all_to_all", send.nbytes,
                                          signature("all_to_all", send.dtype, UNCHECKED),
                                          (send, send_counts, out, recv_counts)))
    return group._run(plan, async_op, send, send_counts, out, recv_counts)


def barrier(group: Group, async_op: bool) -> Work | None:
    """Return once every member has entered the barrier."""
    plan = group._plans.get(("barrier",))
    if plan is None:
        plan = group._keep_plan(("barrier",), _make(group, "barrier", 0, signature("barrier"), ()))
    return group._run(plan, async_op)


def scan(group: Group, x: np.ndarray, op: ReduceOpLike, inclusive: bool, async_op: bool,
         fn: str = "scan") -> Work | None:
    """Member ``r``'s ``x`` becomes the reduction of members ``0..r``' (``inclusive``) or
    ``0..r-1``' (exclusive: ``exscan``, which leaves member 0's ``x`` as it is), in place."""
    collective = "scan" if inclusive else "exscan"
    x = _flat(x)
    key = (collective, x.dtype, x.size, _op_key(op))
    plan = group._plans.get(key)
    if plan is None:
        plan = group._keep_plan(key, _reduction(group, collective, fn, x, op, (x,)))
    return group._run(plan, async_op, x, plan.op)


# -- persistent forms: the plan made once, for the request alone ---------------------------------

def all_reduce_init(group: Group, x: np.ndarray, op: ReduceOpLike, binding: Binding | None,
                    fn: str = "all_reduce_init") -> Prequest:
    """``all_reduce`` of ``x`` made persistent."""
    x = _flat(x)
    plan = _reduction(group, "all_reduce", fn, x, op, (x,))
    return _persistent(group, plan, (x, plan.op), binding)


def reduce_init(group: Group, x: np.ndarray, root: int, op: ReduceOpLike, binding: Binding | None,
                fn: str = "reduce_init") -> Prequest:
    """``reduce`` of ``x`` onto ``root`` made persistent."""
    x = _flat(x)
    plan = _reduction(group, "reduce", fn, x, op, (x, root), root)
    return _persistent(group, plan, (x, root, plan.op), binding)


def broadcast_init(group: Group, x: np.ndarray, root: int, binding: Binding | None) -> Prequest:
    """``broadcast`` of ``root``'s ``x`` made persistent."""
    x = _flat(x)
    plan = _make(group, "broadcast", x.nbytes, signature("broadcast", x.dtype, x.size, root=root), (x, root))
    return _persistent(group, plan, (x, root), binding)


def all_gather_init(group: Group, send: np.ndarray, out: np.ndarray, counts: Sequence[int],
                    binding: Binding | None) -> Prequest:
    """``all_gather`` made persistent."""
    counts, send, out = tuple(counts), _flat(send), _flat(out)
    plan = _make(group, "all_gather", out.nbytes, signature("all_gather", send.dtype, sum(counts)),
                 (send, out, counts))
    return _persistent(group, plan, (send, out, counts), binding)


def gather_init(group: Group, send: np.ndarray, out: np.ndarray | None, counts: Sequence[int], root: int,
                binding: Binding | None) -> Prequest:
    """``gather`` onto ``root`` made persistent."""
    counts, send, out = tuple(counts), _flat(send), None if out is None else _flat(out)
    plan = _make(group, "gather", sum(counts) * send.itemsize,
                 signature("gather", send.dtype, sum(counts), root=root), (send, out, counts, root))
    return _persistent(group, plan, (send, out, counts, root), binding)


def scatter_init(group: Group, send: np.ndarray | None, out: np.ndarray, counts: Sequence[int], root: int,
                 binding: Binding | None) -> Prequest:
    """``scatter`` from ``root`` made persistent."""
    counts, send, out = tuple(counts), None if send is None else _flat(send), _flat(out)
    plan = _make(group, "scatter", sum(counts) * out.itemsize,
                 signature("scatter", out.dtype, sum(counts), root=root), (send, out, counts, root))
    return _persistent(group, plan, (send, out, counts, root), binding)


def reduce_scatter_init(group: Group, send: np.ndarray, out: np.ndarray, counts: Sequence[int],
                        op: ReduceOpLike, binding: Binding | None,
                        fn: str = "reduce_scatter_init") -> Prequest:
    """``reduce_scatter`` made persistent."""
    counts, send, out = tuple(counts), _flat(send), _flat(out)
    plan = _reduction(group, "reduce_scatter", fn, send, op, (send, out, counts), count=sum(counts))
    return _persistent(group, plan, (send, out, counts, plan.op), binding)


def all_to_all_init(group: Group, send: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
                    recv_counts: Sequence[int], binding: Binding | None) -> Prequest:
    """``all_to_all`` made persistent."""
    send_counts, recv_counts = tuple(send_counts), tuple(recv_counts)
    send, out = _flat(send), _flat(out)
    plan = _make(group, "all_to_all", send.nbytes, signature("all_to_all", send.dtype, UNCHECKED),
                 (send, send_counts, out, recv_counts))
    return _persistent(group, plan, (send, send_counts, out, recv_counts), binding)


def barrier_init(group: Group) -> Prequest:
    """``barrier`` made persistent."""
    return _persistent(group, _make(group, "barrier", 0, signature("barrier"), ()), (), None)


def scan_init(group: Group, x: np.ndarray, op: ReduceOpLike, inclusive: bool, binding: Binding | None,
              fn: str = "scan_init") -> Prequest:
    """``scan`` (``inclusive``) or ``exscan`` of ``x`` made persistent."""
    x = _flat(x)
    plan = _reduction(group, "scan" if inclusive else "exscan", fn, x, op, (x,))
    return _persistent(group, plan, (x, plan.op), binding)
