"""Interleaved A/B timing of the all-reduce algorithms, optionally beside Gloo, in the same ranks.

Usage: python benchmarks/allreduce_ab.py [--transport tcp|auto] [--ranks 4,8] [--sizes 256K,1M]
       [--variants recursive_doubling,halving_doubling,ring,gloo] [--rounds 3]

Every variant runs inside the same set of ranks, in alternating rounds, so a machine whose speed
swings from moment to moment affects them alike; compare the columns of one table, not tables of
different runs. A variant is an all-reduce algorithm of ``algorithms/select.py`` (forced as
``TENSORCOMM_ALGORITHMS`` would), ``default`` (what ``select`` picks) or ``gloo`` (torch's Gloo in
the same processes; needs torch). This is how ``ALLREDUCE_DOUBLING_BYTES`` and
``SHM_DIRECT_BYTES`` were chosen, the latter with ``--transport auto`` (shared memory within the
host) ``--variants shm_direct,shm_split``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

import tensorcomm as tc
from tensorcomm.bench.options import parse_size
from tensorcomm.testing import free_port, run_ranks


def _caller(variant: str, x: np.ndarray, port: int) -> Callable[[], object]:
    """A function that runs one all_reduce of ``x`` as ``variant``."""
    if variant == "gloo":
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                    rank=tc.get_rank(), world_size=tc.get_world_size())
        tensor = torch.from_numpy(x)
        return lambda: dist.all_reduce(tensor)
    from tensorcomm.core.lifecycle import WORLD, current_world

    algorithms = current_world().algorithms
    if variant == "default":
        algorithms.pop("all_reduce", None)
    else:
        algorithms["all_reduce"] = variant
    WORLD._plans.clear()  # every call shape picks its row again
    return lambda: tc.all_reduce(x)


def time_variants(caller: Callable[[str, np.ndarray], Callable[[], object]], variants: list[str],
                  sizes: list[int], rounds: int, budget_bytes: float = 1e8) -> dict:
    """Microseconds per call of each variant at each size: ``caller(variant, x)`` gives one call
    on ``x``; variants alternate round by round in these ranks; the slowest rank's time, median
    of the rounds. Runs in every rank (``run_ranks``); scan_ab.py uses it too."""
    times: dict = {v: {s: [] for s in sizes} for v in variants}
    for _ in range(rounds):
        for variant in variants:
            for nbytes in sizes:
                x = np.ones(max(1, nbytes // 4), np.float32)
                call = caller(variant, x)
                call()
                calls = min(2000, max(3, int(budget_bytes / max(nbytes, 1))))
                tc.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    call()
                worst = np.array([(time.perf_counter() - start) / calls])
                tc.all_reduce(worst, op=tc.ReduceOp.MAX)
                times[variant][nbytes].append(float(worst[0]))
    return {v: {s: statistics.median(t) * 1e6 for s, t in r.items()} for v, r in times.items()}


def _body(variants: list[str], sizes: list[int], rounds: int, port: int) -> dict:
    return time_variants(lambda variant, x: _caller(variant, x, port), variants, sizes, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--transport", choices=("tcp", "auto"), default="tcp")
    parser.add_argument("--ranks", default="4,8")
    parser.add_argument("--sizes", default="64K,256K,512K,1M,2M,4M,16M")
    parser.add_argument("--variants", default="recursive_doubling,halving_doubling,ring,gloo")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["TENSORCOMM_TRANSPORT"] = args.transport
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    variants = args.variants.split(",")
    for ranks in (int(r) for r in args.ranks.split(",")):
        result = run_ranks(_body, ranks, variants, sizes, args.rounds, free_port(), timeout=1800)[0]
        print(f"\n{ranks} ranks, {args.transport}, float32 all_reduce, us per call (slowest rank; "
              f"median of {args.rounds} interleaved rounds)")
        print("bytes".rjust(10) + "".join(v.rjust(20) for v in variants))
        for s in sizes:
            print(str(s).rjust(10) + "".join(f"{result[v][s]:20.1f}" for v in variants), flush=True)


if __name__ == "__main__":
    main()
