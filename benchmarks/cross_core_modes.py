"""How fast one core copies what another just wrote, in fresh process pairs one after another.

Usage: python benchmarks/cross_core_modes.py [--pairs 10] [--mib 4] [--seconds 1]

No tensorcomm: two processes share an anonymous mapping of two buffers. The writer copies its
array into buffer ``k % 2`` and raises a counter; the reader waits for it and copies the buffer
out, while the writer fills the other one (as a run of staged broadcasts does). Each pair runs
for ``--seconds`` in batches of 40 rounds and prints the fastest, median and slowest batch (µs
per round), the CPU each side ran on at the end, and the load. On the 2-core VM the median
jumps between levels from one pair to the next while each pair keeps its level (docs/
algorithms.md, "The copy bound"): timings of copies taken seconds apart can differ by that
factor whatever code runs, which is why the bench interleaves libraries per size and times the
copy bound beside its rows.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time
from multiprocessing import get_context
from typing import Any

import numpy as np

PIECE = 512 << 10  # as tensorcomm's slots copy (shm_common.PIECE_BYTES)
ROUNDS = 40  # per batch
BATCHES = 512  # at most, per pair


def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    for a in range(0, dst.size, PIECE):
        dst[a:a + PIECE] = src[a:a + PIECE]


def _cpu() -> int:
    """The CPU this process last ran on (field 39 of /proc/self/stat)."""
    with open("/proc/self/stat", encoding="ascii") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def _side(role: int, nbytes: int, batches: int, buffers: mmap.mmap, flags: mmap.mmap, barrier: Any,
          times: Any, cpus: Any) -> None:
    both = np.frombuffer(buffers, np.uint8).reshape(2, nbytes)
    count = np.frombuffer(flags, np.int64)  # [0]: rounds written, [1]: rounds read
    mine = np.full(nbytes, role + 1, np.uint8)
    barrier.wait()
    k = 0
    for batch in range(batches):
        start = time.perf_counter()
        for _ in range(ROUNDS):
            if role == 0:
                while count[1] < k - 1:  # the reader is done with round k - 2, in this buffer
                    pass
                _copy(both[k & 1], mine)
                count[0] = k + 1
            else:
                while count[0] < k + 1:
                    pass
                _copy(mine, both[k & 1])
                count[1] = k + 1
            k += 1
        if role == 1:
            times[batch] = (time.perf_counter() - start) / ROUNDS * 1e6
    cpus[role] = _cpu()


def _pair(context: Any, nbytes: int, batches: int) -> tuple[list[float], list[int]]:
    buffers, flags = mmap.mmap(-1, 2 * nbytes), mmap.mmap(-1, mmap.PAGESIZE)
    barrier = context.Barrier(2)
    times, cpus = context.Array("d", batches), context.Array("i", 2)
    sides = [context.Process(target=_side, daemon=True,
                             args=(role, nbytes, batches, buffers, flags, barrier, times, cpus))
             for role in (0, 1)]
    for side in sides:
        side.start()
    deadline = time.monotonic() + 60 + batches * ROUNDS * nbytes / 1e9
    for side in sides:
        side.join(timeout=max(0.0, deadline - time.monotonic()))
    if any(side.is_alive() or side.exitcode != 0 for side in sides):
        for side in sides:
            side.kill()
        raise SystemExit(f"a side failed or hung (exit codes {[side.exitcode for side in sides]})")
    return list(times), list(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=1.0, help="per pair (about)")
    args = parser.parse_args()
    nbytes = args.mib << 20
    context = get_context("fork")
    # a batch at the fast level takes ROUNDS x ~20 us per MiB
    batches = max(3, min(BATCHES, round(args.seconds / (ROUNDS * 20e-6 * args.mib))))
    for pair in range(args.pairs):
        times, cpus = _pair(context, nbytes, batches)
        print(f"pair {pair}: {len(times)} batches, us per {args.mib} MiB round: fastest "
              f"{min(times):.1f}, median {statistics.median(times):.1f}, slowest {max(times):.1f}; "
              f"CPUs {cpus[0]} and {cpus[1]}; load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
