"""A rank's descriptors do not grow with the ranks on its host: partners get no TCP link at init
and are watched through /proc, not a pidfd each (issue 45)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import run_ranks
from tensorcomm.transports.shm import slots

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(not slots.SUPPORTED, reason="shared memory needs x86-64")]


def body_descriptors() -> int:
    x = np.ones(8)
    tc.all_reduce(x)
    tc.barrier()
    assert x[0] == tc.get_world_size()
    return len(os.listdir("/proc/self/fd")) - 1  # less the one listing the directory


def test_descriptors_per_rank_do_not_grow_with_the_world() -> None:
    small = run_ranks(body_descriptors, 2, timeout=120)
    large = run_ranks(body_descriptors, 6, timeout=120)
    # Rank 0 may serve the store (a connection per rank); every other rank holds the same.
    assert max(large[1:]) == max(small[1:]), (small, large)
