"""``Group.shrink`` on healthy groups, its arguments, who may call it, the proposal rule, and the
store it needs: one that rank 0 hosts dies with rank 0, and the survivors are told so."""

from __future__ import annotations

import os
import signal
import socket

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.core.elastic import choose
from tensorcomm.testing import run_ranks, spawn_ranks

pytestmark = pytest.mark.timeout(90)


def test_choose_keeps_arrived_live_members_in_group_order() -> None:
    members = (4, 1, 7, 3)
    arrived = {4: frozenset(), 7: frozenset(), 3: frozenset(), 1: frozenset()}
    assert choose(members, arrived, frozenset(), frozenset()) == (4, 1, 7, 3)
    assert choose(members, {4: frozenset(), 3: frozenset()}, frozenset(), frozenset()) == (4, 3)
    assert choose(members, arrived, frozenset({7}), frozenset({1})) == (4, 3)


def test_choose_leaves_out_the_later_of_two_members_whose_link_broke() -> None:
    # 1 and 3 are both alive but cannot reach each other: keeping both would fail the new
    # group's first call, and the next shrink would keep both again.
    arrived = {0: frozenset(), 1: frozenset({3}), 2: frozenset(), 3: frozenset({1})}
    assert choose((0, 1, 2, 3), arrived, frozenset(), frozenset()) == (0, 1, 2)
    one_sided = {0: frozenset(), 1: frozenset(), 2: frozenset(), 3: frozenset({1})}
    assert choose((0, 1, 2, 3), one_sided, frozenset(), frozenset()) == (0, 1, 2)


def body_healthy() -> dict:
    rank = tc.get_rank()
    group = tc.WORLD.shrink(timeout=20)
    x = np.full(4, float(rank + 1))
    tc.all_reduce(x, group=group)
    tc.barrier()  # the world goes on: nobody was left out
    pair = tc.new_group([1, 2])
    result = {"ranks": group.ranks, "rank": group.rank, "name": group.name, "sum": float(x[0]),
              "kind": group.transport_kind.name}
    if rank == 0:
        with pytest.raises(ValueError, match="not a member"):
            pair.shrink()
        return result
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        pair.shrink(timeout=0)
    first = pair.shrink()
    second = pair.shrink()  # shrinks are matched by their count on each group
    y = np.full(2, float(rank))
    tc.all_reduce(y, group=second)
    result.update(pair=[first.ranks, second.ranks, second.name, pair.name], pair_sum=float(y[0]))
    return result


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_healthy_group_shrinks_to_all_its_members(transport) -> None:
    env = {"TENSORCOMM_TRANSPORT": "tcp"} if transport == "tcp" else {}
    results = run_ranks(body_healthy, 3, timeout=60, env=env)
    for rank, result in enumerate(results):
        assert result["ranks"] == (0, 1, 2) and result["rank"] == rank, result
        assert result["name"] == "world/shrink0" and result["sum"] == 6.0, result
        assert result["kind"] == transport.upper(), result
    for result in results[1:]:
        assert result["pair"][:2] == [(1, 2), (1, 2)], result
        assert result["pair"][2] == result["pair"][3] + "/shrink1", result
        assert result["pair_sum"] == 3.0, result


def body_store_dies_with_rank_0(port: int) -> str:
    os.environ.update(TENSORCOMM_STORE_HOSTED="0", MASTER_PORT=str(port))
    tc.init(timeout=20)
    tc.barrier()
    if tc.get_rank() == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    with pytest.raises(tc.CommError):
        tc.all_reduce(np.ones(4))
    with pytest.raises(tc.RendezvousError) as caught:
        tc.WORLD.shrink()
    return str(caught.value)


def test_a_store_rank_0_hosts_dies_with_it_and_shrink_says_so() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    outcomes = spawn_ranks(body_store_dies_with_rank_0, 3, port, init=False, timeout=60)
    assert outcomes[0].exitcode == -signal.SIGKILL
    for outcome in outcomes[1:]:
        assert outcome.ok, outcome.output
        assert "shrink() lost the store" in outcome.result, outcome.result
        assert ("a store rank 0 hosts (env:// or tcp:// without a launcher, or beside torch's store) "
                "dies with rank 0") in outcome.result
