"""Small-message latency through the public API: median time per call over batches, per rank count.

Usage: python benchmarks/shm_latency.py [--ranks 2,4] [--bytes 8] [--calls 20000] [--transport tcp]

Each batch starts after a barrier; a batch's time is the slowest rank's (a collective is done when
its last rank is); the median over batches is reported, with the fastest batch beside it. For
comparisons with other libraries use ``tensorcomm bench --compare gloo,mpi``; this script exists
to iterate quickly on the per-call path.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tensorcomm as tc
from tensorcomm.testing import run_ranks


def measure(nbytes: int, calls: int, batches: int) -> list[float]:
    x = np.ones(max(1, nbytes // 4), np.float32)
    per_batch = max(1, calls // batches)
    for _ in range(min(2000, per_batch)):
        tc.all_reduce(x)
    times = []
    worst = np.zeros(batches, np.float64)
    for b in range(batches):
        tc.barrier()
        start = time.perf_counter()
        for _ in range(per_batch):
            tc.all_reduce(x)
        worst[b] = (time.perf_counter() - start) / per_batch
    tc.all_reduce(worst, op=tc.ReduceOp.MAX)
    times = [float(t) * 1e6 for t in worst]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--bytes", type=int, default=8)
    parser.add_argument("--calls", type=int, default=40000)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--transport", default=None, help="tcp forces sockets")
    args = parser.parse_args()
    env = {"TENSORCOMM_TRANSPORT": args.transport} if args.transport else {}
    for ranks in (int(r) for r in args.ranks.split(",")):
        times = run_ranks(measure, ranks, args.bytes, args.calls, args.batches, timeout=600, env=env)[0]
        print(f"{ranks} ranks, {args.bytes} B all_reduce: median {statistics.median(times):.2f} us, "
              f"fastest batch {min(times):.2f} us, slowest {max(times):.2f} us")


if __name__ == "__main__":
    main()
