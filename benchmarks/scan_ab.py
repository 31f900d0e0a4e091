"""Interleaved A/B timing of the scan algorithms, beside all_reduce, in the same ranks.

Usage: python benchmarks/scan_ab.py [--transport auto|tcp] [--ranks 2,3,4] [--sizes 64,4K,256K,4M]
       [--variants shm_prefix,recursive_doubling,all_reduce] [--rounds 3]

Every variant runs inside the same ranks, in alternating rounds; compare the columns of one table,
not tables of different runs. A variant is a ``scan`` algorithm of ``algorithms/select.py`` (forced
as ``TENSORCOMM_ALGORITHMS=scan=...`` would; ``recursive_doubling`` on a shared-memory group goes
over the TCP links every group also has) or ``all_reduce`` (the default all_reduce of the same
array, for scale). ``shm_prefix`` needs ``--transport auto`` (the ranks share this host).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import numpy as np
from allreduce_ab import time_variants  # same directory

import tensorcomm as tc
from tensorcomm.bench.options import parse_size
from tensorcomm.testing import run_ranks


def _caller(variant: str, x: np.ndarray) -> Callable[[], object]:
    """A function that runs one call on ``x`` as ``variant``."""
    if variant == "all_reduce":
        return lambda: tc.all_reduce(x)
    from tensorcomm.core.lifecycle import WORLD, current_world

    current_world().algorithms["scan"] = variant
    WORLD._plans.clear()  # every call shape picks its row again
    return lambda: tc.scan(x)


def _body(variants: list[str], sizes: list[int], rounds: int) -> dict:
    return time_variants(_caller, variants, sizes, rounds, budget_bytes=3e7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--transport", choices=("tcp", "auto"), default="auto")
    parser.add_argument("--ranks", default="2,3,4")
    parser.add_argument("--sizes", default="64,4K,256K,4M")
    parser.add_argument("--variants", default="shm_prefix,recursive_doubling,all_reduce")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["TENSORCOMM_TRANSPORT"] = args.transport
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    variants = args.variants.split(",")
    print(f"load average: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    for ranks in (int(r) for r in args.ranks.split(",")):
        result = run_ranks(_body, ranks, variants, sizes, args.rounds, timeout=1800)[0]
        print(f"\n{ranks} ranks, {args.transport}, float32 scan, us per call (slowest rank; "
              f"median of {args.rounds} interleaved rounds)")
        print("bytes".rjust(10) + "".join(v.rjust(20) for v in variants))
        for s in sizes:
            print(str(s).rjust(10) + "".join(f"{result[v][s]:20.1f}" for v in variants), flush=True)
    print(f"\nload average: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


if __name__ == "__main__":
    main()
