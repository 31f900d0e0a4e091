"""``monitored_barrier``: a barrier that names the members that did not arrive.

It meets on the job's store, not on the transport: every member but group rank 0 sets a key
that says it arrived, rank 0 waits for those keys in rank order within one deadline, then sets
a key that releases the others. A member missing at the deadline is named in the RuntimeError
rank 0 raises: the first one, or every one with ``wait_all_ranks``. The others raise when no
release comes in time. Keys are numbered per call and group (each member counts its own calls
in the store), so a barrier that failed leaves nothing behind that a later call could take for
its own: no receive stays posted, and a late arrival only sets a key of its own call. Each call
leaves a few bytes per member in the store.

numpy-free and torch-free; the torch backend's ``monitored_barrier`` calls this.
"""

from __future__ import annotations

import time

from ..core.group import Group
from ..errors import CommTimeoutError


def monitored_barrier(group: Group, timeout: float | None, wait_all_ranks: bool) -> None:
    """Block until every member of ``group`` has arrived, or raise naming who did not.

    Args:
        group: the members.
        timeout: seconds for the whole barrier; None: the world's timeout.
        wait_all_ranks: rank 0 names every missing member rather than the first.

    Raises:
        RuntimeError: a member did not arrive (rank 0), or rank 0 did not release this member.
    """
    world = group._world
    store = world.store
    seconds = world.timeout if timeout is None else timeout
    deadline = time.monotonic() + seconds
    base = f"monitored/{group._group_id}"
    call = f"{base}/{store.add(f'{base}/calls/{group.rank}', 1)}"
    if group.rank != 0:
        store.set(f"{call}/arrived/{group.rank}", b"1")
        try:
            store.wait([f"{call}/released"], max(deadline - time.monotonic(), 0.0))
        except CommTimeoutError:
            raise RuntimeError(f"monitored_barrier: rank {group.rank} was not released by rank 0 "
                               f"within {seconds:g} s (a member did not arrive)") from None
        return
    missing = []
    for rank in range(1, group.size):
        try:
            store.wait([f"{call}/arrived/{rank}"], max(deadline - time.monotonic(), 0.0))
        except CommTimeoutError:
            missing.append(rank)
            if not wait_all_ranks:
                break
    if missing:
        which = f"ranks {missing}" if wait_all_ranks else f"rank {missing[0]}"
        raise RuntimeError(f"monitored_barrier: {which} of group {group.name!r} did not arrive "
                           f"within {seconds:g} s")
    store.set(f"{call}/released", b"1")
