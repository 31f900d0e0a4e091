"""The copy bound: what a same-host collective's copies cost, run the way its designs run them.

The same-host collectives copy (all_reduce and reduce_scatter also add, at about the speed of a
copy). A copy's cost depends on where its bytes lie: in this core's caches, in the other core's
(a slot a peer has just written), in memory, behind ``process_vm_readv`` from an array in 4 KiB
or in 2 MiB pages. So ``measure`` does not price copies at rates taken elsewhere: it runs each
design's copies themselves, ``ranks`` processes at once, on arrays allocated as the bench
allocates them (numpy, huge pages from 4 MiB where the host gives them), on a shared region laid
out like the slots, in the design's order, again and again. Where a design waits for its peers,
the processes meet at a barrier, untimed. A design's time is the sum over its phases of the
slowest process's fastest run of the phase: the copies alone, without the protocol (posts, waits,
checks) and without Python between them beyond one numpy call or system call per copy.

Per rank ``r`` of ``n``, ``S`` the call's bytes as the bench counts them (all blocks), ``b = S/n``
(each member's block or part), ``|`` between phases, broadcast's root rank 0:

- all_gather. slots: publish ``send`` | copy the peers' slots out; the own block. cma: read the
  peers' ``send``; the own block. shared: copy the peers' ``send`` and the own block.
- all_to_all. slots: publish the blocks for the peers | copy block ``r`` out of each peer's slot;
  the own block. cma: read block ``r`` of each peer's ``send``; the own block. shared: copy them.
- reduce_scatter. slots: publish (2 ranks: the peer's block alone) | reduce block ``r`` of every
  slot into ``out``. cma: per 512 KiB, read the peers' terms and reduce them with the own ones.
  shared: reduce block ``r`` of every ``send`` into ``out``.
- all_reduce. slots: publish | reduce part ``r`` into the OUT area | copy every part out of the
  OUT areas. cma: reduce part ``r`` in place, the peers' terms read 512 KiB at a time | read the
  peers' parts. shared: reduce part ``r`` in place | copy the peers' parts.
- broadcast, one phase. slots: the root publishes call ``k`` while the receivers take call
  ``k - 1``. cma: each receiver reads every part but its own, which the root writes into it.
  shared: the same by numpy.

The bound of a call (``bound_us``) is its cheapest design: slots or direct reads on plain arrays
(direct reads where the kernel allows them), the in-place design on shared arrays.

How fast one core copies what the other just wrote jumps between levels on the 2-core VM for
seconds at a time, whatever runs (``benchmarks/cross_core_modes.py``: the same two-process numpy
copy of 4 MiB in fresh process pairs: medians 83-87 or 146-224 us per pair), so a bound
timed at another moment than its rows can be off by 2x. ``Beside`` times each call's designs in
every round of the sweep, right after the libraries ran it, and the table shows the median over
the rounds.

Imports numpy, the standard library, ``check``, ``results``, ``transports.shm.cma`` and
``algorithms.shm_cma`` (its chunk size).
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Sequence
from queue import Empty
from typing import Any

import numpy as np

from ..algorithms.shm_cma import CHUNK_BYTES
from ..transports.shm import cma
from . import check
from .results import TENSORCOMM, Row

COLLECTIVES = ("all_gather", "all_to_all", "reduce_scatter", "all_reduce", "broadcast")
PLAIN, SHARED = ("slots", "cma"), ("shared",)
REPEAT_BYTES = 256 << 20  # bytes each process moves per design and size, at least MIN_REPS calls
MIN_REPS, MAX_REPS = 5, 200
_F32 = np.dtype(np.float32)

Phase = Callable[[int], None]  # one phase of a design on this rank, given the repetition's index


class _Rank:
    """One process's buffers for one size: the shared region (every rank's slot area, twice
    ``S``, then, for shared arrays, its two arrays), the peers' pids and array addresses."""

    def __init__(self, rank: int, ranks: int, size: int, region: mmap.mmap, book: Any, shared: bool) -> None:
        self.r, self.n, self.size = rank, ranks, size
        self.b = size // ranks // 64 * 64
        per = 4 * size if shared else 2 * size
        whole = np.frombuffer(region, dtype=np.uint8).reshape(ranks, per)
        self.slots = whole[:, :2 * size]  # row q: rank q's slot area (IN, then OUT)
        self.arrays = [(row[2 * size:3 * size], row[3 * size:]) for row in whole] if shared else []
        self.book = book
        self.pid = os.getpid()
        self.chunk = min(CHUNK_BYTES, max(64, self.b))
        self.scratch = np.zeros((ranks, self.chunk), np.uint8)

    def offer(self, a: np.ndarray) -> None:
        """Publish where this rank's input lies, for the peers' direct reads."""
        self.book[3 * self.r] = self.pid
        self.book[3 * self.r + 1] = a.ctypes.data

    def read(self, dst: np.ndarray, q: int, offset: int) -> None:
        """``dst.nbytes`` bytes of rank ``q``'s input from byte ``offset`` on, into ``dst``."""
        cma.read(int(self.book[3 * q]), dst.ctypes.data, int(self.book[3 * q + 1]) + offset, dst.nbytes)

    def write(self, src: np.ndarray, q: int, offset: int) -> None:
        """``src`` into rank ``q``'s input from byte ``offset`` on."""
        cma.write(int(self.book[3 * q]), src.ctypes.data, int(self.book[3 * q + 1]) + offset, src.nbytes)


