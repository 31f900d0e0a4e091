"""What the same-host algorithms share: failure handling, reductions, rounds, the undo journal.

The shared-memory algorithms (``shm_*.py``) read their peers' slots in place through the group's
``ShmDomain`` (``ctx.team.shm``) instead of sending messages. They take the caller's arrays and the
caller's op (``PremulSum``, ``AVG``, half precision included) and write results straight into the
caller's arrays. What they work out once per call shape (views of the slots, bounds) they keep in
the call's ``Plan`` (``ctx.plan.state``), which the group owns. They reduce every member's terms
with one numpy call over a strided view of all the slots (``reduce_terms``), so their per-call Python
work does not grow with the number of members. Where the group keeps arrays untouched or
complete (``Team.keep_going``), arrays a collective updates in place (all-reduce, reduce's root,
broadcast's receivers) are left untouched or complete by a failed call (see ``Journal``);
otherwise, and always for arrays that are outputs only (all-gather, gather, scatter,
reduce-scatter, all-to-all), a call that fails after its first round may leave them partly
written, as MPI and NCCL leave them: saving them would cost a copy of every output. A call that
raises leaves the members' post counts out of step: whoever runs the algorithm must then call
``ShmDomain.fail`` (the core's ``Group._run`` does), which refuses later calls and tells the peers.
This module must not import ``core``.

A *round*: every member writes its part of the round into its IN slot ``round & 1``, posts, waits
for every peer's post of the round, then reads. Because every member waits for every peer in each
round, a member that writes slot ``p`` in round ``g`` knows each peer has posted round ``g - 1``,
hence finished reading round ``g - 2`` (the previous use of slot ``p``): two slots suffice and no
round needs a closing barrier. The first post of a call announces it; ``ShmDomain.start``
compares every peer's announcement with this member's, so every member detects a mismatch.
Rounds are counted by the domain (``ShmDomain.next_round``), nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from ..types import PremulSum, ReduceOp
from . import kernels
from .base import Ctx, Plan, Team
from .kernels import Reduction, reduction

__all__ = ["Reduction", "reduction"]  # kernels' reduction descriptor, for the shm_* modules

Op = ReduceOp | PremulSum


def no_domain(where: Ctx | Plan) -> ValueError:
    """The error of a shared-memory algorithm run (by override) on a group without a domain;
    ``where`` is the call or, when its state is prepared, its plan."""
    name = where.label if isinstance(where, Plan) else where.name
    return ValueError(f"{name}: this algorithm needs a group whose members share a host "
                      "(the group has no shared-memory domain)")


def domain(team: Team, plan: Plan) -> Any:
    """The group's shared-memory domain, for a ``prepare``; raises ``no_domain`` without one."""
    if team.shm is None:
        raise no_domain(plan)
    return team.shm


