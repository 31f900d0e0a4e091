"""How much scratch memory a group keeps, and what keeping it less costs.

Runs 2 ranks (TCP between them, ``TENSORCOMM_TRANSPORT=tcp``, so the transport algorithms and
their ``Scratch`` run) through three phases on the world group, each rank reporting the bytes its
group's ``Scratch`` holds and its resident memory:

- ``soak``: 1,000 calls of mixed collectives (all_reduce, all_gather, reduce_scatter, broadcast)
  at sizes drawn log-uniformly from 4 KiB to 64 MiB (seed 0, the same on every rank); held
  bytes after every 100 calls;
- ``quiet``: then 64 KiB all_reduces for 31 s (the job's sizes shrink, for longer than
  ``algorithms.base.SCRATCH_IDLE``): held bytes after;
- ``cold``: then one 64 MiB all_reduce (its scratch given back, if it was: fresh pages), and
  five more (warm): ms of the first and of the next ones, what a shape that recurs less often
  than ``SCRATCH_IDLE`` pays once per recurrence;
- ``steady``: 16 MiB all_reduce repeated (the shape DDP repeats): ms per call;
- ``sawtooth``: a 64 MiB all_reduce once in every 100 calls of 256 KiB: ms per 64 MiB call, and
  per 256 KiB call.

Usage: python benchmarks/scratch_soak.py [--json FILE]

``--json`` writes rank 0's figures (held and resident MiB after the soak and after the quiet
spell, ms of each timed call) for ``ab.py``, which compares two trees in alternating rounds::

    python benchmarks/ab.py b978ca1 . --rounds 2 -- python benchmarks/scratch_soak.py --json {json}
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

import tensorcomm as tc
from tensorcomm.testing import run_ranks

MiB = 1 << 20
QUIET = 31.0  # seconds of small calls: longer than the scratch idle time (algorithms.base.SCRATCH_IDLE)
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def _held_bytes() -> int:
    """Bytes the world group's Scratch holds (either layout: an array, or a list holding one)."""
    held = tc.WORLD._target()._member_team().scratch._held
    return sum((value[0] if isinstance(value, list) else value).nbytes for value in held.values())


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / MiB


def _call(kind: str, nbytes: int) -> None:
    n = tc.get_world_size()
    count = max(n, nbytes // 4 // n * n)
    x = np.ones(count, np.float32)
    if kind == "all_reduce":
        tc.all_reduce(x)
    elif kind == "all_gather":
        out = np.empty(count * n, np.float32)
        tc.all_gather_into_tensor(out, x)
    elif kind == "reduce_scatter":
        out = np.empty(count // n, np.float32)
        tc.reduce_scatter_tensor(out, x)
    else:
        tc.broadcast(x, src=0)


def body() -> dict:
    rng = np.random.default_rng(0)
    soak = []
    for i in range(1000):
        kind = KINDS[int(rng.integers(len(KINDS)))]
        nbytes = int(2 ** rng.uniform(12, 26))
        _call(kind, nbytes)
        if i % 100 == 99:
            soak.append((i + 1, _held_bytes() / MiB, _rss_mib()))
    end = time.monotonic() + QUIET
    while True:  # every rank makes as many calls: rank 0 decides when to stop
        _call("all_reduce", 64 * 1024)
        more = np.array([time.monotonic() < end], np.int32)
        tc.broadcast(more, src=0)
        if not more[0]:
            break
    quiet = (_held_bytes() / MiB, _rss_mib())
    large = np.ones(64 * MiB // 4, np.float32)
    tc.barrier()
    times = []
    for _ in range(6):
        start = time.perf_counter()
        tc.all_reduce(large)
        times.append((time.perf_counter() - start) * 1e3)
    tc.barrier()
    x = np.ones(16 * MiB // 4, np.float32)
    tc.all_reduce(x)
    start = time.perf_counter()
    for _ in range(20):
        tc.all_reduce(x)
    steady = (time.perf_counter() - start) / 20 * 1e3
    small = np.ones(256 * 1024 // 4, np.float32)
    small_s = large_s = 0.0
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(100):
            tc.all_reduce(small)
        small_s += time.perf_counter() - start
        start = time.perf_counter()
        tc.all_reduce(large)
        large_s += time.perf_counter() - start
    return {"soak": soak, "quiet": quiet, "cold_ms": times[0], "warm_ms": sum(times[1:]) / 5,
            "steady_ms": steady, "saw_large_ms": large_s / 5 * 1e3,
            "saw_small_ms": small_s / 500 * 1e3, "held_after": _held_bytes() / MiB}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", metavar="FILE", help="also write rank 0's figures as JSON (ab.py)")
    args = parser.parse_args()
    results = run_ranks(body, 2, timeout=1200, env={"TENSORCOMM_TRANSPORT": "tcp"})
    for rank, result in enumerate(results):
        print(f"rank {rank}: scratch held (MiB) / resident (MiB) after n calls of the soak:")
        for n, held, rss in result["soak"]:
            print(f"  {n:5d}  {held:8.1f}  {rss:8.1f}")
        held, rss = result["quiet"]
        print(f"  then {QUIET:g} s of 64 KiB all_reduce: {held:8.1f}  {rss:8.1f}")
        print(f"  then 64 MiB all_reduce: first {result['cold_ms']:.2f} ms, next five "
              f"{result['warm_ms']:.2f} ms/call")
        print(f"  steady 16 MiB all_reduce: {result['steady_ms']:.2f} ms/call")
        print(f"  sawtooth: 64 MiB call {result['saw_large_ms']:.2f} ms, 256 KiB call "
              f"{result['saw_small_ms']:.3f} ms; held at the end {result['held_after']:.1f} MiB")
    if args.json:
        first = results[0]
        _, held, rss = first["soak"][-1]
        figures = {"held after soak MiB": held, "resident after soak MiB": rss,
                   "held after quiet MiB": first["quiet"][0], "resident after quiet MiB": first["quiet"][1],
                   "first 64 MiB after quiet ms": first["cold_ms"], "next 64 MiB ms": first["warm_ms"],
                   "steady 16 MiB ms": first["steady_ms"], "sawtooth 64 MiB ms": first["saw_large_ms"],
                   "sawtooth 256 KiB ms": first["saw_small_ms"]}
        with open(args.json, "w") as file:
            json.dump(figures, file)


if __name__ == "__main__":
    main()
