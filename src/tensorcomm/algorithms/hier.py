"""Hierarchical collectives for groups that span hosts: shared memory inside each host, the
network between hosts, every member driving its own part of the traffic between hosts.

A group whose hosts hold as many members each (``L`` per host, ``H`` hosts) gets, on each member,
two sub-teams (``Team.hier``, set up by the core when the group is made): its *host* team (its
host-mates, with their shared-memory domain) and its *cross* team (the members with its local
index, one per host, in host order). A hierarchical call is a few calls on those teams, each run
by the algorithm ``select`` picks for that team (shared-memory rows inside a host, transport rows
across hosts), with sub-plans kept in the call's plan:

- all_reduce: up to 64 KiB, an all-reduce inside the host, then one across hosts per local index
  (each on the same host sums: redundant, but two steps); above, a reduce-scatter inside the
  host, an all-reduce across hosts of each member's part (all links busy at once), an all-gather
  inside the host.
- broadcast: up to 64 KiB, across hosts among the root's local index, then inside every host; above,
  the root's host scatters the parts, each local index broadcasts its part across hosts, every host
  gathers the parts.
- all_gather: across hosts per local index, then inside the host, then blocks put in group order.
- reduce_scatter: blocks put in (local index, host) order, a reduce-scatter inside the host,
  then across hosts.
- barrier: inside the host, across hosts, inside the host.

Reductions run on a copy in the accumulation dtype (``kernels.prepare``: PREMUL_SUM premultiplies
once, AVG divides once at the end by the group size) and round once into the caller's array, so
they follow ``kernels``' accumulation rule; every member ends with the same bits (each part is
reduced by one set of members, then copied). In-place arrays are written only at the end: a
failed call leaves them untouched, or complete for a large broadcast's receivers that finished
the step across hosts. This module must not import ``core``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..signature import signature
from ..types import PremulSum, ReduceOp
from . import kernels
from .allgather import bounds, even_counts
from .base import Ctx, Hierarchy, Team, make_plan
from .wire import scratch

Op = ReduceOp | PremulSum
SMALL_BYTES = 64 << 10  # up to this, fewer steps beat spreading the traffic over every link


def _hierarchy(ctx: Ctx) -> Hierarchy:
    h = ctx.team.hier
    if h is None:  # select.py picks these algorithms only for groups that have one
        raise RuntimeError(f"{ctx.name}: a hierarchical algorithm ran on group {ctx.team.group_name!r}, "
                           "which has no hierarchy")
    return h


def _reduction(ctx: Ctx) -> kernels.Reduction:
    red = ctx.plan.reduction
    if red is None:
        raise TypeError(f"{ctx.name}: a reduction's plan has no reduction descriptor")
    return red


def _step(ctx: Ctx, key: str, team: Team, collective: str, nbytes: int, sig_count: int,
          dtype: np.dtype | None, op: Any, root: int, *args: Any) -> None:
    """Run ``collective`` on one sub-team as step ``key`` of this call.

    The step's signature carries the whole call's root (``root``, a group rank, or -1), so
    members that called with different roots disagree at the first step they share; a barrier's
    steps carry the whole call's signature (a barrier's, or a persistent call's creation's).
    """
    h = _hierarchy(ctx)
    plans = ctx.plan.state
    if plans is None:
        plans = ctx.plan.state = {}
    plan = plans.get(key)
    if plan is None:
        row = h.pick(collective, team, nbytes)
        sig = ctx.signature if collective == "barrier" else signature(collective, dtype, sig_count, op, root)
        plan = plans[key] = make_plan(row, f"{ctx.name} ({key})", sig, team, args, op,
                                      None if op is None or dtype is None else kernels.reduction(op, dtype))
    sub = Ctx.of(team, h.next_seq(team), plan)
    sub.deadline = ctx.deadline
    plan.run(sub, *args)


def all_reduce(ctx: Ctx, x: np.ndarray, op: Op) -> None:
    """Reduce ``x`` across the group, in place on every member."""
    h = _hierarchy(ctx)
    red = _reduction(ctx)
    acc, base = red.acc, red.op
    nbytes = x.size * acc.itemsize
    if nbytes <= SMALL_BYTES:  # two rounds in place on a working copy
        work = kernels.prepare(red, x)
        _step(ctx, "host", h.host, "all_reduce", nbytes, work.size, acc, base, -1, work, base)
        _step(ctx, "cross", h.cross, "all_reduce", nbytes, work.size, acc, base, -1, work, base)
    else:  # reads x itself unless it needs converting; the result lands in reused scratch
        source = kernels.prepare(red, x, copy=False)
        counts = even_counts(source.size, len(h.host.ranks))
        part = scratch(ctx, "hier part", counts[h.host.rank], acc)
        _step(ctx, "host reduce_scatter", h.host, "reduce_scatter", nbytes, source.size, acc, base, -1,
              source, part, counts, base)
        _step(ctx, "cross", h.cross, "all_reduce", part.nbytes, part.size, acc, base, -1, part, base)
        # Fresh memory here would fault its pages in during the host all_gather, whose members
        # wait for each other round by round: 256 MiB on 2 hosts x 2 ranks at 1 Gbit/s ran at
        # 0.70x Gloo that way, against 1.2x with the pages touched beforehand.
        work = scratch(ctx, "hier work", source.size, acc)
        _step(ctx, "host all_gather", h.host, "all_gather", nbytes, source.size, acc, None, -1,
              part, work, counts)
    kernels.finish(red, work, x, ctx.size)


def broadcast(ctx: Ctx, x: np.ndarray, root: int) -> None:
    """Copy group rank ``root``'s ``x`` into every member's ``x``."""
    h = _hierarchy(ctx)
    root_host, root_local = divmod(h.grid[root], len(h.host.ranks))
    mine = ctx.rank == root
    if x.nbytes <= SMALL_BYTES:
        work = x if mine else np.empty_like(x)
        if h.host.rank == root_local:
            _step(ctx, "cross", h.cross, "broadcast", x.nbytes, x.size, x.dtype, None, root, work, root_host)
        _step(ctx, "host", h.host, "broadcast", x.nbytes, x.size, x.dtype, None, root, work, root_local)
    else:
        counts = even_counts(x.size, len(h.host.ranks))
        part = np.empty(counts[h.host.rank], dtype=x.dtype)
        if h.cross.rank == root_host:
            _step(ctx, "host scatter", h.host, "scatter", x.nbytes, x.size, x.dtype, None, root,
                  x if mine else None, part, counts, root_local)
        _step(ctx, "cross", h.cross, "broadcast", part.nbytes, part.size, x.dtype, None, root,
              part, root_host)
        work = np.empty_like(x)
        _step(ctx, "host all_gather", h.host, "all_gather", x.nbytes, x.size, x.dtype, None, root,
              part, work, counts)
    if not mine:
        x[...] = work


def all_gather(ctx: Ctx, send: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> None:
    """Every member's ``send`` lands in its block of ``out`` on every member."""
    h = _hierarchy(ctx)
    order, hosts = h.order, len(h.cross.ranks)
    mine = [counts[order[h.host.rank * hosts + q]] for q in range(hosts)]  # my cross team's sends
    gathered = np.empty(sum(mine), dtype=send.dtype)
    _step(ctx, "cross", h.cross, "all_gather", gathered.nbytes, sum(mine), send.dtype, None, -1,
          send, gathered, mine)
    host_counts = [sum(counts[order[i * hosts + q]] for q in range(hosts)) for i in range(len(h.host.ranks))]
    blocks = np.empty(sum(counts), dtype=send.dtype)
    _step(ctx, "host", h.host, "all_gather", blocks.nbytes, blocks.size, send.dtype, None, -1,
          gathered, blocks, host_counts)
    _put(blocks, out, counts, order)