def part_size(count: int, size: int, itemsize: int) -> int:
    """Elements of each member's part of ``count``: equal parts, each a whole number of cache
    lines (the last members' parts may be short or empty)."""
    align = max(1, 64 // itemsize)
    each = -(-count // size)
    return max(align, -(-each // align) * align)


# numpy copies through glibc's memmove, which moves more than a threshold it derives from the
# caches (768 KiB-1 MiB on the 2-core VM) with non-temporal stores: they bypass the caches, so a
# peer that reads the bytes next fetches them from memory, and a copy into lines a peer has just
# read ran at 8 GB/s instead of 55 (2 ranks each writing 1 MiB into its slot and reading the
# other's). ``copy`` keeps every piece below it.
PIECE_BYTES = 512 << 10


def bound_copy(dst: np.ndarray, src: np.ndarray) -> Callable[[], object]:
    """``copy(dst, src)`` as a bound call (``OneRound``) holds it, made once and run each time
    without a Python call in between where it is one piece: the bytes of two contiguous arrays of
    one dtype through a memoryview's slice assignment (about 60 ns for a small array, where
    ``np.copyto`` takes 200), other arrays through ``np.copyto``; more than one piece: ``copy``."""
    if dst.nbytes > PIECE_BYTES:
        return partial(copy, dst, src)
    if (dst.dtype == src.dtype and dst.shape == src.shape and dst.flags.c_contiguous
            and src.flags.c_contiguous):
        return partial(dst.reshape(-1).view(np.uint8).data.__setitem__, slice(None),
                       src.reshape(-1).view(np.uint8).data)
    return partial(np.copyto, dst, src)


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for 1-D arrays of one length, in pieces of at most ``PIECE_BYTES``,
    so that the bytes land in the caches (see ``PIECE_BYTES``)."""
    if dst.nbytes <= PIECE_BYTES:
        dst[...] = src
        return
    step = max(1, PIECE_BYTES // dst.itemsize)
    for a in range(0, dst.size, step):
        dst[a:a + step] = src[a:a + step]


def load(red: Reduction, dst: np.ndarray, src: np.ndarray) -> None:
    """``kernels.load`` (``src`` into ``dst`` as terms), its plain copies through ``copy``."""
    if red.raw:
        copy(dst, src)
    else:
        kernels.load(red, dst, src)


# -- reductions -----------------------------------------------------------------------------------

def reduce_terms(red: Reduction, terms: np.ndarray, out: np.ndarray) -> None:
    """Reduce the ``(members, k)`` array ``terms`` (row q: member q's terms, in the accumulation
    dtype) over its members into ``out`` (the caller's dtype): one numpy call whatever the number
    of members, in member order, so every member computes the same bits.

    The result is rounded into ``out`` once, after the AVG division, as ``kernels.finish`` does.
    """
    target = out if red.in_acc else np.empty(out.size, dtype=red.acc)
    if len(terms) != 2:
        red.ufunc.reduce(terms, axis=0, out=target)
    elif red.positional:  # two terms: the binary ufunc costs less than a reduction
        red.ufunc(terms[0], terms[1], target)
    else:
        red.ufunc(terms[0], terms[1], out=target)
    if red.average:
        kernels.divide(target, len(terms))
    if target is not out:
        np.copyto(out, target, casting="unsafe")


# -- the undo journal -------------------------------------------------------------------------------


class Journal:
    """Saves what an algorithm overwrites in the caller's arrays, to undo it if the call fails.

    Algorithms that move more than one slot's worth of data write results into the caller's
    arrays before every member has finished; if the call then fails, ``restore`` puts the saved
    bytes back, so the caller sees its arrays untouched. Within one array, saves go in increasing
    byte order. The backing store is the domain's private scratch, kept between calls.
    """

    def __init__(self, domain: Any, arrays: Sequence[np.ndarray]) -> None:
        self._arrays = [a.view(np.uint8) for a in arrays]
        starts = [0]
        for raw in self._arrays:
            starts.append(starts[-1] + raw.size)
        self._starts = starts
        self._saved = domain.backup(starts[-1])
        self._ends = [0] * len(self._arrays)

    def save(self, index: int, lo: int, hi: int) -> None:
        """Save bytes ``[lo, hi)`` of array ``index`` before they are first overwritten."""
        lo = max(lo, self._ends[index])
        if lo < hi:
            base = self._starts[index]
            self._saved[base + lo:base + hi] = self._arrays[index][lo:hi]
            self._ends[index] = hi

    def restore(self) -> None:
        """Put every saved byte back."""
        for index, raw in enumerate(self._arrays):
            end, base = self._ends[index], self._starts[index]
            raw[:end] = self._saved[base:base + end]
            self._ends[index] = 0


# -- rounds of a byte stream -------------------------------------------------------------------------


class Stream(NamedTuple):
    """A member's outgoing bytes, as pieces (uint8 arrays) laid end to end."""

    pieces: tuple[tuple[int, np.ndarray], ...]  # (offset, bytes)
    nbytes: int

    @staticmethod
    def of(arrays: Sequence[np.ndarray], start: int = 0, skip: int | None = None) -> Stream:
        """``arrays`` (1-D) back to back from byte ``start``; array ``skip`` keeps its place but
        is not sent (nobody reads it)."""
        pieces, offset = [], start
        for i, array in enumerate(arrays):
            raw = array.view(np.uint8)
            if i != skip and raw.size:
                pieces.append((offset, raw))
            offset += raw.size
        return Stream(tuple(pieces), offset)

    def write(self, slot: np.ndarray, lo: int, hi: int) -> None:
        """Copy the stream's bytes ``[lo, hi)`` to ``slot[0 : hi - lo]``."""
        for offset, raw in self.pieces:
            a, b = max(lo, offset), min(hi, offset + raw.size)
            if a < b:
                copy(slot[a - lo:b - lo], raw[a - offset:b - offset])


Read = Callable[[int, int, int, "Journal | None"], None]


def run_rounds(ctx: Ctx, stream: Stream, read: Read, outputs: Sequence[np.ndarray] = (),
               verify: Callable[[int, list[int]], None] | None = None,
               header: np.ndarray | None = None, started: int | None = None) -> int:
    """Exchange every member's ``stream`` one slot per round; return the number of rounds.

    Each round ``t`` covers bytes ``[t*S, (t+1)*S)`` of every stream (``S`` the slot size): this
    member writes its bytes of the round into its slot, posts, waits for every peer, then calls
    ``read(in_slot, lo, hi, journal)`` to take what it needs from the peers' slots ``in_slot``. The
    number of rounds comes from the longest stream any member announced (its *extent*), so
    members need not know each other's stream lengths in advance.

    Args:
        read: must ``journal.save`` what it is about to overwrite in ``outputs`` when ``journal``
            is not None (the call spans several rounds, so a later round could still fail, and
            the group keeps arrays untouched or complete).
        outputs: the caller's arrays ``read`` writes into; restored if a later round fails.
        verify: called with the first round's IN slot and every member's extent once all
            have arrived, before anything is read (size checks).
        header: bytes written at the start of the first round, before the stream (whose offsets
            must leave room for it); peers read it in the first round.
        started: the IN slot of a first round the caller already wrote and started (with
            ``stream.nbytes`` as its extent), as a fast path that found it needs more.
    """
    d = ctx.team.shm
    if d is None:
        raise no_domain(ctx)
    size = d.slot_bytes
    mine = d.inbox[d.rank]
    if started is None:
        in_slot = d.next_round()
        if header is not None:
            mine[in_slot][:header.size] = header
        stream.write(mine[in_slot], 0, size)
        d.start(ctx, stream.nbytes)
    else:
        in_slot = started
    extents = d.extents(ctx)
    if verify is not None:
        verify(in_slot, extents)
    rounds = max(1, -(-max(extents) // size))
    journal = Journal(d, outputs) if rounds > 1 and outputs and ctx.team.keep_going else None
    base = d.posts - 1
    peers = d.peers
    try:
        for t in range(rounds):
            lo = t * size
            if t:
                in_slot = d.next_round()
                stream.write(mine[in_slot], lo, lo + size)
                d.post()
                d.wait(peers, base + t + 1, ctx)
            read(in_slot, lo, lo + size, journal)
    except BaseException:
        if journal is not None:
            journal.restore()
        raise
    return rounds
