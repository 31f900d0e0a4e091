"""Group.split and new_subgroups_by_enumeration on real ranks, shared memory and TCP. (scan and
exscan are in the shared tables: tests/multiprocess/test_collectives.py, tests/fault/test_mismatch.py.)"""

from __future__ import annotations

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.multiprocess

TRANSPORTS = {"shm": {}, "tcp": {"TENSORCOMM_TRANSPORT": "tcp"}}


def body_split() -> list:
    rank, size = tc.get_rank(), tc.get_world_size()
    world = tc.WORLD
    # parity colors, reversed keys; the last rank passes None and gets no group
    color = None if rank == size - 1 else rank % 2
    mine = world.split(color, key=-rank)
    if color is None:
        assert mine is None
    else:
        expected = sorted((r for r in range(size - 1) if r % 2 == color), reverse=True)
        assert mine.ranks == tuple(expected), (mine.ranks, expected)
        assert mine.rank == expected.index(rank)
        x = np.full(3, rank, np.int64)
        tc.all_reduce(x, group=mine)
        assert (x == sum(expected)).all()
    # negative color: no group; equal keys keep the parent's order
    other = world.split(-5 if rank == 0 else 7)
    assert (other is None) == (rank == 0)
    if other is not None:
        assert other.ranks == tuple(range(1, size))
        # split a split group: every member alone
        alone = other.split(rank, key=0)
        assert alone is not None and alone.ranks == (rank,)
    # torch's enumeration: the last rank is in no list
    lists = [list(range(0, size - 1, 2)), list(range(1, size - 1, 2))]
    lists = [ranks for ranks in lists if ranks]
    current, subgroups = tc.new_subgroups_by_enumeration(lists)
    assert [list(g.ranks) for g in subgroups] == lists
    if rank == size - 1:
        assert current is None
    else:
        assert current is not None and rank in current.ranks and current.is_member
        y = np.ones(1, np.float32)
        tc.all_reduce(y, group=current)
        assert y[0] == current.size
    return [None if mine is None else list(mine.ranks), current is None]


def body_split_name() -> str:
    if tc.get_rank() == 0:
        tc.new_group([0])  # only its member makes it: rank 0 has made one group more than the others
    return tc.WORLD.split(0).name


def test_a_split_group_has_one_name_on_every_member():
    names = run_ranks(body_split_name, 3, timeout=60)
    assert len(set(names)) == 1, names


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_split(world_size, transport):
    run_ranks(body_split, world_size, timeout=180, env=TRANSPORTS[transport])
