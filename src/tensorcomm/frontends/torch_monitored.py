"""``monitored_barrier``: a barrier that names the members that did not arrive.

Group rank 0 waits for an arrival message from every other member, in rank order, within one
deadline, then sends each a release message. A member missing at the deadline is named in the
RuntimeError rank 0 raises: the first one, or every one with ``wait_all_ranks``. The others
raise when no release comes in time. The messages travel on a tag of their own, so a barrier that
failed leaves nothing that a later call could match.

numpy only; the torch backend's ``monitored_barrier`` calls this.
"""

from __future__ import annotations

import time

import numpy as np

from ..core.group import Group
from ..errors import CommTimeoutError
from . import functional as F

_TAG = 2**31 - 7  # a user tag near the top of the range, which other calls rarely use


def monitored_barrier(group: Group, timeout: float | None, wait_all_ranks: bool) -> None:
    """Block until every member of ``group`` has arrived, or raise naming who did not.

    Args:
        group: the members.
        timeout: seconds for the whole barrier; None: the world's timeout.
        wait_all_ranks: rank 0 names every missing member rather than the first.

    Raises:
        RuntimeError: a member did not arrive (rank 0), or rank 0 did not release this member.
    """
    seconds = group._world.timeout if timeout is None else timeout
    deadline = time.monotonic() + seconds
    if group.rank != 0:
        root = group.global_rank(0)
        try:
            F.isend(np.zeros(1, np.uint8), root, group, _TAG).wait(seconds)
            F.irecv(np.zeros(1, np.uint8), root, group, _TAG).wait(max(deadline - time.monotonic(), 0.0))
        except CommTimeoutError:
            raise RuntimeError(f"monitored_barrier: rank {group.rank} was not released by rank 0 "
                               f"within {seconds:g} s (a member did not arrive)") from None
        return
    arrivals = {r: F.irecv(np.zeros(1, np.uint8), group.global_rank(r), group, _TAG)
                for r in range(1, group.size)}
    missing = []
    for rank, work in arrivals.items():
        try:
            work.wait(max(deadline - time.monotonic(), 0.0))
        except CommTimeoutError:
            missing.append(rank)
            if not wait_all_ranks:
                break
    if missing:
        which = f"ranks {missing}" if wait_all_ranks else f"rank {missing[0]}"
        raise RuntimeError(f"monitored_barrier: {which} of group {group.name!r} did not arrive "
                           f"within {seconds:g} s")
    for rank in arrivals:
        F.isend(np.zeros(1, np.uint8), group.global_rank(rank), group, _TAG).wait()
