"""The copy bound: how fast this host can move a collective's bytes, measured beside the collectives.

The same-host collectives only copy (and, for the reductions, add), so their floor is what their
copies cost. A copy does not run at one rate: ``measure`` times, at each size, with ``ranks``
processes at once (as the ranks of a collective copy side by side), the four kinds of copy the
same-host designs are made of:

    private   a process's array into another of its arrays, again and again (publishing into a
              slot, the own block, a reduction): through the caches while the size fits them,
              from memory beyond
    cross     out of a region another core has just written (taking from a peer's slot)
    cma       ``process_vm_readv`` of another process's array (a direct read)
    memory    a copy from an array that is in no cache (the floor of every copy once arrays
              exceed the caches), reported beside the others

``bound_us`` prices the cheapest design for a call: per rank, ``S`` the row's size (all blocks),
``n`` ranks, ``b = S / n``; a reduction of ``n`` rows of ``b`` counts as ``(n + 1) / 2`` private
copies of ``b`` (it reads ``n`` rows and writes one); docs/algorithms.md derives them:

    collective      through the slots                               direct reads
    all_gather      b private + b private + (n-1) b cross          b private + (n-1) b cma
    all_to_all      b private + (n-1) b private + (n-1) b cross    b private + (n-1) b cma
    reduce_scatter  (n-1) b private + (n+1) b / 2 private          (n-1) b cma + (n+1) b / 2 private
    all_reduce      reduce_scatter's + b private + (n-1) b cross   reduce_scatter's + (n-1) b cma
    broadcast       max(S private, S cross): root and receivers     (n-1) S / n cma
                    copy at once

With ``shared`` (the arrays are ``tensorcomm.zeros`` arrays, which peers read in place) the
publishing copies vanish: every byte a rank takes is one cross-core copy. The bench prints
tensorcomm's time over that bound (``summary``) below its table.

Imports numpy, the standard library, ``results`` and ``transports.shm.cma``.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..transports.shm import cma
from .results import TENSORCOMM, Row

REPEAT_BYTES = 64 << 20  # bytes each process copies per timed batch and kind (at least one copy)
MAX_REPS = 20_000  # copies per timed batch and kind, however small they are
BATCHES = 5
COLD_BYTES = 128 << 20  # the memory rate copies from arrays cycled through this many bytes


class Rates(NamedTuple):
    """Bytes per second per process, ``ranks`` processes copying at once (see the docstring)."""

    private: float
    cross: float
    cma: float  # 0.0 where process_vm_readv is not allowed
    memory: float


def _worker(rank: int, ranks: int, size: int, region: Any, where: Any, start: Any, queue: Any) -> None:
    """One process of ``measure``: its best seconds per byte of each kind of copy."""
    shared = np.frombuffer(region, dtype=np.uint8).reshape(ranks, size)
    mine, theirs = shared[rank], shared[(rank + 1) % ranks]
    src = np.ones(size, np.uint8)
    dst = np.zeros(size, np.uint8)
    cold = np.ones(max(2, COLD_BYTES // size) * size, np.uint8).reshape(-1, size)
    where[2 * rank], where[2 * rank + 1] = os.getpid(), src.ctypes.data
    reps = max(1, min(MAX_REPS, REPEAT_BYTES // size))
    rounds = min(reps, 16)  # cross-core copies take two barriers each
    mine[...] = src
    dst[...] = theirs  # touch every page first
    start.wait()
    peer = (rank + 1) % ranks
    pid, address, local = int(where[2 * peer]), int(where[2 * peer + 1]), dst.ctypes.data
    best = dict.fromkeys(Rates._fields, float("inf"))
    for _ in range(BATCHES):
        start.wait()
        t0 = time.perf_counter()
        for _ in range(reps):
            dst[...] = src
        best["private"] = min(best["private"], (time.perf_counter() - t0) / reps)
        spent = 0.0
        for _ in range(rounds):  # publish, then take what the peer has just published
            mine[...] = src
            start.wait()
            t0 = time.perf_counter()
            dst[...] = theirs
            spent += time.perf_counter() - t0
            start.wait()
        best["cross"] = min(best["cross"], spent / rounds)
        t0 = time.perf_counter()
        for i in range(reps):
            dst[...] = cold[i % len(cold)]
        best["memory"] = min(best["memory"], (time.perf_counter() - t0) / reps)
        start.wait()
        try:
            t0 = time.perf_counter()
            for _ in range(reps):
                cma.read(pid, local, address, size)
            best["cma"] = min(best["cma"], (time.perf_counter() - t0) / reps)
        except cma.CmaError:  # not allowed here: no rate
            pass
    queue.put({kind: seconds / size for kind, seconds in best.items()})


def measure(sizes: Sequence[int], ranks: int = 2) -> dict[int, Rates]:
    """The four copy rates for each size, with ``ranks`` processes copying at once: each
    process's fastest batch, and the slowest process's (a bound is what the host can do; batches
    slowed by other work on a shared machine do not lower it)."""
    context = multiprocessing.get_context("fork")
    rates: dict[int, Rates] = {}
    for size in sorted(set(sizes)):
        region = context.RawArray("B", ranks * size)
        where = context.RawArray("q", 2 * ranks)
        start = context.Barrier(ranks)
        queue = context.Queue()
        workers = [context.Process(target=_worker, args=(r, ranks, size, region, where, start, queue))
                   for r in range(ranks)]
        for w in workers:
            w.start()
        results = [queue.get(timeout=300) for _ in workers]
        for w in workers:
            w.join(timeout=30)
        slowest = {kind: max(result[kind] for result in results) for kind in Rates._fields}
        rates[size] = Rates(*(1.0 / slowest[kind] for kind in Rates._fields))  # inf: 0.0, none
    return rates


def design_us(collective: str, size: int, ranks: int, rates: Rates, design: str) -> float | None:
    """Microseconds of ``design``'s copies (``"slots"``, ``"cma"`` or ``"shared"``) for one call,
    at ``rates``; None for a collective without a formula here or a design the host lacks."""
    n, b = ranks, size / ranks
    if design == "cma" and not rates.cma:
        return None
    take = {"slots": rates.cross, "cma": rates.cma, "shared": rates.cross}[design]
    publish = 0.0 if design != "slots" else 1.0  # copies into shared memory before the take
    reduce = (n + 1) * b / 2 / rates.private
    if collective == "all_gather":
        seconds = b / rates.private + publish * b / rates.private + (n - 1) * b / take
    elif collective == "all_to_all":
        seconds = b / rates.private + publish * (n - 1) * b / rates.private + (n - 1) * b / take
    elif collective in ("reduce_scatter", "all_reduce"):
        # the slots' reduction takes the peers' terms as it reads them; a direct read copies first
        seconds = publish * (n - 1) * b / rates.private + reduce + \
            (0.0 if design == "slots" else (n - 1) * b / take)
        if collective == "all_reduce":
            seconds += publish * b / rates.private + (n - 1) * b / take
    elif collective == "broadcast":
        seconds = max(size / rates.private, size / take) if design == "slots" else \
            (n - 1) * size / n / take if design == "cma" else size / take
    else:
        return None
    return seconds * 1e6


def bound_us(collective: str, size: int, ranks: int, rates: dict[int, Rates],
             shared: bool = False) -> float | None:
    """The copy bound of one call in microseconds: the cheapest design's copies (slots or direct
    reads; ``shared``: in place) at the rates measured for ``size`` (the closest measured size),
    or None without a formula."""
    if not rates:
        return None
    at = rates[min(rates, key=lambda s: abs(np.log2(s) - np.log2(max(size, 1))))]
    designs = ("shared",) if shared else ("slots", "cma")
    costs = [c for d in designs if (c := design_us(collective, size, ranks, at, d)) is not None]
    return min(costs) if costs else None


def summary(rows: Sequence[Row], ranks: int, shared: bool = False) -> list[str]:
    """The table of tensorcomm's time over the copy bound, per collective and size, measuring the
    copy rates now (a few seconds); no lines when no row has a bound."""
    mine = [r for r in rows if r.library == TENSORCOMM and r.time_us
            and design_us(r.collective, r.size, ranks, Rates(1, 1, 1, 1), "slots") is not None]
    if not mine:
        return []
    rates = measure([r.size for r in mine], ranks)
    title = (f"# tensorcomm time / copy bound (the cheapest design's copies for {ranks} ranks"
             + (" on shared arrays" if shared else ", through the slots or direct reads")
             + ", each at the rate its kind of copy ran at just now, in GB/s per process; "
               "docs/algorithms.md)")
    columns = (f"# {'collective':<14}{'size(B)':>12}{'private':>9}{'cross':>7}{'cma':>7}{'memory':>8}"
               f"{'bound(us)':>11}{'time(us)':>11}{'÷ bound':>9}")
    lines = ["#", title, columns]
    for row in mine:
        floor = bound_us(row.collective, row.size, ranks, rates, shared)
        assert floor is not None and row.time_us is not None
        r = rates[row.size]
        lines.append(f"  {row.collective:<14}{row.size:>12}{r.private / 1e9:>9.1f}{r.cross / 1e9:>7.1f}"
                     f"{r.cma / 1e9:>7.1f}{r.memory / 1e9:>8.1f}{floor:>11.1f}{row.time_us:>11.1f}"
                     f"{row.time_us / floor:>8.2f}x")
    return lines
