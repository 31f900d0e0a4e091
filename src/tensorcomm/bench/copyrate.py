"""How fast one core reads what another just wrote: the host's cross-core copy rate, briefly.

``tensorcomm bench`` prints it beside its tables, since a host's rate can halve for hours (a VM
placed across sockets) and every copy-bound cell moves with it. Two fresh processes share two
buffers; one copies an array into buffer ``k % 2`` and raises a counter, the other waits for it
and copies the buffer out, in pieces of ``PIECE`` bytes (as the shared-memory slots copy), for
``seconds``. ``benchmarks/cross_core_modes.py`` is the long form (many fresh pairs, CPUs, load).
No tensorcomm: numpy and the standard library only.
"""

from __future__ import annotations

import mmap
import statistics
import time
from multiprocessing import get_context
from typing import Any

import numpy as np

PIECE = 512 << 10  # bytes per copy (shm_common.PIECE_BYTES)
ROUNDS = 20  # per batch
NBYTES = 4 << 20  # per round


def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    for a in range(0, dst.size, PIECE):
        dst[a:a + PIECE] = src[a:a + PIECE]


def _side(role: int, nbytes: int, seconds: float, buffers: mmap.mmap, flags: mmap.mmap,
          times: Any) -> None:
    both = np.frombuffer(buffers, np.uint8).reshape(2, nbytes)
    count = np.frombuffer(flags, np.int64)  # [0]: rounds written, [1]: rounds read, [2]: batches timed
    mine = np.full(nbytes, role + 1, np.uint8)
    count[3 + role] = 1  # here: the clock starts once both are
    while not count[4 - role]:
        pass
    k, end = 0, time.perf_counter() + seconds
    if role == 0:  # the writer: until the reader has timed enough
        while not count[2]:
            while count[1] < k - 1:  # the reader is done with round k - 2, in this buffer
                if count[2]:
                    return
            _copy(both[k & 1], mine)
            count[0] = k = k + 1
        return
    for batch in range(len(times)):
        start = time.perf_counter()
        for _ in range(ROUNDS):
            while count[0] < k + 1:
                pass
            _copy(mine, both[k & 1])
            count[1] = k = k + 1
        times[batch] = (time.perf_counter() - start) / ROUNDS * 1e6
        if time.perf_counter() >= end or batch + 1 == len(times):
            count[2] = batch + 1
            return


def measure(seconds: float = 0.3, nbytes: int = NBYTES) -> tuple[float, float] | None:
    """The fastest and the median batch's µs per round of ``nbytes`` copied in by one process
    and out by another, over about ``seconds``; None where the two processes cannot run (or hang
    for 30 s)."""
    context = get_context("fork")
    buffers, flags = mmap.mmap(-1, 2 * nbytes), mmap.mmap(-1, mmap.PAGESIZE)
    times = context.Array("d", 10_000, lock=False)
    sides = [context.Process(target=_side, daemon=True, args=(role, nbytes, seconds, buffers, flags, times))
             for role in (0, 1)]
    try:
        for side in sides:
            side.start()
        deadline = time.monotonic() + 30 + seconds
        for side in sides:
            side.join(timeout=max(0.0, deadline - time.monotonic()))
    except OSError:
        return None
    finally:
        for side in sides:
            if side.is_alive():
                side.kill()
                side.join()
    done = int(np.frombuffer(flags, np.int64)[2])
    if done == 0 or any(side.exitcode != 0 for side in sides):
        return None
    return min(times[:done]), statistics.median(times[:done])


def line(measured: tuple[float, float] | None, nbytes: int = NBYTES) -> str:
    """The header line that reports ``measure``'s result."""
    if measured is None:
        return "# cross-core copy: not measured (the two processes did not run)"
    fastest, median = measured
    return (f"# cross-core copy: {nbytes >> 20} MiB written by one process and read by another in "
            f"{median:.0f} us per round, median ({nbytes / median / 1e3:.1f} GB/s), fastest batch "
            f"{fastest:.0f} us ({nbytes / fastest / 1e3:.1f} GB/s); copy-bound cells move with it "
            "(benchmarks/cross_core_modes.py has the long form)")
