"""The shared-memory data-movement collectives at 2 ranks beside this host's copy bound.

Usage: python benchmarks/shm_movement.py [--sizes 64K,1M,16M] [--collectives all_gather,...]

Per collective and size (the whole buffer, as ``tensorcomm bench`` counts it): the median time
per call over batches (a batch's time is the slowest rank's), the copy bound of that call
(``tensorcomm.bench.bound``: its cheapest design's copies run alone, two processes at once)
and the ratio. For comparisons with MPICH use ``tensorcomm bench
--compare mpi``; this script exists to iterate quickly.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tensorcomm as tc
from tensorcomm.testing import run_ranks

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    return int(text[:-1]) * UNITS[text[-1]] if text[-1] in UNITS else int(text)


def _call(name: str, size: int) -> object:
    n, r = tc.get_world_size(), tc.get_rank()
    count = size // 4
    if name == "all_gather":
        send, out = np.full(count // n, r, np.float32), np.empty(count, np.float32)
        return lambda: tc.all_gather_into_tensor(out, send)
    if name == "broadcast":
        x = np.full(count, r, np.float32)
        return lambda: tc.broadcast(x, src=0)
    if name == "all_to_all":
        send, out = np.full(count, r, np.float32), np.empty(count, np.float32)
        return lambda: tc.all_to_all_single(out, send)
    if name == "reduce_scatter":
        send, out = np.full(count, r, np.float32), np.empty(count // n, np.float32)
        return lambda: tc.reduce_scatter_tensor(out, send)
    raise ValueError(f"collective: expected all_gather, broadcast, all_to_all or reduce_scatter, "
                     f"got {name!r}")


def measure(names: list[str], sizes: list[int], batches: int) -> dict[tuple[str, int], float]:
    times = {}
    for size in sizes:
        for name in names:
            call = _call(name, size)
            per_batch = max(2, min(2000, (64 << 20) // size))
            for _ in range(max(2, per_batch // 4)):
                call()  # type: ignore[operator]
            worst = np.zeros(batches)
            for b in range(batches):
                tc.barrier()
                start = time.perf_counter()
                for _ in range(per_batch):
                    call()  # type: ignore[operator]
                worst[b] = (time.perf_counter() - start) / per_batch
            tc.all_reduce(worst, op=tc.ReduceOp.MAX)
            times[(name, size)] = statistics.median(worst.tolist()) * 1e6
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64K,256K,1M,4M,16M,64M")
    parser.add_argument("--collectives", default="all_gather,broadcast,all_to_all,reduce_scatter")
    parser.add_argument("--batches", type=int, default=7)
    parser.add_argument("--no-bound", action="store_true",
                        help="times only (for tensorcomm trees without bench/bound.py)")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    names = args.collectives.split(",")
    times = run_ranks(measure, 2, names, sizes, args.batches, timeout=600)[0]
    if args.no_bound:
        for (name, size), us in times.items():
            print(f"{name:<15}{size:>10}{us:>11.1f}")
        return
    from tensorcomm.bench import bound

    designs = bound.measure(names, sizes, 2)
    print(f"{'collective':<15}{'size':>10}{'time(us)':>11}{'bound(us)':>11}{'÷ bound':>9}")
    for (name, size), us in times.items():
        floor = bound.bound_us(designs.get((name, size), {})) or float("nan")
        print(f"{name:<15}{size:>10}{us:>11.1f}{floor:>11.1f}{us / floor:>9.2f}")


if __name__ == "__main__":
    main()