def _put(travelled: np.ndarray, out: np.ndarray, counts: Sequence[int], order: np.ndarray) -> None:
    """``travelled`` holds the blocks of group ranks ``order[0], order[1], ...``; write them to
    their places in ``out`` (group-rank order)."""
    if len(set(counts)) == 1:
        out.reshape(len(counts), -1)[order] = travelled.reshape(len(counts), -1)
        return
    offsets = bounds(counts)
    position = 0
    for rank in order:
        size = counts[rank]
        out[offsets[rank]:offsets[rank] + size] = travelled[position:position + size]
        position += size


def reduce_scatter(ctx: Ctx, send: np.ndarray, out: np.ndarray, counts: Sequence[int], op: Op) -> None:
    """Block ``q`` of ``send``, reduced across members, lands in member ``q``'s ``out``."""
    h = _hierarchy(ctx)
    order, hosts, per_host = h.order, len(h.cross.ranks), len(h.host.ranks)
    red = _reduction(ctx)
    base, source = red.op, kernels.prepare(red, send, copy=False)  # only read: blocks are reordered
    if len(set(counts)) == 1:
        travel = source.reshape(len(counts), -1)[order].reshape(-1)
    else:
        offsets = bounds(counts)
        travel = np.concatenate([source[offsets[rank]:offsets[rank + 1]] for rank in order])
    host_counts = [sum(counts[order[i * hosts + q]] for q in range(hosts)) for i in range(per_host)]
    acc = source.dtype
    part = np.empty(host_counts[h.host.rank], dtype=acc)
    _step(ctx, "host", h.host, "reduce_scatter", travel.nbytes, travel.size, acc, base, -1,
          travel, part, host_counts, base)
    cross_counts = [counts[order[h.host.rank * hosts + q]] for q in range(hosts)]
    reduced = np.empty(cross_counts[h.cross.rank], dtype=acc)
    _step(ctx, "cross", h.cross, "reduce_scatter", part.nbytes, part.size, acc, base, -1,
          part, reduced, cross_counts, base)
    kernels.finish(red, reduced, out, ctx.size)


def barrier(ctx: Ctx) -> None:
    """Return once every member has entered the barrier."""
    h = _hierarchy(ctx)
    _step(ctx, "host enter", h.host, "barrier", 0, 0, None, None, -1)
    _step(ctx, "cross", h.cross, "barrier", 0, 0, None, None, -1)
    _step(ctx, "host leave", h.host, "barrier", 0, 0, None, None, -1)
