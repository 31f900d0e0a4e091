"""Interleaved A/B of the CPU time of 8-byte calls at 2 ranks on shared memory, less waiting.

Usage (from the repository root):
    PYTHONPATH=src python benchmarks/results/small2/own_cpu.py ROUNDS SRC_A SRC_B
The calls and rounds of ``ab_small.py``, timed in this thread's CPU time (``time.thread_time``)
less the CPU time spent in ``Slots._block`` (waiting for a late peer: spinning, yielding,
sleeping), which is wrapped for the purpose: what one rank's own work costs per call, whatever
the peer does. A machine shared with other work inflates it far less than the wall clock (time
the process is not running is not counted), so it serves to compare trees on a busy machine;
the wall clock (``ab_small.py``) is the figure that counts. Printed per call: the median over
rounds of each job's median batch (the slower rank), the fastest batch, and A / B.
"""

import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import tensorcomm as tc
from tensorcomm.config import FLIGHT_CALLS
from tensorcomm.trace import recorder
from tensorcomm.transports.shm.slots import Slots

_waited = [0.0]  # thread CPU seconds spent in Slots._block so far


def _timed_block(block):  # type: ignore[no-untyped-def]
    def wrapper(self, *args):  # type: ignore[no-untyped-def]
        began = time.thread_time()
        try:
            return block(self, *args)
        finally:
            _waited[0] += time.thread_time() - began
    return wrapper


def body() -> dict[str, tuple[float, float]]:
    """One job's figures (run by every rank): per call, the median and the fastest batch, us."""
    Slots._block = _timed_block(Slots._block)  # type: ignore[method-assign]
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
            waited, began = _waited[0], time.thread_time()
            for _ in range(1000):
                call()
            batches[b] = (time.thread_time() - began - (_waited[0] - waited)) / 1000 * 1e6
        tc.all_reduce(batches, op=tc.ReduceOp.MAX)
        found[name] = (statistics.median(batches.tolist()), float(batches.min()))
    recorder.configure(FLIGHT_CALLS)
    return found


JOB = ("import json, sys; sys.path.insert(0, sys.argv[1]); import own_cpu; "
       "from tensorcomm.testing import run_ranks; "
       "print(json.dumps(run_ranks(own_cpu.body, 2, timeout=600)[0]))")


def main() -> None:
    rounds, trees = int(sys.argv[1]), sys.argv[2:]
    here = os.path.dirname(os.path.abspath(__file__))
    found: dict[str, list[dict[str, list[float]]]] = {t: [] for t in trees}
    for _ in range(rounds):
        for tree in trees:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
            env.pop("TENSORCOMM_FLIGHT_CALLS", None)
            out = subprocess.run([sys.executable, "-c", JOB, here], env=env, capture_output=True, text=True,
                                 check=True)
            found[tree].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'8 B call (CPU us)':<26}" + "".join(f"{t[-16:]:>18}{'fastest':>9}" for t in trees)
          + f"{'A/B':>7}")
    for k in found[trees[0]][0]:
        med = [statistics.median(run[k][0] for run in found[t]) for t in trees]
        fast = [min(run[k][1] for run in found[t]) for t in trees]
        print(f"{k:<26}" + "".join(f"{m:>18.2f}{f:>9.2f}" for m, f in zip(med, fast, strict=True))
              + f"{med[0] / med[1]:>7.2f}")


if __name__ == "__main__":
    main()
