"""Function calls per collective call on the per-call path, counted with cProfile on rank 0.

Usage: python benchmarks/percall_calls.py [--bytes 4096] [--calls 2000] [--ranks 2]
       [--transports shm,tcp] [--top 0]

For each transport (``shm``: shared memory, the default on one host; ``tcp``: sockets, as
``TENSORCOMM_TRANSPORT=tcp``) the ranks warm up, then rank 0 profiles ``--calls`` float32
all_reduces of ``--bytes`` while the other ranks run the same calls unprofiled. Printed per call:
the function calls cProfile saw (Python functions and the builtins/C functions they call, as
cProfile's "function calls" total), the Python functions among them, and the net number of
objects the garbage collector tracks that each call leaves behind (0 when nothing accumulates).
Deterministic: use it to see what the per-call path does, not how long it takes.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats

import numpy as np

import tensorcomm as tc
from tensorcomm.testing import run_ranks


def _count(nbytes: int, calls: int, top: int) -> tuple[float, float, float, str]:
    x = np.ones(max(1, nbytes // 4), np.float32)
    for _ in range(200):
        tc.all_reduce(x)
    tc.barrier()
    if tc.get_rank() != 0:
        for _ in range(calls):
            tc.all_reduce(x)
        tc.barrier()
        return 0.0, 0.0, 0.0, ""
    gc.collect()
    gc.disable()
    before = len(gc.get_objects())
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        tc.all_reduce(x)
    profile.disable()
    grown = len(gc.get_objects()) - before
    gc.enable()
    tc.barrier()
    stats = pstats.Stats(profile)
    python = sum(nc for (filename, _, _), (_, nc, _, _, _) in stats.stats.items()  # type: ignore[attr-defined]
                 if not filename.startswith("~"))
    listing = ""
    if top:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("ncalls").print_stats(top)
        listing = out.getvalue()
    # The loop itself (the profiled for-loop's all_reduce entries) is part of each call.
    return stats.total_calls / calls, python / calls, grown / calls, listing  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bytes", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--transports", default="shm,tcp")
    parser.add_argument("--top", type=int, default=0, help="also list the N most called functions")
    args = parser.parse_args()
    for transport in args.transports.split(","):
        env = {"TENSORCOMM_TRANSPORT": "tcp"} if transport == "tcp" else {}
        total, python, objects, listing = run_ranks(_count, args.ranks, args.bytes, args.calls, args.top,
                                                    env=env, timeout=300)[0]
        print(f"{transport}: {args.ranks} ranks, {args.bytes} B float32 all_reduce: {total:.1f} function "
              f"calls per call ({python:.1f} Python functions), {objects:.2f} objects left per call")
        if listing:
            print(listing)


if __name__ == "__main__":
    main()
