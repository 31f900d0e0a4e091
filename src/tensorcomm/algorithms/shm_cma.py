"""Same-host collectives that read the peers' arrays where they lie: one copy per byte.

Each member writes, at the head of its IN slot of the call's round, where its arrays are: their
address in its own memory and, for a shared array (``tensorcomm.empty``), which of the group's
shared allocations holds it and where (``ShmDomain.place``). After ``start`` (which also checks
that every member made the same call) a member takes what it needs straight from each peer's
array: with ``process_vm_readv`` (``ShmDomain.read``, cross-memory attach) from a plain array,
with a numpy copy, or straight into the reduction, from a shared array, which every member has
mapped. Then it posts once and waits for every peer's post: no member returns while a peer
still reads (or writes) its arrays. Two waits per call; all-reduce has three.

- ``all_gather``, ``all_to_all``: each member reads its block of every peer's input into its
  output; its own block is a local copy, made while it waits for the peers.
- ``reduce_scatter``: member ``r`` reads block ``r`` of every peer's input, chunk by chunk (so
  the terms stay in the caches), and reduces them with its own into its output.
- ``all_reduce``: a reduce-scatter of parts (as ``reduce_scatter``, into part ``r`` of the
  array), a post, then an all-gather of the reduced parts from the peers' arrays.
- ``broadcast``: the root's array in ``n`` parts; receiver ``q`` reads every part but ``q``,
  which the root writes into it at the same time (``process_vm_writev``, or a numpy copy into a
  shared array).

The results land in the caller's arrays as they come, so a failed call may leave them partly
written. Where the group keeps in-place arrays untouched or complete (``Team.keep_going``), a
broadcast's receivers build the result in scratch memory and copy it into the array after the
last wait, when nothing can fail any more (one more pass over the array); all-reduce does not
run here then (``select``: the slots' pipeline keeps the guarantee for less). Outputs-only
arrays (all-gather, all-to-all, reduce-scatter) are unspecified after a failed call either way.
Reductions follow ``kernels``' accumulation rule, each part reduced by one member in member
order, so every member ends with the same bits. This module must not import ``core``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CollectiveMismatchError
from .allgather import bounds
from .base import Ctx, Plan, Team
from .shm_common import Op, Reduction, copy, domain, load, part_size, reduce_terms

# Bytes of peer terms read per step of a reduction: the terms stay in the caches between the
# read and the arithmetic, as UCX's CMA pieces of 512 KiB do for MPICH.
CHUNK_BYTES = 512 << 10
WORDS = 3  # per published array: its address, 1 + its shared allocation (0: none), its offset there
_I64 = np.dtype(np.int64)
_BYTE = np.dtype(np.uint8)


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


@dataclass(frozen=True, slots=True)
class Reads:
    """The state of one call shape of this module's algorithms.

    Attributes:
        d: the group's domain.
        heads: per IN slot, every member's published words (a ``(members, words)`` view).
        offsets: element bounds of the blocks (all_gather, reduce_scatter: the counts';
            all_reduce, broadcast: each member's part).
        red: the reduction, for reductions.
    """

    d: Any
    heads: tuple[np.ndarray, np.ndarray]
    offsets: list[int]
    red: Reduction | None = None


def _prepare(team: Team, plan: Plan, words: int, offsets: list[int]) -> Reads:
    d = domain(team, plan)
    heads = (d.stacked(0, _I64, words), d.stacked(1, _I64, words))
    return Reads(d, heads, offsets, plan.reduction)


def _parts(count: int, size: int, itemsize: int) -> list[int]:
    part = part_size(count, size, itemsize)
    return [min(q * part, count) for q in range(size + 1)]


def _publish(ctx: Ctx, s: Reads, *arrays: np.ndarray, extra: Sequence[int] = (),
             extent: int | None = None) -> list[list[int]]:
    """Publish where ``arrays`` lie (and ``extra`` words after them), start the call (announcing
    ``extent``), and return every member's published words, in group-rank order."""
    head = _write_head(s, arrays, extra)
    s.d.start(ctx, extent)
    return head.tolist()


def _write_head(s: Reads, arrays: Sequence[np.ndarray], extra: Sequence[int]) -> np.ndarray:
    """Write where ``arrays`` lie, then ``extra``, at the head of this member's IN slot of the
    call's next round; return every member's head of that slot (a view)."""
    d = s.d
    head = s.heads[d.next_round()]
    words: list[int] = []
    for a in arrays:
        words.extend(d.place(a))
    words.extend(extra)
    head[d.rank, :len(words)] = words
    return head


def _done(ctx: Ctx, d: Any) -> None:
    """Post that this member is done with its peers' arrays and wait until they are with its."""
    d.post()
    d.wait(d.peers, d.posts, ctx)


def _take(d: Any, table: list[list[int]], q: int, k: int, offset: int, dst: np.ndarray) -> None:
    """Copy ``dst.nbytes`` bytes from byte ``offset`` of member ``q``'s published array ``k``
    into ``dst`` (C-contiguous)."""
    address, alloc, start = table[q][WORDS * k:WORDS * k + 3]
    if alloc:
        copy(dst.view(_BYTE), d.shared_view(q, alloc - 1)[start + offset:start + offset + dst.nbytes])
    elif dst.nbytes:
        d.read(q, _address(dst), address + offset, dst.nbytes)


def _give(d: Any, table: list[list[int]], q: int, k: int, offset: int, src: np.ndarray) -> None:
    """Copy ``src`` into member ``q``'s published array ``k`` from byte ``offset`` on."""
    address, alloc, start = table[q][WORDS * k:WORDS * k + 3]
    if alloc:
        copy(d.shared_view(q, alloc - 1)[start + offset:start + offset + src.nbytes], src.view(_BYTE))
    elif src.nbytes:
        d.write(q, _address(src), address + offset, src.nbytes)


def _terms(d: Any, table: list[list[int]], q: int, k: int, offset: int, like: np.ndarray,
           scratch: np.ndarray) -> np.ndarray:
    """Member ``q``'s ``like.size`` elements of ``like.dtype`` from byte ``offset`` of its array
    ``k``: a view of a shared array, else read into ``scratch`` (as large or larger)."""
    alloc = table[q][WORDS * k + 1]
    if alloc:
        start = table[q][WORDS * k + 2] + offset
        return d.shared_view(q, alloc - 1)[start:start + like.nbytes].view(like.dtype)
    terms = scratch[:like.size]
    _take(d, table, q, k, offset, terms)
    return terms


def _reduce_part(ctx: Ctx, s: Reads, table: list[list[int]], send: np.ndarray, lo: int, hi: int,
                 out: np.ndarray) -> None:
    """Reduce elements ``[lo, hi)`` of every member's published array 0 (this member's is
    ``send``) into ``out`` (``hi - lo`` elements), chunk by chunk, in member order.

    Two members with terms that are the caller's bytes reduce this member's elements with the
    peer's as they are; otherwise every member's terms are loaded into a row of scratch first.
    """
    d, red = s.d, s.red
    assert red is not None
    if hi <= lo:
        return
    n, r, itemsize = d.size, d.rank, send.itemsize
    step = min(hi - lo, max(1, CHUNK_BYTES // itemsize))
    raw = ctx.team.scratch.take("cma.terms", n * step, send.dtype).reshape(n, step)
    pair = n == 2 and red.raw
    acc = raw if red.raw else ctx.team.scratch.take("cma.acc", n * step, red.acc).reshape(n, step)
    for a in range(lo, hi, step):
        b = min(hi, a + step)
        own, into = send[a:b], out[a - lo:b - lo]
        if pair:
            theirs = _terms(d, table, 1 - r, 0, a * itemsize, own, raw[1 - r])
            reduce_terms(red, (own, theirs) if r == 0 else (theirs, own), into)  # type: ignore[arg-type]
            continue
        terms = acc[:, :b - a]
        for q in range(n):
            if q == r:
                load(red, terms[q], own)
            elif red.raw and not table[q][1]:  # a plain array's terms, read into their row
                _take(d, table, q, 0, a * itemsize, terms[q])
            else:
                load(red, terms[q], _terms(d, table, q, 0, a * itemsize, own, raw[q]))
        reduce_terms(red, terms, into)


# -- all_gather ----------------------------------------------------------------------------------

def prepare_all_gather(team: Team, plan: Plan, send: np.ndarray, out: np.ndarray,
                       counts: Sequence[int]) -> Reads:
    """``all_gather``'s state."""
    return _prepare(team, plan, WORDS + 1, bounds(counts))


def all_gather(ctx: Ctx, send: np.ndarray, out: np.ndarray, counts: Sequence[int]) -> None:
    """Every member's ``send`` lands in block ``member`` of ``out`` on every member (arguments
    as ``select``'s calling convention)."""
    s: Reads = ctx.plan.state
    d, offsets = s.d, s.offsets
    r = d.rank
    copy(out[offsets[r]:offsets[r + 1]], send)
    table = _publish(ctx, s, send, extra=(send.nbytes,))
    for q in d.peers:
        if table[q][WORDS] != counts[q] * send.itemsize:
            raise _size_mismatch(ctx, q, table[q][WORDS] // send.itemsize, counts[q])
    for q in d.peers:
        _take(d, table, q, 0, 0, out[offsets[q]:offsets[q + 1]])
    _done(ctx, d)


def _size_mismatch(ctx: Ctx, q: int, sent: int, expected: int) -> CollectiveMismatchError:
    d = ctx.team.shm
    return CollectiveMismatchError(
        f"rank {d.global_ranks[q]} called {ctx.name} with {sent} elements for rank "
        f"{d.global_ranks[d.rank]}, which called it expecting {expected} from rank "
        f"{d.global_ranks[q]}, at step {ctx.seq}")


# -- all_to_all ----------------------------------------------------------------------------------

def prepare_all_to_all(team: Team, plan: Plan, send: np.ndarray, send_counts: Sequence[int],
                       out: np.ndarray, recv_counts: Sequence[int]) -> Reads:
    """``all_to_all``'s state (its ``offsets`` are ``recv_counts``' bounds)."""
    return _prepare(team, plan, WORDS + team.size + 1, bounds(recv_counts))


# What a member reading directly announces as its extent for all_to_all: the slots' design
# (``shm_alltoall``) always announces more (its stream has a header). ``select`` picks each
# member's design by the member's own size, which all_to_all's members may not share, so a call
# can start with some members reading directly and others through the slots; every member then
# sees an extent of each kind, and all go on reading directly (``all_to_all_joined``).
READS_EXTENT = 0


def all_to_all(ctx: Ctx, send: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
               recv_counts: Sequence[int]) -> None:
    """Block ``j`` of member ``i``'s ``send`` lands in block ``i`` of member ``j``'s ``out``;
    each member publishes its blocks' byte bounds beside its array."""
    s: Reads = ctx.plan.state
    d, recv = s.d, s.offsets
    r = d.rank
    sent = bounds(send_counts)
    copy(out[recv[r]:recv[r + 1]], send[sent[r]:sent[r + 1]])
    extra = [b * send.itemsize for b in sent]
    table = _publish(ctx, s, send, extra=extra, extent=READS_EXTENT)
    if any(d.extents(ctx)):  # a peer started through the slots: one more round, publishing
        table = _published_round(ctx, s, send, extra)
    _read_blocks(ctx, s, table, send, out, recv_counts)


def all_to_all_joined(ctx: Ctx, s: Reads, send: np.ndarray, send_counts: Sequence[int],
                      out: np.ndarray, recv_counts: Sequence[int]) -> None:
    """``all_to_all`` for a member that started the call through the slots (``shm_alltoall``)
    and found a peer reading directly (``READS_EXTENT``): one more round, in which every member
    publishes where its blocks lie, then as ``all_to_all``; ``s`` is ``prepare_all_to_all``'s."""
    recv, r = s.offsets, s.d.rank
    sent = bounds(send_counts)
    copy(out[recv[r]:recv[r + 1]], send[sent[r]:sent[r + 1]])
    table = _published_round(ctx, s, send, [b * send.itemsize for b in sent])
    _read_blocks(ctx, s, table, send, out, recv_counts)


def _published_round(ctx: Ctx, s: Reads, send: np.ndarray, extra: Sequence[int]) -> list[list[int]]:
    """A round in which this member publishes where ``send`` lies (and ``extra``), as every
    member does; returns every member's published words."""
    d = s.d
    head = _write_head(s, (send,), extra)
    d.post()
    d.wait(d.peers, d.posts, ctx)
    return head.tolist()


def _read_blocks(ctx: Ctx, s: Reads, table: list[list[int]], send: np.ndarray, out: np.ndarray,
                 recv_counts: Sequence[int]) -> None:
    """Read this member's block of every peer's published array into ``out``, after checking
    its size, then ``_done``."""
    d, recv = s.d, s.offsets
    r, itemsize = d.rank, send.itemsize
    for q in d.peers:
        lo, hi = table[q][WORDS + r], table[q][WORDS + r + 1]
        if hi - lo != recv_counts[q] * itemsize:
            raise _size_mismatch(ctx, q, (hi - lo) // itemsize, recv_counts[q])
    for q in d.peers:
        _take(d, table, q, 0, table[q][WORDS + r], out[recv[q]:recv[q + 1]])
    _done(ctx, d)


# -- reduce_scatter ------------------------------------------------------------------------------

def prepare_reduce_scatter(team: Team, plan: Plan, send: np.ndarray, out: np.ndarray,
                           counts: Sequence[int], op: Op) -> Reads:
    """``reduce_scatter``'s state."""
    return _prepare(team, plan, WORDS, bounds(counts))


def reduce_scatter(ctx: Ctx, send: np.ndarray, out: np.ndarray, counts: Sequence[int], op: Op) -> None:
    """Block ``r`` of every member's ``send``, reduced, lands in member ``r``'s ``out``."""
    s: Reads = ctx.plan.state
    r = s.d.rank
    table = _publish(ctx, s, send)
    _reduce_part(ctx, s, table, send, s.offsets[r], s.offsets[r + 1], out)
    _done(ctx, s.d)


# -- all_reduce ----------------------------------------------------------------------------------

def prepare_all_reduce(team: Team, plan: Plan, x: np.ndarray, op: Op) -> Reads:
    """``all_reduce``'s state (its ``offsets`` are the members' parts)."""
    return _prepare(team, plan, WORDS, _parts(x.size, team.size, x.itemsize))


def all_reduce(ctx: Ctx, x: np.ndarray, op: Op) -> None:
    """Reduce ``x`` across the members, in place: member ``r`` reduces part ``r`` of every
    member's ``x`` into its own ``x``, then copies the peers' reduced parts from theirs (a
    failed call may leave ``x`` partly written: ``select`` runs it only where that is allowed)."""
    s: Reads = ctx.plan.state
    d, parts = s.d, s.offsets
    r = d.rank
    table = _publish(ctx, s, x)
    lo, hi = parts[r], parts[r + 1]
    _reduce_part(ctx, s, table, x, lo, hi, x[lo:hi])
    _done(ctx, d)  # every part is reduced, and nobody reads the terms of an ``x`` any more
    for q in d.peers:
        _take(d, table, q, 0, parts[q] * x.itemsize, x[parts[q]:parts[q + 1]])
    _done(ctx, d)


# -- broadcast -----------------------------------------------------------------------------------

def prepare_broadcast(team: Team, plan: Plan, x: np.ndarray, root: int) -> Reads:
    """``broadcast``'s state (its ``offsets`` are the parts)."""
    return _prepare(team, plan, WORDS, _parts(x.size, team.size, x.itemsize))


def broadcast(ctx: Ctx, x: np.ndarray, root: int) -> None:
    """Copy group rank ``root``'s ``x`` into every member's ``x``.

    A receiver publishes where its part (``Team.keep_going``: scratch, copied into ``x`` after
    the last wait) should go; the root writes part ``q`` into receiver ``q`` while the receiver
    reads the others, so root and receivers copy at once.
    """
    s: Reads = ctx.plan.state
    d, parts = s.d, s.offsets
    r, itemsize = d.rank, x.itemsize
    target = ctx.team.scratch.take("cma.broadcast", x.size, x.dtype) \
        if ctx.team.keep_going and r != root else x
    table = _publish(ctx, s, target)
    if r == root:
        for q in d.peers:
            _give(d, table, q, 0, parts[q] * itemsize, x[parts[q]:parts[q + 1]])
    else:
        for q in range(d.size):
            if q != r:
                _take(d, table, root, 0, parts[q] * itemsize, target[parts[q]:parts[q + 1]])
    _done(ctx, d)
    if target is not x:
        copy(x, target)
