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

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ab_small

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
    """``ab_small.body`` in this thread's CPU time less the time spent waiting for a peer."""
    Slots._block = _timed_block(Slots._block)  # type: ignore[method-assign]
    return ab_small.body(time.thread_time, lambda: _waited[0])


if __name__ == "__main__":
    ab_small.main("own_cpu", "8 B call (CPU us)")
