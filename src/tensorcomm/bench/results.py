"""Result rows (one per collective x size x library) and the tensorcomm/peer ratios.

A row is built from the measurements of every round (their batch times pooled) or, when the
library could not run that task, carries a note and no numbers.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .formulas import COLLECTIVES, algbw, busbw
from .peers.base import Task

TENSORCOMM = "tensorcomm"


@dataclass(frozen=True)
class Row:
    """One line of the table: nccl-tests' columns plus the library and a note."""

    collective: str
    library: str
    ranks: int
    size: int  # bytes of the whole buffer, as measured
    count: int
    dtype: str
    op: str
    time_us: float | None  # median per call (send_recv: per one-way message, half the round trip)
    min_us: float | None
    max_us: float | None
    algbw: float | None  # GB/s
    busbw: float | None  # GB/s
    wrong: int | None  # None: not checked or not run
    iters: int  # timed calls, all rounds
    note: str = ""  # why there are no numbers ("n/a: ...", "failed: ...")
    algorithm: str = ""  # what ran the calls, "algorithm/transport" (tensorcomm's rows only)

    def to_json(self) -> dict[str, Any]:
        """The row as a JSON-ready dict."""
        return asdict(self)


def make_row(task: Task, library: str, ranks: int, itemsize: int,
             measurements: Sequence[dict[str, Any]], note: str = "") -> Row:
    """The row of ``task`` for ``library`` from its measurements (``timing.Measurement`` dicts).

    With no measurements the row carries ``note`` and no numbers.
    """
    size = task.count * itemsize
    op = task.op
    if not measurements:
        return Row(task.collective, library, ranks, size, task.count, task.dtype, op,
                   None, None, None, None, None, None, 0, note)
    # A ping-pong (send_recv) call is a round trip: the row shows the one-way latency.
    share = 0.5 if COLLECTIVES[task.collective].round_trip else 1.0
    times = [t * share for m in measurements for t in m["batch_times"]]
    median = statistics.median(times)
    checked = [m["wrong"] for m in measurements if m["wrong"] is not None]
    return Row(task.collective, library, ranks, size, task.count, task.dtype, op,
               median * 1e6, min(times) * 1e6, max(times) * 1e6, algbw(size, median),
               busbw(task.collective, size, median, ranks), sum(checked) if checked else None,
               sum(int(m["iters"]) for m in measurements), note,
               str(measurements[0].get("algorithm") or ""))


def ratios(rows: Sequence[Row]) -> dict[tuple[str, int, str], float]:
    """tensorcomm's speed over each peer's, per ``(collective, size, peer)``.

    The ratio of busbw, which is peer time / tensorcomm time: above 1, tensorcomm is faster.
    Only sizes both libraries measured appear.
    """
    ours = {(r.collective, r.size): r.time_us for r in rows
            if r.library == TENSORCOMM and r.time_us}
    return {(r.collective, r.size, r.library): r.time_us / ours[(r.collective, r.size)]
            for r in rows if r.library != TENSORCOMM and r.time_us
            and (r.collective, r.size) in ours}
