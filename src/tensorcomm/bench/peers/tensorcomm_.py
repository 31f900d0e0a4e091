"""tensorcomm itself as a benchmark peer, through its public API only.

Ranks are started by ``tensorcomm run`` (the spawner), so the job runs exactly as a user's does;
the transport is whatever tensorcomm picks (``TENSORCOMM_TRANSPORT`` passes through).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import tensorcomm as tc
from tensorcomm.algorithms import kernels  # the op x dtype rule the frontends apply

from ..check import DTYPES, ROOT
from ..formulas import COLLECTIVES
from ..timing import Case
from . import Command
from .base import ArrayCase, Peer, Task, Unsupported, ping_pong


def commands(ranks: int, worker: list[str], env: dict[str, str]) -> list[Command]:
    """One ``tensorcomm run -n ranks`` launcher running the worker on every rank."""
    return [Command([sys.executable, "-m", "tensorcomm", "run", "-n", str(ranks),
                     "-m", *worker[2:]], env)]


def _call(task: Task, case: ArrayCase, group: tc.Group | None = None) -> Callable[[], Any]:
    op = tc.ReduceOp.parse(task.op)
    x, out, rank, size = case.input, case.output, case.rank, case.ranks
    if task.collective == "gather":
        pieces = list(out.reshape(size, -1)) if rank == ROOT and out is not None else None
        return lambda: tc.gather(x, pieces, dst=ROOT, group=group)
    if task.collective == "scatter":
        pieces = list(x.reshape(size, -1)) if rank == ROOT else None
        return lambda: tc.scatter(out, pieces, src=ROOT, group=group)
    if task.collective == "send_recv":
        return ping_pong(rank, size, lambda peer: tc.send(x, peer), lambda peer: tc.recv(x, peer))
    return {
        "all_reduce": lambda: tc.all_reduce(x, op, group=group),
        "broadcast": lambda: tc.broadcast(x, src=ROOT, group=group),
        "reduce": lambda: tc.reduce(x, dst=ROOT, op=op, group=group),
        "all_gather": lambda: tc.all_gather_into_tensor(out, x, group=group),
        "reduce_scatter": lambda: tc.reduce_scatter_tensor(out, x, op, group=group),
        "all_to_all": lambda: tc.all_to_all_single(out, x, group=group),
    }[task.collective]


class _Case(ArrayCase):
    """A tensorcomm case: ``algorithm()`` is what ``group`` (None: a point-to-point case, which
    names none) ran the timed calls with, asked after them: ``last_call.settled``, which, where
    the group learns its algorithms (docs/tuning.md), is what the shape had settled on, even if
    the latest call was a trial of another."""

    group: tc.Group | None = None

    def algorithm(self) -> str:
        ran = None if self.group is None else self.group.last_call
        return "" if ran is None else f"{ran.settled}/{ran.transport}"


class TensorcommPeer(Peer):
    """tensorcomm joined through ``tc.init()`` (the launcher's environment)."""

    name = "tensorcomm"

    def __init__(self) -> None:
        tc.init()
        self.version = f"tensorcomm {tc.__version__}"
        self.rank, self.size = tc.get_rank(), tc.get_world_size()
        self._group: tc.Group | None = None  # the group of the latest --shared-arrays case

    def case(self, task: Task) -> Case:
        if COLLECTIVES[task.collective].reduces:
            _check_op(task)
        if self._group is not None:  # every rank makes its cases in one order: drop the last one's
            self._group.destroy()
            self._group = None
        if task.shared and task.collective in ("gather", "scatter", "send_recv"):
            raise Unsupported(f"--shared-arrays: {task.collective}'s buffers differ between ranks")
        if task.shared:  # a group per case, so that its shared arrays go with it
            self._group = group = tc.new_group()
            case = _Case(task, self.size, self.rank, lambda n, dtype: tc.zeros(n, dtype, group=group))
        else:
            case = _Case(task, self.size, self.rank)
        case.run = _call(task, case, self._group)
        case.group = None if COLLECTIVES[task.collective].round_trip else self._group or tc.WORLD
        return case

    def barrier(self) -> None:
        tc.barrier()

    def close(self) -> None:
        tc.destroy()

    def reduce(self, values: Sequence[float], op: str) -> list[float]:
        """The coordinator of in-process runs: tensorcomm's own all_reduce on float64."""
        array = np.asarray(values, np.float64)
        tc.all_reduce(array, tc.ReduceOp.MAX if op == "max" else tc.ReduceOp.SUM)
        return [float(v) for v in array]


def _check_op(task: Task) -> None:
    """Raise Unsupported where tensorcomm itself would reject op x dtype."""
    try:
        kernels.check_op_dtype(tc.ReduceOp.parse(task.op), DTYPES[task.dtype], "op")
    except (TypeError, ValueError) as exc:
        raise Unsupported(str(exc)) from None


def open(init_method: str | None = None) -> TensorcommPeer:  # noqa: A001 - the peer contract
    """Join the job the launcher's environment describes."""
    return TensorcommPeer()