def _add(rows: Sequence[np.ndarray], out: np.ndarray) -> None:
    """``out`` = the sum of ``rows`` (bytes read as float32), as the reductions make it."""
    f = [row.view(_F32) for row in rows]
    np.add(f[0], f[1], out=out.view(_F32))
    for more in f[2:]:
        np.add(out.view(_F32), more, out=out.view(_F32))


def _block(a: np.ndarray, q: int, b: int) -> np.ndarray:
    return a[q * b:(q + 1) * b]


def _copies(*pairs: tuple[np.ndarray, np.ndarray]) -> Phase:
    """A phase of numpy copies, each ``(destination, source)``."""
    def run(i: int) -> None:
        for dst, src in pairs:
            dst[...] = src
    return run


def _sum(rows: Sequence[np.ndarray], out: np.ndarray) -> Phase:
    return lambda i: _add(rows, out)


def _reads(k: _Rank, *wanted: tuple[np.ndarray, int, int]) -> Phase:
    """A phase of direct reads, each ``(destination, rank, byte offset in its input)``."""
    def run(i: int) -> None:
        for dst, q, offset in wanted:
            k.read(dst, q, offset)
    return run


def _reduce_read(k: _Rank, a: np.ndarray, dst: np.ndarray) -> Phase:
    """Block ``k.r`` of every rank's input (``a`` here) reduced into ``dst``, the peers' terms read
    a chunk at a time (``shm_cma``'s reductions)."""
    r, b = k.r, k.b
    peers = [q for q in range(k.n) if q != r]
    own = _block(a, r, b)

    def run(i: int) -> None:
        for x in range(0, b, k.chunk):
            y = min(b, x + k.chunk)
            for q in peers:
                k.read(k.scratch[q, :y - x], q, r * b + x)
            _add([own[x:y], *(k.scratch[q, :y - x] for q in peers)], dst[x:y])
    return run


def _all_gather(k: _Rank, a: np.ndarray, out: np.ndarray, cma_ok: bool) -> dict[str, list[Phase]]:
    r, n, b, slots = k.r, k.n, k.b, k.slots
    peers = [q for q in range(n) if q != r]
    ins, outs = [x for x, _ in k.arrays], [y for _, y in k.arrays]
    own = _copies((_block(out, r, b), a))
    designs = {"slots": [_copies((slots[r, :b], a)),
                         _copies(*((_block(out, q, b), slots[q, :b]) for q in peers)), own]}
    if cma_ok:
        designs["cma"] = [_reads(k, *((_block(out, q, b), q, 0) for q in peers)), own]
    if ins:
        designs["shared"] = [_copies(*((_block(outs[r], q, b), ins[q][:b]) for q in peers),
                                     (_block(outs[r], r, b), ins[r][:b]))]
    return designs


