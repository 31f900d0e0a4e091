"""Interleaved A/B of 8-byte calls at 2 ranks on shared memory between two source trees.

Usage (from the repository root):
    PYTHONPATH=src python benchmarks/results/small2/ab_small.py ROUNDS SRC_A SRC_B
e.g. ``... 7 /work/main/src src`` (each job imports its own tree). Each round runs one 2-rank
job per tree, alternating A and B; a job times, through the public API, ``all_reduce(x)`` with
the flight recorder at its default size and off (``recorder.configure(0)``), then
``broadcast``, ``all_gather_into_tensor``, ``all_to_all_single`` and ``reduce_scatter_tensor``
(recorder on; the calls ``benchmarks/shm_floor.py`` makes), each as 15 batches of 1000 calls
after a barrier; a batch counts the slower rank. Printed per call: the median over rounds of
each job's median batch, the fastest batch of all rounds, and A / B of the medians. Print
``uptime`` beside the figures.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

import tensorcomm as tc
from tensorcomm.config import FLIGHT_CALLS
from tensorcomm.trace import recorder


def body(clock: Callable[[], float] = time.perf_counter,
         waited: Callable[[], float] = lambda: 0.0) -> dict[str, tuple[float, float]]:
    """One job's figures (run by every rank): per call, the median and the fastest batch, us,
    timed by ``clock`` less what ``waited`` counts meanwhile (``own_cpu.py``'s variant)."""
    r = tc.get_rank()
    x, send, out = np.ones(2, np.float32), np.full(2, r, np.float32), np.empty(2, np.float32)
    small = np.empty(1, np.float32)
    calls = {"all_reduce": lambda: tc.all_reduce(x),
             "all_reduce, recorder off": lambda: tc.all_reduce(x),
             "broadcast": lambda: tc.broadcast(out, src=0),
             "all_gather": lambda: tc.all_gather_into_tensor(out, small),
             "all_to_all": lambda: tc.all_to_all_single(out, send),
             "reduce_scatter": lambda: tc.reduce_scatter_tensor(small, send)}
    found: dict[str, tuple[float, float]] = {}
    for name, call in calls.items():
        recorder.configure(0 if "off" in name else FLIGHT_CALLS)
        for _ in range(2000):
            call()
        batches = np.zeros(15)
        for b in range(len(batches)):
            tc.barrier()
            before, began = waited(), clock()
            for _ in range(1000):
                call()
            batches[b] = (clock() - began - (waited() - before)) / 1000 * 1e6
        tc.all_reduce(batches, op=tc.ReduceOp.MAX)
        found[name] = (statistics.median(batches.tolist()), float(batches.min()))
    recorder.configure(FLIGHT_CALLS)
    return found


def main(module: str = "ab_small", title: str = "8 B call (us)") -> None:
    """Run ``module.body`` as one 2-rank job per tree and round, A and B alternating; print."""
    rounds, trees = int(sys.argv[1]), sys.argv[2:]
    here = os.path.dirname(os.path.abspath(__file__))
    job = (f"import json, sys; sys.path.insert(0, sys.argv[1]); import {module}; "
           "from tensorcomm.testing import run_ranks; "
           f"print(json.dumps(run_ranks({module}.body, 2, timeout=600)[0]))")
    found: dict[str, list[dict[str, list[float]]]] = {t: [] for t in trees}
    for _ in range(rounds):
        for tree in trees:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
            env.pop("TENSORCOMM_FLIGHT_CALLS", None)
            out = subprocess.run([sys.executable, "-c", job, here], env=env, capture_output=True, text=True,
                                 check=True)
            found[tree].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{title:<26}" + "".join(f"{t[-16:]:>18}{'fastest':>9}" for t in trees) + f"{'A/B':>7}")
    for k in found[trees[0]][0]:
        med = [statistics.median(run[k][0] for run in found[t]) for t in trees]
        fast = [min(run[k][1] for run in found[t]) for t in trees]
        print(f"{k:<26}" + "".join(f"{m:>18.2f}{f:>9.2f}" for m, f in zip(med, fast, strict=True))
              + f"{med[0] / med[1]:>7.2f}")


if __name__ == "__main__":
    main()
