"""Algorithm selection: the rows of select.py, their order, and overrides."""

from __future__ import annotations

import pytest

from tensorcomm.algorithms import allgather, allreduce, broadcast, select
from tensorcomm.algorithms.base import Ctx
from tensorcomm.transports.loopback import LoopbackHub

SMALL = select.SMALL_MESSAGE_BYTES
COLLECTIVES = ["allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter",
               "alltoall", "barrier"]


def ctx_of(size: int) -> Ctx:
    return Ctx(LoopbackHub(size).transport(0), range(size), 0, group_id=0, seq=0, timeout=1.0)


@pytest.mark.parametrize("size, nbytes, expected", [
    (4, 0, allreduce.recursive_doubling),
    (4, SMALL, allreduce.recursive_doubling),
    (4, SMALL + 1, allreduce.ring),
    (7, 10 << 20, allreduce.ring),
    (2, 10 << 20, allreduce.recursive_doubling),
    (1, 10 << 20, allreduce.recursive_doubling),
])
def test_allreduce_rows(size, nbytes, expected):
    assert select.choose("allreduce", ctx_of(size), nbytes) is expected


@pytest.mark.parametrize("size, nbytes, expected", [
    (5, SMALL, allgather.bruck),
    (5, SMALL + 1, allgather.ring),
])
def test_allgather_rows(size, nbytes, expected):
    assert select.choose("allgather", ctx_of(size), nbytes) is expected


@pytest.mark.parametrize("size, nbytes, expected", [
    (3, SMALL + 1, broadcast.scatter_allgather),
    (3, SMALL, broadcast.binomial_tree),
    (2, 10 << 20, broadcast.binomial_tree),
])
def test_broadcast_rows(size, nbytes, expected):
    assert select.choose("broadcast", ctx_of(size), nbytes) is expected


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_collective_has_a_fallback_row_that_always_holds(collective):
    rows = [row for row in select.ROWS if row.collective == collective]
    assert [row.name for row in rows] == select.names(collective)
    assert len(set(select.names(collective))) == len(rows)
    for size in (1, 2, 3, 8):
        for nbytes in (0, SMALL + 1, 1 << 30):
            assert rows[-1].predicate(ctx_of(size), nbytes)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_override_returns_the_named_row(collective):
    for row in select.ROWS:
        if row.collective == collective:
            assert select.choose(collective, ctx_of(4), 0, override=row.name) is row.fn


def test_override_beats_the_predicates():
    assert select.choose("allreduce", ctx_of(4), 0, override="ring") is allreduce.ring


def test_unknown_override_lists_the_algorithms_of_the_collective():
    with pytest.raises(ValueError, match="unknown allreduce algorithm 'tree'.*recursive_doubling, ring"):
        select.choose("allreduce", ctx_of(4), 0, override="tree")


def test_unknown_collective_lists_the_known_ones():
    with pytest.raises(ValueError, match="'allreduse'.*allreduce, allgather"):
        select.choose("allreduse", ctx_of(2), 0)
    with pytest.raises(ValueError, match="allreduse"):
        select.names("allreduse")
