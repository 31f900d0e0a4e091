"""Small calls at 2 ranks through the public API: time per call, the median batch and the fastest.

Usage: python benchmarks/small_calls.py [--bytes 8] [--batches 15] [--calls 1000] [--cpu]
       [--pin] [--transport auto|tcp] [--json FILE]

Times ``all_reduce`` with the flight recorder at its default size and off
(``recorder.configure(0)``), then ``broadcast``, ``all_gather``, ``all_to_all`` and
``reduce_scatter`` with it on (called as ``percall_calls.py`` calls them), then each of the five
made persistent (``all_reduce_init`` and so on, run as ``request()``, then as ``start()`` and
``wait()``, the way MPI programs run a persistent request), each as ``--batches``
batches of ``--calls`` calls after a barrier; a batch counts the slower rank. ``--cpu`` times each
rank's thread CPU time less the CPU time spent waiting for the peer in shared memory's
``Slots._block`` (spinning, yielding, sleeping): what one rank's own work costs per call whatever
the peer does, which a busy machine inflates far less than the wall clock (the wall clock is the
figure that counts). ``--pin`` holds rank ``r`` to the ``r``-th usable core from its start: where
the scheduler puts two fresh ranks (one core or two) moves an 8-byte call by 30 % or more from
job to job, which pinning takes out of an A/B of two trees. Two trees, interleaved:
``python benchmarks/ab.py main . -- python benchmarks/small_calls.py --json {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
from percall_calls import COLLECTIVES, make_call, make_request  # same directory

import tensorcomm as tc
from tensorcomm.config import FLIGHT_CALLS
from tensorcomm.testing import run_ranks
from tensorcomm.trace import recorder

RECORDER_OFF = "all_reduce, recorder off"
PERSISTENT = ", persistent"
STARTED = ", start/wait"


def _waits_counted() -> Callable[[], float]:
    """Count the thread CPU time spent in ``Slots._block`` from now on; a reader of the total."""
    from tensorcomm.transports.shm.slots import Slots

    waited = [0.0]
    block = Slots._block

    def timed(self: Slots, *args: object) -> None:
        began = time.thread_time()
        try:
            block(self, *args)  # type: ignore[arg-type]
        finally:
            waited[0] += time.thread_time() - began

    Slots._block = timed  # type: ignore[method-assign,assignment]
    return lambda: waited[0]


def _start_wait(request: tc.Prequest) -> Callable[[], object]:
    start, wait = request.start, request.wait

    def run() -> None:
        start()
        wait()

    return run


def body(nbytes: int, batches: int, calls: int, cpu: bool,
         pin: bool = False) -> dict[str, tuple[float, float]]:
    """One job's figures (run by every rank): per call, the median and the fastest batch, µs."""
    if pin:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[tc.get_rank() % len(cores)]})
    clock, waited = (time.thread_time, _waits_counted()) if cpu else (time.perf_counter, lambda: 0.0)
    found: dict[str, tuple[float, float]] = {}
    # ab.py may run this on a tree without persistent calls
    persistent = [c + way for way in (PERSISTENT, STARTED) for c in COLLECTIVES] \
        if hasattr(tc, "all_reduce_init") else []
    for name in (COLLECTIVES[0], RECORDER_OFF, *COLLECTIVES[1:], *persistent):
        base = name.split(",")[0]
        call = make_request(base, nbytes) if name.endswith(PERSISTENT) else \
            _start_wait(make_request(base, nbytes)) if name.endswith(STARTED) else make_call(base, nbytes)
        recorder.configure(0 if name == RECORDER_OFF else FLIGHT_CALLS)
        for _ in range(2000):
            call()
        times = np.zeros(batches)
        for b in range(batches):
            tc.barrier()
            before, began = waited(), clock()
            for _ in range(calls):
                call()
            times[b] = (clock() - began - (waited() - before)) / calls * 1e6
        tc.all_reduce(times, op=tc.ReduceOp.MAX)
        found[name] = (statistics.median(times.tolist()), float(times.min()))
    recorder.configure(FLIGHT_CALLS)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bytes", type=int, default=8)
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--calls", type=int, default=1000, help="calls per batch")
    parser.add_argument("--cpu", action="store_true", help="CPU time less waiting, not wall time")
    parser.add_argument("--pin", action="store_true", help="rank r on the r-th usable core throughout")
    parser.add_argument("--transport", choices=("auto", "tcp"), default="auto")
    parser.add_argument("--json", metavar="FILE", help="also write the medians as JSON (ab.py)")
    args = parser.parse_args()
    env = {"TENSORCOMM_TRANSPORT": "tcp"} if args.transport == "tcp" else {}
    found = run_ranks(body, 2, args.bytes, args.batches, args.calls, args.cpu, args.pin, env=env,
                      timeout=600)[0]
    clock = ("CPU less waiting" if args.cpu else "wall clock") + (", ranks pinned" if args.pin else "")
    print(f"2 ranks, {args.bytes} B float32, {args.transport}, {clock}, us per call "
          f"(slower rank; {args.batches} batches of {args.calls})")
    print(f"{'call':<26}{'median':>9}{'fastest':>9}")
    for name, (median, fastest) in found.items():
        print(f"{name:<26}{median:>9.2f}{fastest:>9.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump({name: median for name, (median, _) in found.items()}, file)


if __name__ == "__main__":
    main()
