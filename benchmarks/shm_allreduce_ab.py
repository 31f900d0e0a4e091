"""Interleaved A/B timing of all-reduce algorithm choices on the shared-memory path.

Usage: python benchmarks/shm_allreduce_ab.py [--ranks 2,4] [--sizes 8K,64K,256K,1M]

Every variant runs inside the same set of ranks, in alternating rounds, so a machine whose speed
swings from moment to moment affects them alike; compare the columns of one table, not tables of
different runs. The variants set module constants of ``algorithms.select`` (which rows apply)
before timing; this is how ``SHM_DIRECT_BYTES`` was chosen.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tensorcomm as tc
from tensorcomm.testing import run_ranks

VARIANTS = {
    "direct": {"SHM_DIRECT_BYTES": {}, "SHM_DIRECT_BYTES_MANY": 1 << 40},
    "split": {"SHM_DIRECT_BYTES": {}, "SHM_DIRECT_BYTES_MANY": 0},
    "default": {},
}


def _apply(settings: dict) -> None:
    from tensorcomm.algorithms import select
    from tensorcomm.core import collectives

    for name, value in settings.items():
        setattr(select, name, value)
    collectives._REDUCTIONS.clear()  # reductions remember their row per team: forget it
    collectives._last_reduction = (None,) * 6


def _body(sizes: list[int], rounds: int) -> dict:
    from tensorcomm.algorithms import select

    defaults = {"SHM_DIRECT_BYTES": dict(select.SHM_DIRECT_BYTES),
                "SHM_DIRECT_BYTES_MANY": select.SHM_DIRECT_BYTES_MANY}
    times: dict = {v: {s: [] for s in sizes} for v in VARIANTS}
    for _ in range(rounds):
        for variant, settings in VARIANTS.items():
            _apply({**defaults, **settings})
            for nbytes in sizes:
                x = np.ones(max(1, nbytes // 4), np.float32)
                tc.all_reduce(x)
                calls = min(5000, max(3, int(2e8 / max(nbytes, 1))))
                tc.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    tc.all_reduce(x)
                worst = np.array([(time.perf_counter() - start) / calls])
                tc.all_reduce(worst, op=tc.ReduceOp.MAX)
                times[variant][nbytes].append(float(worst[0]))
    return {v: {s: statistics.median(t) * 1e6 for s, t in r.items()} for v, r in times.items()}


def _bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--sizes", default="8K,64K,128K,256K,512K,1M")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sizes = [_bytes(s) for s in args.sizes.split(",")]
    for ranks in (int(r) for r in args.ranks.split(",")):
        result = run_ranks(_body, ranks, sizes, args.rounds, timeout=1800)[0]
        print(f"{ranks} ranks, float32 all_reduce, us per call (median of {args.rounds} interleaved rounds)")
        print("size".rjust(10) + "".join(v.rjust(12) for v in VARIANTS))
        for s in sizes:
            print(str(s).rjust(10) + "".join(f"{result[v][s]:12.1f}" for v in VARIANTS))


if __name__ == "__main__":
    main()
