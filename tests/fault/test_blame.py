"""The right rank blamed: a rank stopped (SIGSTOP) before a hierarchical call, on a group of two
"hosts" (host identities AABB: host teams {0, 1} and {2, 3}, cross teams {0, 2} and {1, 3}).
Rank 1 stops; rank 0 waits for it inside its host; rank 2, whose cross-host partner is rank 0,
times out first (rank 0 comes to the call later). Its error must name the stopped rank 1, not
its live partner rank 0, who is only waiting for rank 1: a timeout asks every level of the
group where its members are, not only the sub-team it waited on.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import spawn_ranks

pytestmark = [pytest.mark.fault, pytest.mark.timeout(180)]

TIMEOUT = 6.0  # the ranks' communication timeout
STOPPED = 1
LATE = 2.0  # seconds rank 0 comes after the others, so rank 2 times out while rank 0 still waits


def body_stopped_in_a_hierarchical_call(work: str) -> dict:
    os.environ["TENSORCOMM_HOST_ID"] = "host-" + "AABB"[int(os.environ["RANK"])]
    tc.init(timeout=TIMEOUT)
    rank = tc.get_rank()
    x = np.ones(16, np.float32)
    tc.all_reduce(x)  # every sub-team has run once: what follows is the steady state
    assert tc.WORLD.last_call is not None and tc.WORLD.last_call.transport == "hier"
    tc.barrier()
    if rank == STOPPED:
        with open(os.path.join(work, "stopped.pid"), "w") as file:
            file.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
    if rank == 0:
        time.sleep(LATE)
    try:
        tc.all_reduce(x)
    except tc.CommError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        if rank == 0:  # the stopped rank has played its part
            with open(os.path.join(work, "stopped.pid")) as file:
                os.kill(int(file.read()), signal.SIGKILL)
    return {"error": None}


def test_a_stopped_rank_not_its_live_cross_host_partner_is_named(tmp_path: Path) -> None:
    outcomes = spawn_ranks(body_stopped_in_a_hierarchical_call, 4, str(tmp_path), timeout=120, init=False)
    errors = {o.rank: (o.result or {}).get("error") for o in outcomes if o.rank != STOPPED}
    for rank in (0, 2, 3):
        assert errors[rank] is not None, errors
        assert f"rank {STOPPED} did not" in errors[rank], (rank, errors)
    # Named first, as the cause; its live partner at most as waiting for it.
    assert re.search(rf"timed out after \S+ s: rank {STOPPED} did not answer", errors[2]), errors
