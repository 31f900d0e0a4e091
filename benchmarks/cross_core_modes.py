"""How fast one core copies what another just wrote, in fresh process pairs one after another.

Usage: python benchmarks/cross_core_modes.py [--pairs 10] [--mib 4]

No tensorcomm: two processes share an anonymous mapping of two buffers. The writer copies its
array into buffer ``k % 2`` and raises a counter; the reader waits for it and copies the buffer
out, while the writer fills the other one (as a run of staged broadcasts does). Each pair prints
the median µs per round of its batches and the load. On the 2-core VM this flips between two
levels for seconds at a time (docs/algorithms.md, "The copy bound"): timings of copies taken
seconds apart can differ by that factor whatever code runs, which is why the bench interleaves
libraries per size and times the copy bound beside its rows.
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
ROUNDS, BATCHES = 40, 5


def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    for a in range(0, dst.size, PIECE):
        dst[a:a + PIECE] = src[a:a + PIECE]


def _side(role: int, nbytes: int, buffers: mmap.mmap, flags: mmap.mmap, barrier: Any, out: Any) -> None:
    both = np.frombuffer(buffers, np.uint8).reshape(2, nbytes)
    count = np.frombuffer(flags, np.int64)  # [0]: rounds written, [1]: rounds read
    mine = np.full(nbytes, role + 1, np.uint8)
    barrier.wait()
    times, k = [], 0
    for _ in range(BATCHES):
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
        times.append((time.perf_counter() - start) / ROUNDS * 1e6)
    if role == 1:
        out.value = statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--mib", type=int, default=4)
    args = parser.parse_args()
    nbytes = args.mib << 20
    context = get_context("fork")
    for pair in range(args.pairs):
        buffers, flags = mmap.mmap(-1, 2 * nbytes), mmap.mmap(-1, mmap.PAGESIZE)
        barrier, out = context.Barrier(2), context.Value("d", 0.0)
        sides = [context.Process(target=_side, args=(role, nbytes, buffers, flags, barrier, out))
                 for role in (0, 1)]
        for side in sides:
            side.start()
        for side in sides:
            side.join(timeout=60)
            if side.is_alive():
                side.kill()
                raise SystemExit(f"pair {pair}: a side did not finish within 60 s")
        print(f"pair {pair}: {out.value:7.1f} us per {args.mib} MiB round "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
