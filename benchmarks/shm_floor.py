"""Small calls of the shm data-movement collectives beside a bare protocol of their own, 2 ranks.

Usage: python benchmarks/shm_floor.py [--bytes 8,65536] [--calls 20000]

The bare protocol of each collective is the least Python that moves its bytes through shared
memory between two processes: write this rank's slot (alternating between two), bump this
rank's counter, spin until the peer's counter arrives, copy out (all_gather, all_to_all,
broadcast) or add (reduce_scatter); no validation, no plan, no failure handling. Its time per
call is the floor for Python; tensorcomm's calls through the public API are printed beside it,
with the ratio. ``bytes`` is the size of the whole buffer, as ``tensorcomm bench`` counts it.
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing
import statistics
import time
from typing import Any

import numpy as np

import tensorcomm as tc
from tensorcomm.testing import run_ranks

SLOT = 1 << 20
COLLECTIVES = ("all_gather", "broadcast", "all_to_all", "reduce_scatter")


def _bare(rank: int, mm: mmap.mmap, name: str, nbytes: int, calls: int, start: Any, queue: Any) -> None:
    words = memoryview(mm).cast("q")  # word 0 / 8: the counters of ranks 0 / 1 (own cache lines)
    raw = np.frombuffer(mm, dtype=np.uint8)
    slots = [[raw[4096 + q * 2 * SLOT + p * SLOT:][:SLOT] for p in (0, 1)] for q in (0, 1)]
    count = max(2, nbytes // 4) // 2 * 2
    half = count // 2
    mine, theirs = 8 * rank, 8 * (1 - rank)
    send = np.full(count, rank, np.float32)
    out = np.empty(count, np.float32)
    x = np.full(count, rank, np.float32)
    small = np.empty(half, np.float32)
    lo, hi = (0, half) if rank == 0 else (half, count)
    plo, phi = (half, count) if rank == 0 else (0, half)
    posts = 0

    def one(parity: int) -> None:
        nonlocal posts
        slot, peer = slots[rank][parity], slots[1 - rank][parity]
        if name == "all_gather":
            slot[:half * 4].view(np.float32)[...] = send[:half]
        elif name == "broadcast" and rank == 0:
            slot[:count * 4].view(np.float32)[...] = x
        elif name in ("all_to_all", "reduce_scatter"):
            slot[:half * 4].view(np.float32)[...] = send[plo:phi]
        posts += 1
        words[mine] = posts
        while words[theirs] < posts:
            pass
        if name == "all_gather":
            out[plo:phi] = peer[:half * 4].view(np.float32)
            out[lo:hi] = send[:half]
        elif name == "broadcast":
            if rank:
                x[...] = slots[0][parity][:count * 4].view(np.float32)
        elif name == "all_to_all":
            out[plo:phi] = peer[:half * 4].view(np.float32)
            out[lo:hi] = send[lo:hi]
        else:
            np.add(send[lo:hi], peer[:half * 4].view(np.float32), small)

    for i in range(min(calls, 2000)):
        one(i & 1)
    start.wait()
    began = time.perf_counter()
    for i in range(calls):
        one(i & 1)
    queue.put((time.perf_counter() - began) / calls)


def bare(name: str, nbytes: int, calls: int) -> float:
    """Seconds per call of the bare protocol (the slower rank's)."""
    context = multiprocessing.get_context("fork")
    mm = mmap.mmap(-1, 4096 + 4 * SLOT)
    start, queue = context.Barrier(2), context.Queue()
    procs = [context.Process(target=_bare, args=(r, mm, name, nbytes, calls, start, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    times = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return max(times)


def _call(name: str, count: int, rank: int, size: int) -> Any:
    send, out = np.full(count, rank, np.float32), np.empty(count, np.float32)
    small = np.empty(count // size, np.float32)
    return {"all_gather": lambda: tc.all_gather_into_tensor(out, small),
            "broadcast": lambda: tc.broadcast(out, src=0),
            "all_to_all": lambda: tc.all_to_all_single(out, send),
            "reduce_scatter": lambda: tc.reduce_scatter_tensor(small, send)}[name]


def public(names: list[str], sizes: list[int], calls: int) -> dict[tuple[str, int], float]:
    """Seconds per call through the public API (median of batches, the slower rank's)."""
    r, n = tc.get_rank(), tc.get_world_size()
    found = {}
    for nbytes in sizes:
        count = max(n, nbytes // 4) // n * n
        for name in names:
            call = _call(name, count, r, n)
            for _ in range(min(calls, 2000)):
                call()
            batches = np.zeros(5)
            for b in range(len(batches)):
                tc.barrier()
                began = time.perf_counter()
                for _ in range(calls // len(batches)):
                    call()
                batches[b] = (time.perf_counter() - began) / (calls // len(batches))
            tc.all_reduce(batches, op=tc.ReduceOp.MAX)
            found[(name, nbytes)] = statistics.median(batches.tolist())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bytes", default="8,65536")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON (benchmarks/ab.py)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.bytes.split(",")]
    names = args.collectives.split(",")
    ours = run_ranks(public, 2, names, sizes, args.calls, timeout=600)[0]
    figures = {}
    print(f"{'collective':<15}{'bytes':>8}{'bare(us)':>10}{'tensorcomm(us)':>16}{'ratio':>7}")
    for nbytes in sizes:
        for name in names:
            floor = bare(name, nbytes, args.calls)
            mine = ours[(name, nbytes)]
            figures.update({f"{name} {nbytes} bare": floor * 1e6, f"{name} {nbytes} tensorcomm": mine * 1e6})
            print(f"{name:<15}{nbytes:>8}{floor * 1e6:>10.2f}{mine * 1e6:>16.2f}{mine / floor:>7.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(figures, file)


if __name__ == "__main__":
    main()