def _all_to_all(k: _Rank, a: np.ndarray, out: np.ndarray, cma_ok: bool) -> dict[str, list[Phase]]:
    r, n, b, slots = k.r, k.n, k.b, k.slots
    peers = [q for q in range(n) if q != r]
    ins, outs = [x for x, _ in k.arrays], [y for _, y in k.arrays]

    def packed(q: int, j: int) -> np.ndarray:  # where rank q's slot holds its block for rank j
        at = (j - (j > q)) * b
        return slots[q, at:at + b]

    designs = {"slots": [_copies(*((packed(r, j), _block(a, j, b)) for j in peers)),
                         _copies(*((_block(out, q, b), packed(q, r)) for q in peers),
                                 (_block(out, r, b), _block(a, r, b)))]}
    if cma_ok:
        designs["cma"] = [_reads(k, *((_block(out, q, b), q, r * b) for q in peers)),
                          _copies((_block(out, r, b), _block(a, r, b)))]
    if ins:
        designs["shared"] = [_copies(*((_block(outs[r], q, b), _block(ins[q], r, b)) for q in range(n)))]
    return designs


def _reduction(k: _Rank, collective: str, a: np.ndarray, out: np.ndarray,
               cma_ok: bool) -> dict[str, list[Phase]]:
    """reduce_scatter's and all_reduce's designs."""
    r, n, b, size, slots = k.r, k.n, k.b, k.size, k.slots
    peers = [q for q in range(n) if q != r]
    ins, outs = [x for x, _ in k.arrays], [y for _, y in k.arrays]
    if n == 2:  # the peer's block alone goes through the slots
        publish = _copies((slots[r, :b], _block(a, 1 - r, b)))
        terms = [_block(a, r, b), slots[1 - r, :b]]
    else:
        publish = _copies((slots[r, :n * b], a[:n * b]))
        terms = [_block(slots[q], r, b) for q in range(n)]
    if collective == "reduce_scatter":
        designs = {"slots": [publish, _sum(terms, out[:b])]}
        if cma_ok:
            designs["cma"] = [_reduce_read(k, a, out[:b])]
        if ins:
            designs["shared"] = [_sum([_block(ins[q], r, b) for q in range(n)], outs[r][:b])]
        return designs
    parts = slots[:, size:size + b]  # all_reduce: own part reduced into the OUT area, then copied out
    designs = {"slots": [publish, _sum(terms, parts[r]),
                         _copies(*((_block(a, q, b), parts[q]) for q in range(n)))]}
    if cma_ok:
        designs["cma"] = [_reduce_read(k, a, _block(a, r, b)),
                          _reads(k, *((_block(a, q, b), q, q * b) for q in peers))]
    if ins:
        designs["shared"] = [_sum([_block(ins[q], r, b) for q in range(n)], _block(ins[r], r, b)),
                             _copies(*((_block(ins[r], q, b), _block(ins[q], q, b)) for q in peers))]
    return designs


def _broadcast(k: _Rank, a: np.ndarray, cma_ok: bool) -> dict[str, list[Phase]]:
    r, n, b, size, slots = k.r, k.n, k.b, k.size, k.slots
    peers = [q for q in range(n) if q != r]
    ins = [x for x, _ in k.arrays]

    def slots_phase(i: int) -> None:  # the root fills one half while the receivers take the other
        half = size * (i & 1 if r == 0 else 1 - (i & 1))
        if r == 0:
            slots[0, half:half + size] = a
        else:
            a[...] = slots[0, half:half + size]

    def cma_phase(i: int) -> None:  # the root writes part q into receiver q, which reads the rest
        for p in range(n):
            if r == 0 and p:
                k.write(_block(a, p, b), p, p * b)
            elif r and p != r:
                k.read(_block(a, p, b), 0, p * b)

    designs: dict[str, list[Phase]] = {"slots": [slots_phase]}
    if cma_ok:
        designs["cma"] = [cma_phase]
    if ins:  # the same split, by numpy
        given = [(_block(ins[q], q, b), _block(ins[0], q, b)) for q in peers] if r == 0 else \
            [(_block(ins[r], p, b), _block(ins[0], p, b)) for p in range(n) if p != r]
        designs["shared"] = [_copies(*given)]
    return designs


