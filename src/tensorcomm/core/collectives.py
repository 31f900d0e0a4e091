"""Every collective on numpy arrays: the one place frontends call into.

Arguments arrive validated by a frontend (types, lengths, shapes, writability, group ranks,
memory shared between inputs and outputs) as flat, C-contiguous numpy arrays, with per-member
element counts where blocks are involved (see ``algorithms/select.py`` for the layout). Each
function names the call's *shape* (collective, dtype, sizes, op, root) and looks up the group's
``Plan`` for it; the first call of a shape makes the plan: it parses the op and checks it
against the dtype, builds the signature peers compare, picks the algorithm and has it prepare
its per-shape state (``Row.prepare``). The plan's algorithm then runs in the group's issue order
(``Inside.run``: ``Group._run``).

Each collective is described once, by its function here, written against a ``Caller`` (the
public names it uses of what it runs on), and every form is made from it, as mpi4py's
``for_allreduce`` serves ``Allreduce``, ``Iallreduce`` and ``Allreduce_init``: called on the
group it is the ordinary call (``async_op`` picks the blocking or the async form), run on the
group's ``Inside``; ``persistent(group, binding, x, *args)`` calls it on a ``_Making`` instead,
whose plan is the request's own and whose run makes the ``Prequest`` (``core/persistent.py``),
every member's creation of it checked as a step of the group (the persistent form, ``x_init``).
The ordinary call pays one attribute read for the sharing: the group's ``Inside`` is made with
the group and holds its plans and its bound ``_run``.

A failed call leaves arrays it updates in place (all_reduce, reduce's root, broadcast's
receivers) untouched or complete; outputs-only arrays may be left partly written by a failed
shared-memory call larger than one slot (see ``algorithms/shm_common.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

from ..algorithms import kernels, learning, select
from ..algorithms.base import Plan, Team, make_plan
from ..signature import UNCHECKED, creation, signature
from ..trace import recorder
from ..types import PremulSum, ReduceOp, ReduceOpLike
from .engine import Engine
from .group import Group, World, inside
from .persistent import Binding, Prequest

log = logging.getLogger("tensorcomm.plan")

R = TypeVar("R", covariant=True)


class Caller(Protocol[R]):
    """What a collective's description uses of what it runs on (``group.Inside`` for the ordinary
    call, ``_Making`` for the persistent one): the plans kept per call shape and keeping a new
    one, the group's team, issue order, world and name (to make a plan), and ``run``, what
    becomes of the plan and the call's arguments (``R``: a ``Work`` or None for the group, a
    ``Prequest`` for ``_Making``); ``learns``: whether its plans may learn their algorithm
    (``algorithms/learning.py``: the group's, not a persistent request's)."""

    learns: bool

    @property
    def plans(self) -> dict[Hashable, Plan]: ...
    @property
    def name(self) -> str: ...
    @property
    def engine(self) -> Engine: ...
    @property
    def world(self) -> World: ...
    def team(self) -> Team: ...
    def keep_plan(self, key: Hashable, plan: Plan) -> Plan: ...
    def run(self, plan: Plan, async_op: bool, *args: Any) -> R: ...


class Runs(Protocol[R]):
    """What a description is called on: a ``Group`` (or ``tensorcomm.WORLD``) or a ``_Making``,
    each naming its ``Caller`` ``_inside`` (the group's is made once, with the group)."""

    @property
    def _inside(self) -> Caller[R]: ...


class _Making:
    """The caller of a collective's description made persistent: no plan kept (the request's plan
    is its own, made for it), and the run makes the request (``_persistent``)."""

    __slots__ = ("_group", "_binding", "_its", "plans")
    learns = False

    def __init__(self, group: Group, binding: Binding | None) -> None:
        self._group, self._binding = group, binding
        self._its = inside(group)
        self.plans: dict[Hashable, Plan] = {}

    @property
    def _inside(self) -> _Making:
        return self

    @property
    def name(self) -> str:
        return self._its.name

    @property
    def engine(self) -> Engine:
        return self._its.engine

    @property
    def world(self) -> World:
        return self._its.world

    def team(self) -> Team:
        return self._its.team()

    def keep_plan(self, key: Hashable, plan: Plan) -> Plan:
        return plan

    def run(self, plan: Plan, async_op: bool, *args: Any) -> Prequest:
        return _persistent(self._group, plan, args, self._binding)


def persistent(group: Group, binding: Binding | None, describe: Callable[..., Any], *args: Any,
               **kwargs: Any) -> Prequest:
    """``describe`` (a collective of this module) on ``args`` made persistent: the plan made once,
    for the request alone (``x_init``)."""
    request: Prequest = describe(_Making(group, binding), *args, async_op=False, **kwargs)
    return request


def _make(its: Caller[Any], key: Hashable, collective: str, nbytes: int, sig: Any, args: tuple[Any, ...],
          op: Any = None, reduction: kernels.Reduction | None = None) -> Plan:
    """The plan of a new call shape ``key``, kept by ``its``; ``args`` are its first call's
    arguments, as the algorithm gets them (its row's ``prepare`` reads their shape)."""
    team = its.team()
    stopped = its.engine.stopped
    if stopped is not None:  # destroyed or aborted: its memory may be gone, plan nothing
        raise stopped
    override = its.world.algorithms.get(collective)
    row = select.pick(collective, team, nbytes, override)
    label = f"{collective} on group {its.name!r}"
    rows = select.learnable(collective, team, nbytes, row) if its.learns and override is None else []
    log.debug("%s on group %r, %s: %s", collective, its.name, sig.describe(), row.name)
    if rows:
        log.debug("learning among %s for %s", ", ".join(r.name for r in rows), sig.describe())
        return its.keep_plan(key, learning.learned_plan(rows, row, label, sig, team, args, op, reduction))
    return its.keep_plan(key, make_plan(row, label, sig, team, args, op, reduction))


def _op_key(op: ReduceOpLike) -> Hashable:
    """The op's part of a plan's key, always hashable: a bad op never finds a plan, and making
    one reports it."""
    kind = type(op)
    if kind is ReduceOp:  # Enum.__hash__ runs Python code; the member's value hashes in C
        return op._value_  # type: ignore[union-attr]  # `type(op) is` (fast) does not narrow
    return op if kind is str or kind is PremulSum else ("not an op", id(op))


def _flat(x: np.ndarray) -> np.ndarray:
    return x if x.ndim == 1 else x.reshape(-1)


def _reduction(its: Caller[Any], key: Hashable, collective: str, fn: str, x: np.ndarray, op: ReduceOpLike,
               head: tuple[Any, ...], root: int = -1, count: int | None = None) -> Plan:
    """The plan of a reduction (``_make``'s); the algorithm's arguments are ``head`` then the
    parsed op."""
    parsed = ReduceOp.parse(op, f"{fn}: op")
    kernels.check_op_dtype(parsed, x.dtype, f"{fn}: op")
    red = kernels.reduction(parsed, x.dtype)
    sig = signature(collective, x.dtype, x.size if count is None else count, parsed, root)
    return _make(its, key, collective, x.size * red.acc.itemsize, sig, (*head, parsed), parsed, red)


def _persistent(group: Group, plan: Plan, args: tuple[Any, ...], binding: Binding | None) -> Prequest:
    """The persistent request that runs ``plan`` on ``args``, once every member has made it: a
    step of the group (a barrier with the creation's signature) checks that they all create the
    same call, as any call checks its peers'."""
    its = inside(group)
    team = its.team()
    label = plan.label.replace(" on group ", "_init on group ", 1)
    row = select.pick("barrier", team, 0, its.world.algorithms.get("barrier"))
    its.run(make_plan(row, label, creation(plan.signature), team, ()), False)
    return Prequest(group, plan, args, binding, recorder.transport_name(team))


def all_reduce(group: Runs[R], x: np.ndarray, op: ReduceOpLike, async_op: bool,
               fn: str = "all_reduce") -> R:
    """Reduce ``x`` across the group, in place on every member."""
    its = group._inside
    if x.ndim != 1:  # ``_flat`` and ``_op_key`` inline: this is the small-call path
        x = x.reshape(-1)
    key = ("all_reduce", x.dtype, x.size, op._value_ if type(op) is ReduceOp else _op_key(op))
    plan = its.plans.get(key)
    if plan is None:
        plan = _reduction(its, key, "all_reduce", fn, x, op, (x,))
    return its.run(plan, async_op, x, plan.op)


def reduce(group: Runs[R], x: np.ndarray, root: int, op: ReduceOpLike, async_op: bool,
           fn: str = "reduce") -> R:
    """Reduce ``x`` onto group rank ``root``; other members' arrays are left as they are."""
    its = group._inside
    x = _flat(x)
    key = ("reduce", x.dtype, x.size, _op_key(op), root)
    plan = its.plans.get(key)
    if plan is None:
        plan = _reduction(its, key, "reduce", fn, x, op, (x, root), root)
    return its.run(plan, async_op, x, root, plan.op)


def broadcast(group: Runs[R], x: np.ndarray, root: int, async_op: bool) -> R:
    """Copy group rank ``root``'s ``x`` into every member's."""
    its = group._inside
    x = _flat(x)
    key = ("broadcast", x.dtype, x.size, root)
    plan = its.plans.get(key)
    if plan is None:
        plan = _make(its, key, "broadcast", x.nbytes,
                     signature("broadcast", x.dtype, x.size, root=root), (x, root))
    return its.run(plan, async_op, x, root)


def all_gather(group: Runs[R], send: np.ndarray, out: np.ndarray, counts: Sequence[int],
               async_op: bool) -> R:
    """Every member's ``send`` lands in its block of ``out`` (``counts[q]`` elements for member
    ``q``, back to back) on every member."""
    its = group._inside
    counts = tuple(counts)
    send, out = _flat(send), _flat(out)
    key = ("all_gather", send.dtype, counts)
    plan = its.plans.get(key)
    if plan is None:
        plan = _make(its, key, "all_gather", out.nbytes,
                     signature("all_gather", send.dtype, sum(counts)),
                     (send, out, counts))
    return its.run(plan, async_op, send, out, counts)


def gather(group: Runs[R], send: np.ndarray, out: np.ndarray | None, counts: Sequence[int], root: int,
           async_op: bool) -> R:
    """Member ``q``'s ``send`` lands in block ``q`` of ``out`` on ``root`` only (``out`` is None
    elsewhere)."""
    its = group._inside
    counts = tuple(counts)
    send, out = _flat(send), None if out is None else _flat(out)
    key = ("gather", send.dtype, counts, root)
    plan = its.plans.get(key)
    if plan is None:
        plan = _make(its, key, "gather", sum(counts) * send.itemsize,
                     signature("gather", send.dtype, sum(counts), root=root),
                     (send, out, counts, root))
    return its.run(plan, async_op, send, out, counts, root)


def scatter(group: Runs[R], send: np.ndarray | None, out: np.ndarray, counts: Sequence[int], root: int,
            async_op: bool) -> R:
    """Block ``q`` of ``send`` on ``root`` (None elsewhere) lands in member ``q``'s ``out``."""
    its = group._inside
    counts = tuple(counts)
    send, out = None if send is None else _flat(send), _flat(out)
    key = ("scatter", out.dtype, counts, root)
    plan = its.plans.get(key)
    if plan is None:
        plan = _make(its, key, "scatter", sum(counts) * out.itemsize,
                     signature("scatter", out.dtype, sum(counts), root=root),
                     (send, out, counts, root))
    return its.run(plan, async_op, send, out, counts, root)


def reduce_scatter(group: Runs[R], send: np.ndarray, out: np.ndarray, counts: Sequence[int],
                   op: ReduceOpLike, async_op: bool, fn: str = "reduce_scatter") -> R:
    """Block ``q`` of ``send`` (``counts[q]`` elements), reduced across members, lands in member
    ``q``'s ``out``."""
    its = group._inside
    counts = tuple(counts)
    send, out = _flat(send), _flat(out)
    # ``_op_key`` inline: the small-call path
    key = ("reduce_scatter", send.dtype, counts, op._value_ if type(op) is ReduceOp else _op_key(op))
    plan = its.plans.get(key)
    if plan is None:
        plan = _reduction(its, key, "reduce_scatter", fn, send, op, (send, out, counts),
                          count=sum(counts))
    return its.run(plan, async_op, send, out, counts, plan.op)


def all_to_all(group: Runs[R], send: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
               recv_counts: Sequence[int], async_op: bool) -> R:
    """Block ``j`` of member ``i``'s ``send`` lands in block ``i`` of member ``j``'s ``out``.

    Members may send each other blocks of different sizes: the signature leaves the count
    unchecked, and the algorithms check each block against the size its receiver expects.
    """
    its = group._inside
    send_counts, recv_counts = tuple(send_counts), tuple(recv_counts)
    send, out = _flat(send), _flat(out)
    key = ("all_to_all", send.dtype, send_counts, recv_counts)
    plan = its.plans.get(key)
    if plan is None:
        plan = _make(its, key, "all_to_all", send.nbytes,
                     signature("all_to_all", send.dtype, UNCHECKED),
                     (send, send_counts, out, recv_counts))
    return its.run(plan, async_op, send, send_counts, out, recv_counts)


def barrier(group: Runs[R], async_op: bool) -> R:
    """Return once every member has entered the barrier."""
    its = group._inside
    plan = its.plans.get(("barrier",))
    if plan is None:
        plan = _make(its, ("barrier",), "barrier", 0, signature("barrier"), ())
    return its.run(plan, async_op)


def scan(group: Runs[R], x: np.ndarray, op: ReduceOpLike, inclusive: bool, async_op: bool,
         fn: str = "scan") -> R:
    """Member ``r``'s ``x`` becomes the reduction of members ``0..r``' (``inclusive``) or
    ``0..r-1``' (exclusive: ``exscan``, which leaves member 0's ``x`` as it is), in place."""
    its = group._inside
    collective = "scan" if inclusive else "exscan"
    x = _flat(x)
    key = (collective, x.dtype, x.size, _op_key(op))
    plan = its.plans.get(key)
    if plan is None:
        plan = _reduction(its, key, collective, fn, x, op, (x,))
    return its.run(plan, async_op, x, plan.op)
