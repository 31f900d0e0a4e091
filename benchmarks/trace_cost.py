"""What the flight recorder and the timeline cost per call: an 8-byte all_reduce at 2 ranks.

Usage: python benchmarks/trace_cost.py [--calls 4000] [--rounds 7] [--transport tcp] [--single]

Three settings run interleaved in the same ranks, round after round: nothing recorded
(``recorder.configure(0)``), the flight recorder at its default size, and the recorder plus a
timeline (``tensorcomm.trace.start``). Each batch starts after a barrier and counts the slowest
rank's time; the median over rounds is printed per setting, with the fastest round and the load
average. ``--single`` runs one rank (an all_reduce of one process: only the per-call path, no
peer to wait for), timed in CPU time, which other work on the machine disturbs less.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

import tensorcomm as tc
from tensorcomm.config import FLIGHT_CALLS
from tensorcomm.testing import run_ranks
from tensorcomm.trace import chrome, recorder


def batch(x: np.ndarray, calls: int) -> float:
    # One rank waits for nobody: its CPU time is its whole cost, and other work on the machine
    # disturbs it less than the wall clock.
    clock = time.thread_time if tc.get_world_size() == 1 else time.perf_counter
    tc.barrier()
    start = clock()
    for _ in range(calls):
        tc.all_reduce(x)
    worst = np.array([(clock() - start) / calls])
    tc.all_reduce(worst, op=tc.ReduceOp.MAX)
    return float(worst[0]) * 1e6


def measure(calls: int, rounds: int, directory: str) -> dict[str, list[float]]:
    x = np.ones(2, np.float32)  # 8 bytes
    for _ in range(2000):
        tc.all_reduce(x)
    times: dict[str, list[float]] = {"off": [], "recorder": [], "recorder+timeline": []}
    for _ in range(rounds):
        recorder.configure(0)
        times["off"].append(batch(x, calls))
        recorder.configure(FLIGHT_CALLS)
        times["recorder"].append(batch(x, calls))
        chrome.start(directory)
        times["recorder+timeline"].append(batch(x, calls))
        chrome.stop()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--transport", default="auto", choices=["auto", "tcp"])
    parser.add_argument("--single", action="store_true", help="one rank")
    args = parser.parse_args()
    env = {"TENSORCOMM_TRANSPORT": "tcp"} if args.transport == "tcp" else {}
    ranks = 1 if args.single else 2
    with tempfile.TemporaryDirectory() as directory:
        times = run_ranks(measure, ranks, args.calls, args.rounds, directory, timeout=600, env=env)[0]
    print(f"8 B all_reduce, {ranks} rank(s), transport {args.transport}, {args.calls} calls x {args.rounds} "
          f"rounds, load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    base = statistics.median(times["off"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:18} median {median:7.2f} us/call (+{median - base:5.2f}), "
              f"fastest round {min(values):7.2f} (+{min(values) - min(times['off']):5.2f})")


if __name__ == "__main__":
    main()
