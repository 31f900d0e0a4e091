"""Which algorithm runs a collective: an ordered table of candidates, each with a predicate.

``choose`` walks ``ROWS`` top to bottom and returns the first row of the collective whose
predicate holds for the call (its ``Ctx`` and message size); the last row of every collective
always holds. An override names a row explicitly. Algorithms' signatures differ per collective
(see each module). Within a collective, the transport rows share one signature and the *direct*
(shared-memory) rows another, which takes the caller's arrays and op; ``Row.direct`` tells the
core which to call (``core/collectives.py``). This module must not import ``core``.
docs/algorithms.md and docs/transports.md explain the costs behind each choice.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from . import (allgather, allreduce, alltoall, barrier, broadcast, gather_scatter, reduce, reduce_scatter,
               shm_allgather, shm_allreduce, shm_alltoall, shm_barrier, shm_broadcast, shm_reduce_scatter)
from .base import Ctx

# Up to this many bytes a message costs about one latency, so algorithms with fewer rounds win;
# above it, moving fewer bytes per rank wins. A first guess for one host: the benchmark suite
# (busbw per size, per algorithm through ``override``) is where to tune it.
SMALL_MESSAGE_BYTES = 64 * 1024

Predicate = Callable[[Ctx, int], bool]


class Row(NamedTuple):
    """One candidate: ``fn`` runs ``collective`` when ``predicate(ctx, nbytes)`` holds.

    ``direct`` rows (the shared-memory ones) take the caller's arrays and op and write the results
    themselves; the others take scratch buffers prepared by the core (see ``core/collectives.py``
    for both calling conventions of each collective).
    """

    collective: str
    name: str
    predicate: Predicate
    fn: Callable[..., None]
    direct: bool = False


def _always(ctx: Ctx, nbytes: int) -> bool:
    return True


def _small(ctx: Ctx, nbytes: int) -> bool:
    return nbytes <= SMALL_MESSAGE_BYTES


def _small_or_pair(ctx: Ctx, nbytes: int) -> bool:
    # With two ranks, recursive doubling moves the same bytes as ring in one round instead of two.
    return nbytes <= SMALL_MESSAGE_BYTES or ctx.size <= 2


def _large_and_three_or_more(ctx: Ctx, nbytes: int) -> bool:
    return nbytes > SMALL_MESSAGE_BYTES and ctx.size > 2


def _shm(ctx: Ctx, nbytes: int) -> bool:
    return ctx.team.shm is not None


# Up to this many bytes every member reduces the whole message from the slots in one round
# (``shm_direct``); above it, up to one slot, each member reduces its own part (``shm_split``),
# which moves about as many bytes but does 1/n of the arithmetic, for one more wait. Larger
# messages go through the slots chunk by chunk (``shm_pipelined``). Measured on 2 cores
# (benchmarks/shm_allreduce_ab.py, interleaved): with two ranks the two are within noise from
# 64 KiB to 512 KiB and split wins clearly at 1 MiB; with three or more split wins above 128 KiB.
SHM_DIRECT_BYTES = {2: 256 << 10}
SHM_DIRECT_BYTES_MANY = 128 << 10  # three or more members


def _shm_direct(ctx: Ctx, nbytes: int) -> bool:
    shm = ctx.team.shm
    return shm is not None and nbytes <= shm.slot_bytes and \
        nbytes <= SHM_DIRECT_BYTES.get(shm.size, SHM_DIRECT_BYTES_MANY)


def _shm_one_slot(ctx: Ctx, nbytes: int) -> bool:
    shm = ctx.team.shm
    return shm is not None and nbytes <= shm.slot_bytes


# ``nbytes`` is the size of the largest buffer a rank passes: the buffer for allreduce, broadcast
# and reduce; the gathered output for allgather and gather; the input for reduce_scatter, scatter
# and alltoall; 0 for barrier.
#
# Shared-memory rows go first in their collective, guarded by "the group has a shared-memory
# domain" (every member on this host, set up at group creation), so that they win whenever they
# apply and the rows below remain the fallback across hosts. Every collective of a group with a
# domain runs on it: the domain's per-call announcements are what detect mismatched calls there.
ROWS: tuple[Row, ...] = (
    Row("allreduce", "shm_direct", _shm_direct, shm_allreduce.direct, direct=True),
    Row("allreduce", "shm_split", _shm_one_slot, shm_allreduce.split, direct=True),
    Row("allreduce", "shm_pipelined", _shm, shm_allreduce.pipelined, direct=True),
    Row("allreduce", "recursive_doubling", _small_or_pair, allreduce.recursive_doubling),
    Row("allreduce", "ring", _always, allreduce.ring),
    Row("allgather", "shm_rounds", _shm, shm_allgather.allgather, direct=True),
    Row("allgather", "bruck", _small, allgather.bruck),
    Row("allgather", "ring", _always, allgather.ring),
    Row("reduce_scatter", "shm_rounds", _shm, shm_reduce_scatter.reduce_scatter, direct=True),
    Row("reduce_scatter", "ring", _always, reduce_scatter.ring),
    Row("broadcast", "shm_rounds", _shm, shm_broadcast.broadcast, direct=True),
    Row("broadcast", "scatter_allgather", _large_and_three_or_more, broadcast.scatter_allgather),
    Row("broadcast", "binomial_tree", _always, broadcast.binomial_tree),
    Row("reduce", "shm_direct", _shm_direct, shm_allreduce.reduce_direct, direct=True),
    Row("reduce", "shm_split", _shm_one_slot, shm_allreduce.reduce_split, direct=True),
    Row("reduce", "shm_pipelined", _shm, shm_allreduce.reduce_pipelined, direct=True),
    Row("reduce", "binomial_tree", _always, reduce.binomial_tree),
    Row("gather", "shm_rounds", _shm, shm_allgather.gather, direct=True),
    Row("gather", "linear", _always, gather_scatter.gather),
    Row("scatter", "shm_rounds", _shm, shm_broadcast.scatter, direct=True),
    Row("scatter", "linear", _always, gather_scatter.scatter),
    Row("alltoall", "shm_rounds", _shm, shm_alltoall.alltoall, direct=True),
    Row("alltoall", "pairwise_exchange", _always, alltoall.pairwise_exchange),
    Row("barrier", "shm_counters", _shm, shm_barrier.barrier, direct=True),
    Row("barrier", "dissemination", _always, barrier.dissemination),
)
_BY_COLLECTIVE: dict[str, tuple[Row, ...]] = {}
for _row in ROWS:
    _BY_COLLECTIVE[_row.collective] = _BY_COLLECTIVE.get(_row.collective, ()) + (_row,)


def _rows(collective: str) -> tuple[Row, ...]:
    rows = _BY_COLLECTIVE.get(collective)
    if rows is None:
        known = ", ".join(dict.fromkeys(row.collective for row in ROWS))
        raise ValueError(f"collective: unknown collective {collective!r}; expected one of {known}")
    return rows


def names(collective: str) -> list[str]:
    """Names of the algorithms available for ``collective``, in the order ``choose`` tries them.

    Raises:
        ValueError: ``collective`` is unknown.
    """
    return [row.name for row in _rows(collective)]


def choose(collective: str, ctx: Ctx, nbytes: int, override: str | None = None) -> Callable[..., None]:
    """The algorithm to run ``collective`` on ``ctx`` with ``nbytes`` per rank.

    Args:
        collective: e.g. ``"allreduce"``; see ``ROWS``.
        ctx: the call's group view (size, topology).
        nbytes: the size of the call's largest buffer (see the comment above ``ROWS``).
        override: an algorithm name from ``names(collective)``; skips the predicates.

    Raises:
        ValueError: ``collective`` is unknown, or ``override`` names no algorithm of it.
    """
    return pick(collective, ctx, nbytes, override).fn


def pick(collective: str, ctx: Ctx, nbytes: int, override: str | None = None) -> Row:
    """The row ``choose`` would take (its ``direct`` flag tells the calling convention).

    Raises:
        ValueError: as ``choose``.
    """
    rows = _rows(collective)
    if override is not None:
        for row in rows:
            if row.name == override:
                return row
        raise ValueError(f"override: unknown {collective} algorithm {override!r}; expected one of "
                         f"{', '.join(row.name for row in rows)}")
    for row in rows:
        if row.predicate(ctx, nbytes):
            return row
    raise AssertionError(f"no {collective} row matched; the last row of each collective must always hold")
