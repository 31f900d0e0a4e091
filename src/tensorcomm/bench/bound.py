"""The copy bound: how fast this host can move a collective's bytes, measured beside the collectives.

The shared-memory collectives only copy (and, for the reductions, add), so their floor is the
host's copy bandwidth. ``measure`` times numpy copies of ``size`` bytes in ``ranks`` processes at
once (each its own source and destination, as the ranks of a collective copy side by side), and
``bound_us`` turns the bytes a rank must copy in one call (``copied_bytes``, docs/algorithms.md
derives them) into microseconds at that rate. The bench prints tensorcomm's time over that bound
(``summary``) below its table.

Per rank, ``S`` the row's size (all blocks), ``n`` ranks, ``b = S / n``, bytes copied (a copy
reads and writes each byte once; a reduction of ``n`` rows counts as ``(n + 1) / 2`` copies of
its output: it reads ``n`` rows and writes one):

    all_gather      (n + 1) b       publish b, take (n - 1) b from peers, own block b
    all_to_all      (2n - 1) b      publish (n - 1) b, take (n - 1) b, own block b
    reduce_scatter  (n - 1) b + (n + 1) b / 2    publish the peers' blocks, reduce own block
    all_reduce      (n - 1) b + (n + 1) b / 2 + S    as reduce_scatter, then every reduced part
                                    (the own one included) into the caller's array
    broadcast       S               root publishes S, every other rank takes S (at once)

Imports numpy, the standard library and ``results``.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .results import TENSORCOMM, Row

REPEAT_BYTES = 256 << 20  # bytes each process copies per timed batch (at least one copy)
BATCHES = 5


def copied_bytes(collective: str, size: int, ranks: int) -> float | None:
    """Bytes one rank must copy in one call of ``collective`` whose whole buffer is ``size``
    bytes; None for a collective without a formula here."""
    block = size / ranks
    if collective == "all_gather":
        return (ranks + 1) * block
    if collective == "all_to_all":
        return (2 * ranks - 1) * block
    if collective == "reduce_scatter":
        return (ranks - 1) * block + (ranks + 1) * block / 2
    if collective == "all_reduce":
        return (ranks - 1) * block + (ranks + 1) * block / 2 + size
    if collective == "broadcast":
        return float(size)
    return None


def _copy_rate(size: int, start: Any) -> list[float]:
    """Seconds per byte copied, per batch, copying ``size`` bytes again and again; each batch
    starts when every process has reached ``start`` (a barrier)."""
    src = np.ones(size, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    reps = max(1, REPEAT_BYTES // size)
    dst[...] = src  # touch every page first
    rates = []
    for _ in range(BATCHES):
        start.wait()
        t0 = time.perf_counter()
        for _ in range(reps):
            dst[...] = src
        rates.append((time.perf_counter() - t0) / (reps * size))
    return rates


def _worker(size: int, start: Any, queue: Any) -> None:
    queue.put(_copy_rate(size, start))


def measure(sizes: Sequence[int], ranks: int = 2) -> dict[int, float]:
    """Copy bandwidth in bytes per second per process, for each size, with ``ranks`` processes
    copying at once: the fastest batch, timed by its slowest process (a bound is what the host
    can do; batches slowed by other work on a shared machine do not lower it)."""
    context = multiprocessing.get_context("fork")
    rates: dict[int, float] = {}
    for size in sorted(set(sizes)):
        start = context.Barrier(ranks)
        queue = context.Queue()
        workers = [context.Process(target=_worker, args=(size, start, queue)) for _ in range(ranks)]
        for w in workers:
            w.start()
        results = [queue.get(timeout=120) for _ in workers]
        for w in workers:
            w.join(timeout=30)
        slowest = [max(batch) for batch in zip(*results, strict=True)]
        rates[size] = 1.0 / min(slowest)
    return rates


def bound_us(collective: str, size: int, ranks: int, rates: dict[int, float]) -> float | None:
    """The copy bound of one call in microseconds, at the rate measured for ``size`` (the
    closest measured size), or None without a formula."""
    copied = copied_bytes(collective, size, ranks)
    if copied is None or not rates:
        return None
    nearest = min(rates, key=lambda s: abs(np.log2(s) - np.log2(max(size, 1))))
    return copied / rates[nearest] * 1e6


def summary(rows: Sequence[Row], ranks: int) -> list[str]:
    """The table of tensorcomm's time over the copy bound, per collective and size, measuring the
    copy rate now (a few seconds); no lines when no row has a bound."""
    mine = [r for r in rows if r.library == TENSORCOMM and r.time_us
            and copied_bytes(r.collective, r.size, ranks) is not None]
    if not mine:
        return []
    rates = measure([r.size for r in mine], ranks)
    title = (f"# tensorcomm time / copy bound (the bytes a rank must copy at the copy rate of "
             f"{ranks} processes copying at once; docs/algorithms.md)")
    columns = (f"# {'collective':<14}{'size(B)':>12}{'copy(GB/s)':>12}{'bound(us)':>11}"
               f"{'time(us)':>11}{'÷ bound':>9}")
    lines = ["#", title, columns]
    for row in mine:
        floor = bound_us(row.collective, row.size, ranks, rates)
        assert floor is not None and row.time_us is not None
        lines.append(f"  {row.collective:<14}{row.size:>12}{rates[row.size] / 1e9:>12.2f}{floor:>11.1f}"
                     f"{row.time_us:>11.1f}{row.time_us / floor:>8.2f}x")
    return lines
