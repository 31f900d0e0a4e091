"""A rank killed while ``new_group`` or ``Group.split`` sets up the new group: its partners name
it (``PeerLostError``) at once, as a shrink's agreement would, instead of waiting out their
timeout on a store key; so every live rank reaches the shrink that follows in time and none is
left out of it.

The victim kills itself (SIGKILL) at one point of the set-up: before it posts the group's id (it
is the group's first rank), on entering the shared-memory set-up, after it (before saying so),
or before it posts its hierarchy (groups that span two "hosts", by host identity).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.core import world as world_mod
from tensorcomm.testing import spawn_ranks

pytestmark = [pytest.mark.fault, pytest.mark.timeout(240)]

TIMEOUT = 20.0  # the ranks' communication timeout: what a partner used to wait
VICTIM = 1


def _die(*_: Any, **__: Any) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)


def _die_after(method: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        method(*args, **kwargs)
        _die()
    return run


def _arm(point: str) -> None:
    """Make this process kill itself at ``point`` of its next group set-up."""
    cls = world_mod.World
    if point == "id":
        cls.take_group_id = _die  # type: ignore[method-assign]
    elif point == "shared memory":
        world_mod.open_domain = _die
    elif point == "after shared memory":
        cls.open_shared_memory = _die_after(cls.open_shared_memory)  # type: ignore[method-assign]
    elif point == "hierarchy":
        cls._part = _die_after(cls._part)  # type: ignore[method-assign]


def body_new_group(point: str) -> dict:
    hosts = "AABB" if point == "hierarchy" else "AAAA"
    os.environ["TENSORCOMM_HOST_ID"] = "host-" + hosts[int(os.environ["RANK"])]
    tc.init(timeout=TIMEOUT)
    rank, size = tc.get_rank(), tc.get_world_size()
    if rank == VICTIM:
        _arm(point)
    # The victim is the new group's first rank, so it is the one that posts the group's id.
    members = [VICTIM, *(r for r in range(size) if r != VICTIM)]
    start = time.monotonic()
    try:
        tc.new_group(members)
    except tc.CommError as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "rank": getattr(exc, "rank", None),
                "seconds": time.monotonic() - start}
    return {"error": None}


@pytest.mark.parametrize("point", ["id", "shared memory", "after shared memory", "hierarchy"])
def test_a_rank_killed_in_new_group_is_named_on_every_member(point: str) -> None:
    outcomes = spawn_ranks(body_new_group, 4, point, timeout=200, init=False)
    for outcome in outcomes:
        if outcome.rank == VICTIM:
            assert outcome.exitcode == -signal.SIGKILL, outcome.output
            continue
        assert outcome.ok, outcome.output
        result = outcome.result
        assert result["error"] is not None, (outcome.rank, result)
        assert result["error"].startswith("PeerLostError: "), (outcome.rank, result)
        assert result["rank"] == VICTIM and "was being made" in result["error"], (outcome.rank, result)
        assert result["seconds"] < TIMEOUT / 2, (outcome.rank, result)  # named, not waited out


SHRINK_TIMEOUT = 6.0  # how long the survivors of a shrink wait for a member that does not come


def body_split_then_shrink() -> dict:
    rank = tc.get_rank()
    if rank == VICTIM:
        _arm("shared memory")
    failure = None
    try:
        tc.WORLD.split(rank // 2)  # {0, 1} and {2, 3}: the victim dies setting up its half
        x = np.ones(4, np.float32)
        tc.all_reduce(x)  # {2, 3} learn of the death here
    except tc.CommError as exc:
        failure = f"{type(exc).__name__}: {exc}"
    try:
        survivors = tc.WORLD.shrink(timeout=SHRINK_TIMEOUT)
    except tc.CommError as exc:
        return {"failure": failure, "shrink": f"{type(exc).__name__}: {exc}"}
    x = np.ones(4, np.float32)
    tc.all_reduce(x, group=survivors)
    return {"failure": failure, "shrink": list(survivors.ranks), "sum": float(x[0])}


def test_a_rank_killed_in_split_leaves_no_live_rank_out_of_the_shrink() -> None:
    outcomes = spawn_ranks(body_split_then_shrink, 4, timeout=200, comm_timeout=TIMEOUT)
    for outcome in outcomes:
        if outcome.rank == VICTIM:
            continue
        assert outcome.ok, outcome.output
        result = outcome.result
        assert result["failure"] is not None and "PeerLostError" in result["failure"], (outcome.rank, result)
        assert result["shrink"] == [0, 2, 3] and result["sum"] == 3.0, (outcome.rank, result)
