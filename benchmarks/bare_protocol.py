"""The floor for a small shared-memory all_reduce in Python, timed beside tensorcomm's, in one run.

Usage: python benchmarks/bare_protocol.py [--bytes 8] [--calls 20000] [--batches 15]

The bare protocol is the shared-memory algorithm tensorcomm runs for small all_reduces with
nothing else: each rank writes its array into its slot (two slots, alternating from call to
call, so no closing barrier is needed), posts a counter, spins until every peer has posted the
same round, and sums every slot into its array with one numpy call. No validation, no plan, no
signature check, no timeout, no failure handling. Two ranks (``--ranks`` more) on one host; the
two variants alternate batch by batch in the same processes, so a machine whose speed swings
affects both alike. A batch's time is its slowest rank's; the median over batches is printed,
with the ratio tensorcomm / bare. Print ``uptime`` beside the figures: load moves both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from multiprocessing import shared_memory

import numpy as np

import tensorcomm as tc
from tensorcomm.testing import run_ranks

_SLOT = 4096  # bytes of one slot (a page): up to 4 KiB arrays


def _bare(x: np.ndarray, mine: list[np.ndarray], rows: list[np.ndarray], counters: memoryview, me: int,
          peers: list[int], first: int, calls: int) -> None:
    """``calls`` bare all_reduces of ``x`` (float32 sums), rounds ``first ..``: ``mine[p]`` is this
    rank's slot ``p``, ``rows[p]`` every rank's slot ``p`` as one strided ``(ranks, count)`` view."""
    add = np.add
    pair = [(r[0], r[1]) for r in rows] if len(rows[0]) == 2 else None
    for r in range(first, first + calls):
        p = r & 1
        mine[p][...] = x
        counters[me] = r + 1
        for q in peers:
            while counters[q] <= r:
                pass
        if pair is not None:
            add(pair[p][0], pair[p][1], x)
        else:
            add.reduce(rows[p], axis=0, out=x)


def _body(name: str, nbytes: int, calls: int, batches: int) -> tuple[list[float], list[float]]:
    me, n = tc.get_rank(), tc.get_world_size()
    count = max(1, nbytes // 4)
    block = shared_memory.SharedMemory(name=name)
    try:
        counters = block.buf[:8 * n].cast("q")
        base = 64 * ((8 * n + 63) // 64)
        # slot p of rank q at base + (2q + p) * _SLOT: one strided view per parity
        rows = [np.ndarray((n, count), np.float32, block.buf, base + p * _SLOT, (2 * _SLOT, 4))
                for p in (0, 1)]
        mine = [rows[0][me], rows[1][me]]
        peers = [q for q in range(n) if q != me]
        x = np.ones(count, np.float32)
        tc.barrier()
        rounds = 0
        _bare(x, mine, rows, counters, me, peers, rounds, 2000)  # warm up both
        rounds += 2000
        for _ in range(2000):
            tc.all_reduce(x)
        bare, ours = np.zeros(batches), np.zeros(batches)
        for b in range(batches):
            tc.barrier()
            start = time.perf_counter()
            _bare(x, mine, rows, counters, me, peers, rounds, calls)
            bare[b] = (time.perf_counter() - start) / calls
            rounds += calls
            tc.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                tc.all_reduce(x)
            ours[b] = (time.perf_counter() - start) / calls
        tc.all_reduce(bare, op=tc.ReduceOp.MAX)
        tc.all_reduce(ours, op=tc.ReduceOp.MAX)
        del counters, rows, mine
        return [float(t) * 1e6 for t in bare], [float(t) * 1e6 for t in ours]
    finally:
        block.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bytes", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON (benchmarks/ab.py)")
    args = parser.parse_args()
    if not 4 <= args.bytes <= _SLOT:
        parser.error(f"--bytes: expected 4 .. {_SLOT}")
    block = shared_memory.SharedMemory(create=True, size=64 + 8 * args.ranks + 2 * args.ranks * _SLOT)
    try:
        block.buf[:] = bytes(block.size)
        bare, ours = run_ranks(_body, args.ranks, block.name, args.bytes, args.calls, args.batches,
                               timeout=900)[0]
    finally:
        block.close()
        block.unlink()
    b, t = statistics.median(bare), statistics.median(ours)
    print(f"{args.ranks} ranks, {args.bytes} B float32 all_reduce, us per call (slowest rank, median of "
          f"{args.batches} interleaved batches of {args.calls}); load {os.getloadavg()[0]:.2f}")
    print(f"  bare protocol {b:.2f} (fastest batch {min(bare):.2f})")
    print(f"  tensorcomm    {t:.2f} (fastest batch {min(ours):.2f})")
    print(f"  ratio tensorcomm / bare: {t / b:.2f} (fastest batches {min(ours) / min(bare):.2f})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump({"bare protocol": b, "tensorcomm": t}, file)


if __name__ == "__main__":
    main()
