"""What each benchmarked collective moves, and nccl-tests' bandwidth formulas.

The size of a row is the size nccl-tests reports: the whole buffer of the collective (for the
gathering and scattering ones, all ranks' blocks together), so the rows of different collectives
line up by size. ``algbw = size / time``; ``busbw`` scales it by the fraction of the data a rank
must send or receive in an optimal algorithm, which makes it comparable with the link (here:
memory) bandwidth whatever the rank count (nccl-tests' doc/PERFORMANCE.md):

    collective       busbw / algbw     per-rank input   per-rank output
    all_reduce       2(n-1)/n          count            (in place)
    reduce_scatter   (n-1)/n           count            count/n
    all_gather       (n-1)/n           count/n          count
    all_to_all       (n-1)/n           count            count
    gather, scatter  (n-1)/n           count/n, count   count, count/n  (root side)
    broadcast        1                 count            (in place)
    reduce           1                 count            (in place, on the root)
    send_recv        1                 count            (in place; OSU's osu_latency)

``send_recv`` is point to point, not a collective: rank 0 sends the buffer to rank 1, which sends
it back (the other ranks idle). Its time is the one-way latency, half the round trip, as
osu_latency reports it, so its algbw (= busbw) is size / latency, the bandwidth that latency
implies (not osu_bw's, which streams a window of messages back to back).

Pure functions, no numpy: imported by the parent and by every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9  # bandwidths are in GB/s (10^9 bytes), as in nccl-tests


@dataclass(frozen=True)
class Collective:
    """One benchmarked collective: its bandwidth factor and how its buffers are shaped."""

    name: str
    bus_numerator: int  # busbw factor is bus_numerator * (n - 1) / n, or 1 when it is 0
    blocked: bool  # the buffer splits into n equal per-rank blocks
    reduces: bool  # takes a reduction op
    rooted: bool  # has a root rank (always 0 here)
    round_trip: bool = False  # one call is a ping-pong: its time is halved (one-way latency)

    def bus_factor(self, ranks: int) -> float:
        """busbw / algbw for ``ranks`` ranks (nccl-tests' formula)."""
        if self.bus_numerator == 0:
            return 1.0
        return self.bus_numerator * (ranks - 1) / ranks


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (
    Collective("all_reduce", 2, blocked=False, reduces=True, rooted=False),
    Collective("all_gather", 1, blocked=True, reduces=False, rooted=False),
    Collective("reduce_scatter", 1, blocked=True, reduces=True, rooted=False),
    Collective("all_to_all", 1, blocked=True, reduces=False, rooted=False),
    Collective("broadcast", 0, blocked=False, reduces=False, rooted=True),
    Collective("reduce", 0, blocked=False, reduces=True, rooted=True),
    Collective("gather", 1, blocked=True, reduces=False, rooted=True),
    Collective("scatter", 1, blocked=True, reduces=False, rooted=True),
    Collective("send_recv", 0, blocked=False, reduces=False, rooted=False, round_trip=True),
)}


def element_count(collective: str, nbytes: int, itemsize: int, ranks: int) -> int:
    """Elements of the whole buffer for a requested size, as nccl-tests rounds it.

    At least one element, and for blocked collectives a multiple of ``ranks`` (at least one
    element per rank), so the size actually measured may be below or above the one asked for.
    """
    count = max(1, nbytes // itemsize)
    if COLLECTIVES[collective].blocked:
        count = max(ranks, count // ranks * ranks)
    return count


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: the buffer size over the time of one call."""
    return nbytes / seconds / GB if seconds > 0 else float("inf")


def busbw(collective: str, nbytes: int, seconds: float, ranks: int) -> float:
    """Bus bandwidth in GB/s: ``algbw`` times the collective's factor (see the module doc)."""
    return algbw(nbytes, seconds) * COLLECTIVES[collective].bus_factor(ranks)
