"""Shared arrays: numpy arrays in the host's shared memory, which a group's members read in place.

``allocate`` is a collective of a group's members, as ``MPI_Win_allocate_shared`` and torch's
symmetric memory are: every member asks for the same shape and dtype, and gets its own block of
one segment that every member maps (``transports.shm.arena``: a memfd handed over an
authenticated socket, so nothing has a name in ``/dev/shm``; the kernel frees it with the last
mapping, whatever killed the ranks). The group's domain records the allocation
(``ShmDomain.add_shared``), so that its direct-read algorithms (``algorithms/shm_cma.py``) copy a
shared array straight out of its owner's block, once, at the speed of a copy through the caches.
A group without a shared-memory domain (members on several hosts, TCP forced) gets plain arrays.

Lifetime: the group keeps its allocations until it is destroyed (``destroy()`` included). An array
the caller still holds then stays valid memory, freed when the array is: but it is no longer any
group's, and a later collective treats it as a plain array.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CollectiveMismatchError
from ..transports.shm import arena
from ..transports.shm.arena import ShmUnavailable
from .group import inside

if TYPE_CHECKING:
    from .group import Group

log = logging.getLogger("tensorcomm.shm")

PAGE = 4096


def allocate(group: Group, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """This member's zero-filled array of ``shape`` and ``dtype`` in ``group``'s shared memory;
    every member calls it with the same shape and dtype (a plain array where the group has no
    shared-memory domain, or the array is empty).

    Raises:
        CollectiveMismatchError: members asked for different shapes or dtypes (on every member).
        CommTimeoutError: a member did not call it within the group's timeout.
    """
    its = inside(group)
    target = its.group
    team = its.team()
    nbytes = math.prod(shape) * dtype.itemsize
    domain = team.shm
    if domain is None or nbytes == 0:
        return np.zeros(shape, dtype)
    world = its.world
    store = world.store
    index, domain.allocations = domain.allocations, domain.allocations + 1
    prefix = f"shm/{team.group_id}/array{index}/"
    asked = f"{dtype.str}{list(shape)}"
    store.set(prefix + f"asked/{team.rank}", asked.encode())
    keys = [prefix + f"asked/{q}" for q in range(team.size)]
    store.wait(keys, timeout=team.timeout)
    for q, key in enumerate(keys):
        theirs = store.get(key).decode()
        if theirs != asked:
            raise CollectiveMismatchError(
                f"rank {team.ranks[q]} asked for a shared array of {theirs} while rank "
                f"{team.ranks[team.rank]} asked for {asked}, in group {target.name!r}")
    block = -(-nbytes // PAGE) * PAGE
    segment = None
    try:
        segment = arena.establish(team.rank, team.size, team.size * block, world.rendezvous.secret,
                                  *world.segment_exchange(prefix, team.ranks), team.timeout)
    except ShmUnavailable as exc:
        log.warning("group %r: rank %d cannot make a shared array (%s); it gets a plain one",
                    target.name, world.rank, exc)
        store.set(prefix + "failed", f"rank {world.rank}: {exc}".encode())
    store.set(prefix + f"ready/{team.rank}", b"0" if segment is None else b"1")
    ready = [prefix + f"ready/{q}" for q in range(team.size)]
    store.wait(ready, timeout=team.timeout)
    if not all(store.get(key) == b"1" for key in ready):
        if segment is not None:
            segment.close()
        return np.zeros(shape, dtype)
    assert segment is not None
    mine = domain.add_shared(segment, block)
    its.plans.clear()  # selection now knows the group has shared arrays (select._reads)
    return mine[:nbytes].view(dtype).reshape(shape)
