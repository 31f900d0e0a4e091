"""The small interface every benchmarked library implements, inside its rank processes.

A ``Peer`` is one library joined to its job (``open(init_method)`` in the peer's module); it makes
a ``Case`` per task (one collective at one size, buffers allocated) and offers a barrier. Most of a
case is library-neutral and lives in ``ArrayCase``: numpy buffers laid out by ``check.layout``,
filled and checked by ``check``; a peer wraps those buffers in its own tensors (zero-copy where the
library allows) and implements ``run`` only.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import check
from ..timing import Case


class Unsupported(Exception):
    """The library cannot run this task (collective, dtype or op); the message says why."""


@dataclass(frozen=True)
class Task:
    """One collective at one size: what the parent sends to every rank of a job."""

    collective: str
    count: int  # elements of the whole buffer (formulas.element_count)
    dtype: str  # a key of check.DTYPES
    op: str  # one of check.OPS; ignored by collectives that do not reduce
    shared: bool = False  # tensorcomm's buffers are shared arrays (--shared-arrays); others ignore it

    def to_json(self) -> dict[str, Any]:
        """The task as a JSON-ready dict."""
        return {"collective": self.collective, "count": self.count, "dtype": self.dtype,
                "op": self.op, "shared": self.shared}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Task:
        """The task a ``to_json`` dict describes."""
        return cls(str(data["collective"]), int(data["count"]), str(data["dtype"]),
                   str(data["op"]), bool(data.get("shared", False)))


class ArrayCase(Case):
    """A case over numpy buffers: ``input`` and ``output`` (``None`` when the result is in place).

    The peer sets ``run`` to a closure over its library's call on these buffers (a closure, not a
    method, so the timing loop pays no extra dispatch per call); a peer whose results land in new
    tensors subclasses it and overrides ``result`` and ``finish``.
    """

    run: Callable[[], object]

    def algorithm(self) -> str:
        """What ran the calls, where the library says (the table's algorithm column); asked
        after the timed calls."""
        return ""

    def __init__(self, task: Task, ranks: int, rank: int,
                 zeros: Callable[[int, np.dtype], np.ndarray] = np.zeros) -> None:
        self.task, self.ranks, self.rank = task, ranks, rank
        self.dtype = check.DTYPES[task.dtype]
        inputs, outputs = check.layout(task.collective, task.count, ranks, rank)
        self.input = zeros(inputs, self.dtype)
        self.output = None if outputs is None else zeros(outputs, self.dtype)

    def reset(self) -> None:
        self.input[...] = check.fill_input(self.task.collective, self.task.op, self.dtype,
                                           self.task.count, self.ranks, self.rank)

    def finish(self) -> None:
        """Calls complete before they return, by default."""

    def result(self) -> np.ndarray:
        """This rank's result after the last call."""
        return self.input if self.output is None else self.output

    def wrong(self) -> int:
        return check.count_wrong(self.task.collective, self.task.op, self.dtype, self.task.count,
                                 self.ranks, self.rank, self.result())


class Peer(abc.ABC):
    """One library, joined to its job, in one rank process."""

    name: str  # the registry name ("tensorcomm", "gloo", ...)
    version: str  # shown in the header, e.g. "torch 2.13.0 (gloo)"
    rank: int
    size: int

    @abc.abstractmethod
    def case(self, task: Task) -> Case:
        """Allocate the buffers of ``task`` and return its case.

        Raises:
            Unsupported: the library cannot run this collective, dtype or op. Decided from the
                task alone, so every rank of the job raises it alike, before any communication.
        """

    @abc.abstractmethod
    def barrier(self) -> None:
        """Block until every rank of the job has called it."""

    @abc.abstractmethod
    def close(self) -> None:
        """Leave the job."""


def ping_pong(rank: int, ranks: int, send: Callable[[int], object],
              recv: Callable[[int], object]) -> Callable[[], None]:
    """One ``send_recv`` call: rank 0 sends to rank 1 and receives the echo; other ranks idle.

    ``send(peer)`` and ``recv(peer)`` move the case's buffer with the library's point-to-point
    calls.

    Raises:
        Unsupported: fewer than 2 ranks.
    """
    require(ranks >= 2, "send_recv needs 2 ranks")
    if rank == 0:
        def run() -> None:
            send(1)
            recv(1)
    elif rank == 1:
        def run() -> None:
            recv(0)
            send(0)
    else:
        def run() -> None:
            pass
    return run


def require(condition: bool, reason: str) -> None:
    """Raise ``Unsupported(reason)`` unless ``condition``."""
    if not condition:
        raise Unsupported(reason)
