"""Which algorithm runs a collective: an ordered table of candidates, each with a predicate.

``choose`` walks ``ROWS`` top to bottom and returns the first row of the collective whose
predicate holds for the call (its ``Ctx`` and message size); the last row of every collective
always holds. An override names a row explicitly. Algorithms' signatures differ per collective
(see each module); every row of one collective shares its collective's signature. This module
must not import ``core``. docs/algorithms.md explains the costs behind each choice.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from . import allgather, allreduce, alltoall, barrier, broadcast, gather_scatter, reduce, reduce_scatter
from .base import Ctx

# Up to this many bytes a message costs about one latency, so algorithms with fewer rounds win;
# above it, moving fewer bytes per rank wins. A first guess for one host: the benchmark suite
# (busbw per size, per algorithm through ``override``) is where to tune it.
SMALL_MESSAGE_BYTES = 64 * 1024

Predicate = Callable[[Ctx, int], bool]


class Row(NamedTuple):
    """One candidate: ``fn`` runs ``collective`` when ``predicate(ctx, nbytes)`` holds."""

    collective: str
    name: str
    predicate: Predicate
    fn: Callable[..., None]


def _always(ctx: Ctx, nbytes: int) -> bool:
    return True


def _small(ctx: Ctx, nbytes: int) -> bool:
    return nbytes <= SMALL_MESSAGE_BYTES


def _small_or_pair(ctx: Ctx, nbytes: int) -> bool:
    # With two ranks, recursive doubling moves the same bytes as ring in one round instead of two.
    return nbytes <= SMALL_MESSAGE_BYTES or ctx.size <= 2


def _large_and_three_or_more(ctx: Ctx, nbytes: int) -> bool:
    return nbytes > SMALL_MESSAGE_BYTES and ctx.size > 2


# ``nbytes`` is the size of the largest buffer a rank passes: the buffer for allreduce, broadcast
# and reduce; the gathered output for allgather and gather; the input for reduce_scatter, scatter
# and alltoall; 0 for barrier.
#
# Shared-memory rows go first in their collective, guarded by predicates on ``ctx`` (for example
# every entry of ``ctx.host_of`` equal: all ranks on one host), so that they win whenever they
# apply and the rows below remain the fallback across hosts.
ROWS: tuple[Row, ...] = (
    Row("allreduce", "recursive_doubling", _small_or_pair, allreduce.recursive_doubling),
    Row("allreduce", "ring", _always, allreduce.ring),
    Row("allgather", "bruck", _small, allgather.bruck),
    Row("allgather", "ring", _always, allgather.ring),
    Row("reduce_scatter", "ring", _always, reduce_scatter.ring),
    Row("broadcast", "scatter_allgather", _large_and_three_or_more, broadcast.scatter_allgather),
    Row("broadcast", "binomial_tree", _always, broadcast.binomial_tree),
    Row("reduce", "binomial_tree", _always, reduce.binomial_tree),
    Row("gather", "linear", _always, gather_scatter.gather),
    Row("scatter", "linear", _always, gather_scatter.scatter),
    Row("alltoall", "pairwise_exchange", _always, alltoall.pairwise_exchange),
    Row("barrier", "dissemination", _always, barrier.dissemination),
)


def _rows(collective: str) -> list[Row]:
    rows = [row for row in ROWS if row.collective == collective]
    if not rows:
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
    rows = _rows(collective)
    if override is not None:
        for row in rows:
            if row.name == override:
                return row.fn
        raise ValueError(f"override: unknown {collective} algorithm {override!r}; expected one of "
                         f"{', '.join(row.name for row in rows)}")
    for row in rows:
        if row.predicate(ctx, nbytes):
            return row.fn
    raise AssertionError(f"no {collective} row matched; the last row of each collective must always hold")
