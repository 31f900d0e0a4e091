"""MindSpore's CPU collectives (``mindspore.ops`` in PyNative mode) as a benchmark peer.

MindSpore's dynamic cluster needs a scheduler process besides the workers; all of them get
``MS_SCHED_HOST=127.0.0.1``, a free ``MS_SCHED_PORT`` and ``MS_WORKER_NUM``, and the scheduler
runs the worker module with ``--role scheduler`` (it only joins the cluster and waits). On CPU
(MindSpore 2.10) only AllReduce (sum, float16/float32), AllGather and Broadcast have kernels;
``mint.distributed`` and ``communication.comm_func`` are Ascend-only there. The ops return new
tensors (out of place) and may queue, so ``finish`` fetches the last result to wait for it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ...testing import free_port
from ..check import ROOT
from ..timing import Case
from . import LOOPBACK, Command
from .base import ArrayCase, Peer, Task, require

_COLLECTIVES = ("all_reduce", "all_gather", "broadcast")
_DTYPES = ("float32", "float16")


def commands(ranks: int, worker: list[str], env: dict[str, str]) -> list[Command]:
    """A scheduler and ``ranks`` workers of one dynamic cluster on loopback."""
    cluster = {**env, "MS_SCHED_HOST": LOOPBACK, "MS_SCHED_PORT": str(free_port()),
               "MS_WORKER_NUM": str(ranks), "GLOG_v": "3"}  # GLOG_v=3: errors only
    scheduler = Command([sys.executable, *worker[1:], "--role", "scheduler"],
                        {**cluster, "MS_ROLE": "MS_SCHED"})
    workers = [Command([sys.executable, *worker[1:]], {**cluster, "MS_ROLE": "MS_WORKER"})
               for _ in range(ranks)]
    return [scheduler, *workers]


class _Case(ArrayCase):
    """Keeps the last output tensor: results are new tensors, not the buffers."""

    def __init__(self, task: Task, ranks: int, rank: int, call: Callable[[Any], Any]) -> None:
        super().__init__(task, ranks, rank)
        import mindspore as ms

        tensor = ms.from_numpy(self.input)  # shares the numpy buffer
        self.last: Any = None

        def run() -> None:
            self.last = call(tensor)

        self.run = run

    def _last_array(self) -> np.ndarray:
        out = self.last[0] if isinstance(self.last, tuple) else self.last
        return out.asnumpy()

    def finish(self) -> None:
        if self.last is not None:
            self._last_array()  # blocks until the queued calls are done

    def result(self) -> np.ndarray:
        return self._last_array()


class MindSporePeer(Peer):
    """A worker of MindSpore's dynamic cluster with the CPU collective backend."""

    name = "mindspore"

    def __init__(self) -> None:
        import mindspore as ms
        from mindspore import ops
        from mindspore.communication import get_group_size, get_rank, init

        ms.set_device("CPU")
        init()
        self.ops = ops
        self.version = f"mindspore {ms.__version__} (CPU)"
        self.rank, self.size = get_rank(), get_group_size()
        self._barrier: Case | None = None

    def case(self, task: Task) -> Case:
        require(task.collective in _COLLECTIVES,
                f"mindspore: no CPU kernel for {task.collective}")
        require(task.dtype in _DTYPES, f"mindspore: no CPU collectives on {task.dtype}")
        require(task.op == "sum" or task.collective != "all_reduce",
                "mindspore: CPU AllReduce supports sum only")
        op = {"all_reduce": self.ops.AllReduce(), "all_gather": self.ops.AllGather(),
              "broadcast": self.ops.Broadcast(ROOT)}[task.collective]
        if task.collective == "broadcast":
            return _Case(task, self.size, self.rank, lambda t: op((t,)))
        return _Case(task, self.size, self.rank, op)

    def barrier(self) -> None:
        # No CPU barrier op: a one-element all-reduce, waited for, is one.
        if self._barrier is None:
            self._barrier = self.case(Task("all_reduce", 1, "float32", "sum"))
        self._barrier.run()
        self._barrier.finish()

    def close(self) -> None:
        """MindSpore leaves the cluster at exit."""


def serve_scheduler() -> None:
    """Run the cluster's scheduler: join, then wait inside ``init`` until the workers leave."""
    from mindspore.communication import init

    init()


def open(init_method: str | None = None) -> MindSporePeer:  # noqa: A001 - the peer contract
    """Join the dynamic cluster the environment describes (MS_ROLE=MS_WORKER)."""
    return MindSporePeer()
