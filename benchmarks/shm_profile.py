"""Where a shared-memory collective's time goes, per rank: copying or waiting for the peer.

Usage: PYTHONPATH=src:benchmarks python benchmarks/shm_profile.py [--sizes 1M,4M]
           [--collectives all_reduce,all_gather,...] [--calls 50] [--pin]

Runs each collective at 2 ranks through the public API with the shared-memory waits instrumented
(``Slots._block``, entered when a peer's counter is not there yet, and ``Slots._sleep``, a futex
sleep), and prints per rank and call: the time per call, the part of it spent blocked in waits,
the blocked waits, futex sleeps and (minor) page faults per call. Time not blocked is this rank's
own work (copies, reductions, Python). Also prints, per collective and size, what each design's
copies take alone (``bench.bound``: the same copies on the same kinds of buffers, both processes
at once, without the protocol), the floor that work is measured against.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np
from shm_movement import _call, parse_size  # same directory

import tensorcomm as tc
from tensorcomm.testing import run_ranks
from tensorcomm.transports.shm import slots


def _instrument() -> dict[str, float]:
    stats = {"blocked_ns": 0.0, "blocks": 0.0, "sleeps": 0.0}
    block, sleep = slots.Slots._block, slots.Slots._sleep

    def timed_block(self: slots.Slots, *args: object) -> None:
        t0 = time.perf_counter_ns()
        try:
            block(self, *args)  # type: ignore[arg-type]
        finally:
            stats["blocked_ns"] += time.perf_counter_ns() - t0
            stats["blocks"] += 1

    def counted_sleep(self: slots.Slots, *args: object) -> None:
        stats["sleeps"] += 1
        sleep(self, *args)  # type: ignore[arg-type]

    slots.Slots._block = timed_block  # type: ignore[method-assign]
    slots.Slots._sleep = counted_sleep  # type: ignore[method-assign]
    return stats


def _all_reduce(size: int) -> object:
    x = np.ones(size // 4, np.float32)
    return lambda: tc.all_reduce(x)


def profile(names: list[str], sizes: list[int], calls: int, pin: bool) -> list[str]:
    if pin:  # rank r on CPU r: the two ranks cannot share a core
        os.sched_setaffinity(0, {tc.get_rank() % os.cpu_count()})  # type: ignore[operator]
    stats = _instrument()
    lines = []
    for size in sizes:
        for name in names:
            call = _all_reduce(size) if name == "all_reduce" else _call(name, size)
            for _ in range(5):
                call()  # type: ignore[operator]
            tc.barrier()
            for key in stats:
                stats[key] = 0.0
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                call()  # type: ignore[operator]
            per_call = (time.perf_counter_ns() - t0) / calls / 1e3
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            blocked = stats["blocked_ns"] / calls / 1e3
            lines.append(f"rank {tc.get_rank()} {name:<15}{size:>10}{per_call:>10.1f}{blocked:>10.1f}"
                         f"{per_call - blocked:>10.1f}{stats['blocks'] / calls:>8.2f}"
                         f"{stats['sleeps'] / calls:>8.2f}{faults / calls:>8.1f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1M,4M")
    parser.add_argument("--collectives", default="all_reduce,all_gather,broadcast,all_to_all,reduce_scatter")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--pin", action="store_true", help="rank r runs on CPU r only")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    print(f"{'':7}{'collective':<15}{'size':>10}{'us/call':>10}{'blocked':>10}{'working':>10}"
          f"{'waits':>8}{'sleeps':>8}{'faults':>8}")
    for lines in run_ranks(profile, 2, args.collectives.split(","), sizes, args.calls, args.pin, timeout=600):
        print("\n".join(lines))
    from tensorcomm.bench import bound

    designs = bound.measure(args.collectives.split(","), sizes, 2)
    for (name, size), times in designs.items():
        print(f"copies alone (bench.bound, 2 at once), {name} {size} B: " +
              ", ".join(f"{design} {us:.1f} us" for design, us in sorted(times.items())))

if __name__ == "__main__":
    main()