def _designs(k: _Rank, collective: str, mine: tuple[np.ndarray, np.ndarray],
             cma_ok: bool) -> dict[str, list[Phase]]:
    """This rank's phases of each design of ``collective`` (see the module docstring); ``mine``:
    its plain arrays (input, output; the output is empty for in-place collectives)."""
    a, out = mine
    if collective == "all_gather":
        return _all_gather(k, a, out, cma_ok)
    if collective == "all_to_all":
        return _all_to_all(k, a, out, cma_ok)
    if collective in ("reduce_scatter", "all_reduce"):
        return _reduction(k, collective, a, out, cma_ok)
    if collective == "broadcast":
        return _broadcast(k, a, cma_ok)
    return {}


def _worker(rank: int, ranks: int, size: int, collectives: Sequence[str], shared: bool, region: mmap.mmap,
            book: Any, barrier: Any, queue: Any) -> None:
    """One process of ``measure`` at one size: per collective and design, its fastest run of each phase."""
    np.seterr(all="ignore")  # sums of sums overflow after a while; the time is the same
    k = _Rank(rank, ranks, size, region, book, shared)
    k.slots[rank] = 1
    for x, y in k.arrays:
        x[...], y[...] = 1, 0
    reps = max(MIN_REPS, min(MAX_REPS, REPEAT_BYTES // size))
    found: dict[str, dict[str, list[float]]] = {}
    for collective in collectives:
        counts = check.layout(collective, size // 4, ranks, rank)
        a, out = (np.zeros(count or 0, _F32).view(np.uint8) for count in counts)  # as the bench's
        a[...] = 1
        k.offer(a)
        barrier.wait()
        probe = np.zeros(8, np.uint8)
        try:  # may this process read its peers? (the same answer on every rank here)
            k.read(probe, (rank + 1) % ranks, 0)
            cma_ok = True
        except cma.CmaError:
            cma_ok = False
        designs = _designs(k, collective, (a, out), cma_ok)
        found[collective] = {}
        for design in sorted(designs):  # every rank in one order
            phases = designs[design]
            best = [float("inf")] * len(phases)
            for i in range(reps):
                for p, phase in enumerate(phases):
                    barrier.wait()
                    t0 = time.perf_counter()
                    phase(i)
                    best[p] = min(best[p], time.perf_counter() - t0)
            found[collective][design] = best
        barrier.wait()
    queue.put(found)


def measure(collectives: Sequence[str], sizes: Sequence[int], ranks: int = 2,
            shared: bool = False) -> dict[tuple[str, int], dict[str, float]]:
    """Microseconds of each design's copies per call of each collective at each size (see the
    module docstring), ``ranks`` processes at once; ``shared``: the in-place design on shared
    arrays too. Collectives without designs here are left out, and sizes that are not whole
    cache lines per process (64 B x ``ranks``)."""
    known = [c for c in dict.fromkeys(collectives) if c in COLLECTIVES]
    context = multiprocessing.get_context("fork")
    found: dict[tuple[str, int], dict[str, float]] = {}
    for size in sorted(set(sizes)):
        if not known or size % (64 * ranks):  # the designs cut blocks of whole cache lines
            continue
        region = mmap.mmap(-1, ranks * size * (4 if shared else 2))
        book = context.RawArray("q", 3 * ranks)
        barrier, queue = context.Barrier(ranks), context.Queue()
        workers = [context.Process(target=_worker, daemon=True,
                                   args=(r, ranks, size, known, shared, region, book, barrier, queue))
                   for r in range(ranks)]
        try:
            for w in workers:
                w.start()
            results = [_result(queue, workers) for _ in workers]
        finally:
            for w in workers:
                if w.pid is None:  # never started
                    continue
                w.join(timeout=30)
                if w.is_alive():
                    w.kill()
            region.close()
        for collective in known:
            for design in results[0][collective]:
                phases = zip(*(result[collective][design] for result in results), strict=True)
                found.setdefault((collective, size), {})[design] = sum(max(p) for p in phases) * 1e6
    return found


def _result(queue: Any, workers: Sequence[Any]) -> Any:
    """The next worker's timings; RuntimeError as soon as a worker died without giving them."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            return queue.get(timeout=0.5)
        except Empty:
            failed = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"a copy-bound worker failed (exit code {failed[0]})") from None
    raise RuntimeError("the copy-bound workers gave no timings within 600 s")


def bound_us(designs: dict[str, float], shared: bool = False) -> float | None:
    """The bound of one call: its cheapest design of those ``measure`` timed (``shared``: the
    in-place design), or None where none was timed."""
    times = [designs[d] for d in (SHARED if shared else PLAIN) if d in designs]
    return min(times) if times else None


class Beside:
    """The copy bound timed during a sweep (``runner.sweep``'s ``beside``): each call's designs
    once per round, right after the libraries ran the call; ``found`` gives the medians."""

    def __init__(self, ranks: int, shared: bool = False) -> None:
        self.ranks, self.shared = ranks, shared
        self.error: str | None = None  # why timing stopped (a worker failed): the rows go on
        self._rounds: dict[tuple[str, int], list[dict[str, float]]] = {}

    def __call__(self, task: Any) -> None:
        """Time the designs of ``task`` (a ``peers.base.Task``) now."""
        if self.error is not None:
            return
        size = task.count * check.DTYPES[task.dtype].itemsize
        try:
            timed = measure([task.collective], [size], self.ranks, self.shared).get((task.collective, size))
        except Exception as exc:  # noqa: BLE001 - whatever stops the bound must not stop the rows
            self.error = f"copy bound not timed from {task.collective} {size} B on: {exc!r}"
            return
        if timed:
            self._rounds.setdefault((task.collective, size), []).append(timed)

    def found(self) -> dict[tuple[str, int], dict[str, float]]:
        """Per call, the median over the rounds of each design timed in every round."""
        return {call: {design: statistics.median(r[design] for r in rounds)
                       for design in set(rounds[0]).intersection(*rounds)}
                for call, rounds in self._rounds.items()}


def summary(rows: Sequence[Row], ranks: int, shared: bool = False,
            found: dict[tuple[str, int], dict[str, float]] | None = None) -> list[str]:
    """The table of tensorcomm's time over the copy bound, per collective and size: from
    ``found`` (``Beside.found``), else timing the designs' copies now (seconds); no lines when
    no row has a bound."""
    mine = [r for r in rows if r.library == TENSORCOMM and r.time_us and r.collective in COLLECTIVES]
    if not mine:
        return []
    when = "timed beside the rows, median over the rounds" if found is not None else "timed after the rows"
    if found is None:
        found = measure([r.collective for r in mine], [r.size for r in mine], ranks, shared)
    designs = SHARED if shared else PLAIN
    title = (f"# tensorcomm time / copy bound (each design's copies run alone, {ranks} processes at once"
             + (", on shared arrays" if shared else "") + f", {when}, in us per call; docs/algorithms.md)")
    columns = f"# {'collective':<14}{'size(B)':>12}" + "".join(f"{d:>10}" for d in designs) + \
        f"{'bound(us)':>11}{'time(us)':>11}{'÷ bound':>9}"
    lines = ["#", title, columns]
    for row in mine:
        timed = found.get((row.collective, row.size), {})
        floor = bound_us(timed, shared)
        if floor is None or row.time_us is None:
            continue
        cells = "".join(f"{timed[d]:>10.1f}" if d in timed else f"{'-':>10}" for d in designs)
        lines.append(f"  {row.collective:<14}{row.size:>12}{cells}{floor:>11.1f}{row.time_us:>11.1f}"
                     f"{row.time_us / floor:>8.2f}x")
    return lines if len(lines) > 3 else []
