"""Whether processes of this host still run, watched without holding a descriptor per process.

A pidfd per peer costs one descriptor each, so a rank among n on one host would hold n of them
for every group: descriptors that grow with the job. Reading ``/proc/<pid>/stat`` holds none; it
costs about 3 us per peer and look, and a look happens only while a rank waits (every
``slots.LIVENESS_SECONDS`` at most). A process counts as gone once it is a zombie or absent, or
when its pid names a newer process (the start time differs from the one first seen), so a
recycled pid is not taken for the peer.

Imports the standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Collection


def start_time(pid: int) -> int | None:
    """The start time (clock ticks since boot) of running process ``pid``; None if it is gone
    (absent, a zombie, or dead)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        line = os.read(fd, 1024)
    except OSError:
        return None
    finally:
        os.close(fd)
    # The command name may hold spaces and parentheses: the fields follow its last ")".
    fields = line.rsplit(b")", 1)[-1].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X", b"x"):
        return None
    return int(fields[19])  # field 22 of stat(5), counted from the state (field 3)


class ProcessWatch:
    """Watches processes of this host, named by key (a rank), for their end.

    Args:
        pids: key -> pid. A process already gone is reported gone at the first look.
        started: key -> the start time published by the process itself (``start_time``), for
            processes this one did not see start; by default read now.
    """

    def __init__(self, pids: dict[int, int], started: dict[int, int] | None = None) -> None:
        self._pids = dict(pids)
        self.keys = frozenset(pids)
        self._started = {key: (started or {}).get(key, start_time(pid)) for key, pid in pids.items()}

    def dead(self, keys: Collection[int] | None = None) -> list[int]:
        """The watched keys (all, or those in ``keys``) whose process has ended, sorted."""
        watched = self._pids if keys is None else [k for k in self._pids if k in keys]
        return sorted(key for key in watched
                      if self._started[key] is None or start_time(self._pids[key]) != self._started[key])
