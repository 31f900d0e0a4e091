"""A rank short of file descriptors while groups are made: the group's set-up fails on every
member at once, and every member's error names the descriptor limit (``RLIMIT_NOFILE``), its
value and how to raise it, instead of the members waiting out their timeout and falling back.

One rank (the groups' shared-memory leader, or a member that is not) lowers its own limit to a
few descriptors above what it holds, then every rank makes groups until one fails.
"""

from __future__ import annotations

import os
import resource
import time

import pytest

import tensorcomm as tc
from tensorcomm.testing import run_ranks

pytestmark = [pytest.mark.fault, pytest.mark.timeout(240)]

TIMEOUT = 20.0  # the ranks' communication timeout: what a member used to wait before falling back
HEADROOM = 12  # descriptors the short rank keeps free: enough for a few groups, not for many


def body_groups_until_short(short: int) -> dict:
    if tc.get_rank() == short:
        used = len(os.listdir("/proc/self/fd"))
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (used + HEADROOM, hard))
    groups, error = [], None
    for _ in range(200):
        start = time.monotonic()
        try:
            group = tc.new_group(list(range(tc.get_world_size())))
        except tc.CommError as exc:
            error = f"{type(exc).__name__}: {exc}"
            break
        if group.transport_kind.name != "SHM":
            error = "the group fell back to TCP"
            break
        groups.append(group)
    return {"made": len(groups), "error": error, "seconds": time.monotonic() - start,
            "limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}


@pytest.mark.parametrize("world_size, short", [(2, 0), (3, 1)],
                         ids=["2 ranks, leader short", "3 ranks, member short"])
def test_every_member_names_the_descriptor_limit_at_once(world_size: int, short: int) -> None:
    results = run_ranks(body_groups_until_short, world_size, short, timeout=200,
                        env={"TENSORCOMM_TIMEOUT": str(TIMEOUT)})
    limit = results[short]["limit"]
    assert len({r["made"] for r in results}) == 1, results  # the same group failed everywhere
    for result in results:
        error = result["error"]
        assert error is not None and error.startswith("RendezvousError: "), results
        assert f"RLIMIT_NOFILE = {limit}" in error and "ulimit -n" in error, results
        assert f"rank {short}: this process is out of file descriptors" in error, results
        assert result["seconds"] < TIMEOUT / 2, results  # told, not waited out
