"""One extra identical call on one rank (issue 21): the extra call itself cannot be told from the
peer's next call (their signatures agree; MPI cannot tell either), but the call after it, which
the peer never makes, must name what happened (the ranks' call sequences differ) instead of
blaming the peer's ``destroy()`` alone."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.fault

TRANSPORTS = {"tcp": {"TENSORCOMM_TRANSPORT": "tcp"}, "shm": {}}


def body_extra_call() -> str:
    """Rank 0 makes one all_reduce more than rank 1; rank 1 then leaves (destroy)."""
    calls = 3 if tc.get_rank() == 0 else 2
    try:
        for _ in range(calls):
            tc.all_reduce(np.ones(4, np.float32))
    except tc.CommError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_call_after_an_extra_one_names_a_sequence_mismatch(transport: str) -> None:
    first, second = run_ranks(body_extra_call, 2, timeout=60, env=TRANSPORTS[transport])
    assert second == "ok", second  # rank 1 made all of its calls (one matched rank 0's extra)
    assert first.startswith("PeerLostError"), first
    # Steps count from 0: rank 0's third call is step 2; rank 1 left after step 1.
    assert "sequence mismatch" in first and "call sequences differ" in first, first
    assert "all_reduce" in first and "at step 2" in first, first
    if transport == "shm":  # the segment shows the peer's last announced step
        assert "its last call in the group was step 1" in first, first
