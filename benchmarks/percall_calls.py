"""Function calls per collective call on the per-call path, counted with cProfile on rank 0.

Usage: python benchmarks/percall_calls.py [--bytes 4096] [--calls 2000] [--ranks 2]
       [--transports shm,tcp] [--collective all_reduce] [--top 0]

For each transport (``shm``: shared memory, the default on one host; ``tcp``: sockets, as
``TENSORCOMM_TRANSPORT=tcp``) the ranks warm up, then rank 0 profiles ``--calls`` float32 calls
of ``--collective`` on a ``--bytes`` buffer while the other ranks run the same calls unprofiled.
The collectives are called as ``benchmarks/shm_floor.py`` calls them: ``all_reduce(x)``,
``broadcast(x, src=0)``, ``all_gather_into_tensor(x, block)``, ``all_to_all_single(out, x)``,
``reduce_scatter_tensor(block, x)``; ``all`` counts each in turn. Printed per call:
the function calls cProfile saw (Python functions and the builtins/C functions they call, as
cProfile's "function calls" total), the Python functions among them (less those run while
waiting for a late peer, whose number depends on the timing), and the net number of
objects the garbage collector tracks that each call leaves behind (0 when nothing accumulates).
Deterministic: use it to see what the per-call path does, not how long it takes.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
from collections.abc import Callable
from typing import Any

import numpy as np

import tensorcomm as tc
from tensorcomm.testing import run_ranks

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_to_all", "reduce_scatter")


def make_call(name: str, nbytes: int) -> Callable[[], object]:
    """One call of ``name`` on a ``nbytes`` float32 buffer (rounded to a multiple of the size)."""
    n = tc.get_world_size()
    count = max(n, nbytes // 4) // n * n
    x, out, block = np.ones(count, np.float32), np.empty(count, np.float32), np.ones(count // n, np.float32)
    return {"all_reduce": lambda: tc.all_reduce(x),
            "broadcast": lambda: tc.broadcast(x, src=0),
            "all_gather": lambda: tc.all_gather_into_tensor(out, block),
            "all_to_all": lambda: tc.all_to_all_single(out, x),
            "reduce_scatter": lambda: tc.reduce_scatter_tensor(block, x)}[name]


def make_request(name: str, nbytes: int) -> Callable[[], object]:
    """``make_call``'s call of ``name`` made persistent (``all_reduce_init`` and so on): running
    the returned request runs the call; every rank must make it."""
    n = tc.get_world_size()
    count = max(n, nbytes // 4) // n * n
    x, out, block = np.ones(count, np.float32), np.empty(count, np.float32), np.ones(count // n, np.float32)
    return {"all_reduce": lambda: tc.all_reduce_init(x),
            "broadcast": lambda: tc.broadcast_init(x, src=0),
            "all_gather": lambda: tc.all_gather_into_tensor_init(out, block),
            "all_to_all": lambda: tc.all_to_all_single_init(out, x),
            "reduce_scatter": lambda: tc.reduce_scatter_tensor_init(block, x)}[name]()


def _count(name: str, nbytes: int, calls: int, top: int) -> tuple[float, float, float, str]:
    call = make_call(name, nbytes)
    for _ in range(200):
        call()
    tc.barrier()
    if tc.get_rank() != 0:
        for _ in range(calls):
            call()
        tc.barrier()
        return 0.0, 0.0, 0.0, ""
    gc.collect()
    gc.disable()
    before = len(gc.get_objects())
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        call()
    profile.disable()
    grown = len(gc.get_objects()) - before
    gc.enable()
    tc.barrier()
    stats = pstats.Stats(profile)
    python = sum(nc for (filename, _, _), (_, nc, _, _, _) in stats.stats.items()  # type: ignore[attr-defined]
                 if not filename.startswith("~")) - _waiting(stats.stats)  # type: ignore[attr-defined]
    listing = ""
    if top:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("ncalls").print_stats(top)
        listing = out.getvalue()
    # The call itself (the profiled loop's lambda and the public function) is part of each call.
    return stats.total_calls / calls, python / calls, grown / calls, listing  # type: ignore[attr-defined]


def _waiting(table: dict[Any, Any]) -> int:
    """Python calls made while waiting for the peer (the shared-memory ``_block`` and what only
    it calls): how many depends on the timing, not on the per-call path, so they are left out."""
    wait = {key for key in table if key[2] == "_block"}
    grown = True
    while grown:
        grown = False
        for key, (_, _, _, _, callers) in table.items():
            if key not in wait and callers and set(callers) <= wait:
                wait.add(key)
                grown = True
    return sum(table[key][1] for key in wait if not key[0].startswith("~"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bytes", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--transports", default="shm,tcp")
    parser.add_argument("--collective", default="all_reduce", choices=(*COLLECTIVES, "all"))
    parser.add_argument("--top", type=int, default=0, help="also list the N most called functions")
    args = parser.parse_args()
    names = COLLECTIVES if args.collective == "all" else (args.collective,)
    for transport in args.transports.split(","):
        env = {"TENSORCOMM_TRANSPORT": "tcp"} if transport == "tcp" else {}
        for name in names:
            total, python, objects, listing = run_ranks(_count, args.ranks, name, args.bytes, args.calls,
                                                        args.top, env=env, timeout=300)[0]
            print(f"{transport}: {args.ranks} ranks, {args.bytes} B float32 {name}: {total:.1f} function "
                  f"calls per call ({python:.1f} Python functions), {objects:.2f} objects left per call")
            if listing:
                print(listing)


if __name__ == "__main__":
    main()
