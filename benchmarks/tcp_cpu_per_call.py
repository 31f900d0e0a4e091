"""CPU time per 2-rank TCP all_reduce, by size: what the per-call path costs, less swayed by load.

Usage: python benchmarks/tcp_cpu_per_call.py [--calls 4000]

Each rank times ``--calls`` float32 all_reduces of 4 KiB and 64 KiB (fewer above) with
``time.process_time`` (all of its threads) after a warm-up; printed: the two ranks' mean, in
microseconds per call. Wall time on a shared machine mostly measures the other jobs; CPU time
per call moves with what tensorcomm itself does. Compare trees in one run (``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import tensorcomm as tc
from tensorcomm.testing import run_ranks

SIZES = (4096, 65536, 1 << 20, 16 << 20)


def _time(calls: int) -> dict[int, float]:
    out = {}
    for nbytes in SIZES:
        x = np.ones(nbytes // 4, np.float32)
        n = calls if nbytes <= 65536 else max(20, calls * 4096 // nbytes // 4)
        for _ in range(50):
            tc.all_reduce(x)
        tc.barrier()
        start = time.process_time()
        for _ in range(n):
            tc.all_reduce(x)
        out[nbytes] = (time.process_time() - start) / n * 1e6
        tc.barrier()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON (benchmarks/ab.py)")
    args = parser.parse_args()
    ranks = run_ranks(_time, 2, args.calls, env={"TENSORCOMM_TRANSPORT": "tcp"}, timeout=300)
    mean = {str(nbytes): (ranks[0][nbytes] + ranks[1][nbytes]) / 2 for nbytes in SIZES}
    print(" ".join(f"{nbytes}={us:.1f}" for nbytes, us in mean.items()))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(mean, file)


if __name__ == "__main__":
    main()
