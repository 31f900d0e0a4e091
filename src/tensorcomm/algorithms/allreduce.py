"""All-reduce algorithms: ring and halving-doubling (bandwidth-optimal), recursive doubling (log
latency).

Each leaves its result in ``buf``, a 1-D, C-contiguous buffer in the accumulation dtype (see
``kernels.prepare``), and reads the values to reduce from ``source``: the caller's array itself
when it needs no conversion, so that no working copy is made, else ``buf`` (the default). Each
leaves bit-identical results on every rank (see each docstring for why). Algorithms talk through
``Ctx`` only; this module must not import ``core``.
"""

from __future__ import annotations

import numpy as np

from .. import config
from ..types import ReduceOp
from .allgather import bounds, even_counts, ring_inplace
from .base import Ctx, Request
from .kernels import ufunc
from .reduce_scatter import ring_reduce
from .wire import (
    ROUND_CHUNKS,
    chunk_elements,
    compressed,
    recv_chunked,
    round_to,
    scratch,
    send_chunked,
    spans,
)

_Span = tuple[int, int]


def ring(ctx: Ctx, buf: np.ndarray, op: ReduceOp, source: np.ndarray | None = None) -> None:
    """Ring reduce-scatter of ``source`` then ring all-gather in ``buf``, in ``size`` near-equal
    blocks.

    Every block is reduced at exactly one rank and then copied around the ring, so all ranks end
    with the same bits; both passes are pipelined in chunks (``reduce_scatter.ring_reduce``,
    ``allgather.ring_inplace``). With wire compression the owner rounds its reduced block to the
    wire dtype before passing it on, so every rank holds the same rounded values. Scratch: four
    blocks (see ``ring_reduce``).
    """
    offsets = bounds(even_counts(buf.size, ctx.size))
    own = buf[offsets[ctx.rank]:offsets[ctx.rank + 1]]
    ring_reduce(ctx, buf if source is None else source, offsets, op, own)
    wire = compressed(ctx, buf.dtype, op)
    if wire is not None:
        round_to(wire, own)
    ring_inplace(ctx, buf, offsets, step_base=ctx.size - 1, wire=wire)


def pair_in_place(ctx: Ctx, x: np.ndarray, fn: np.ufunc) -> None:
    """Two members, terms as they are (no conversion, no compression): exchange whole arrays and
    combine them with ``fn`` (the op's ufunc, ``Reduction.ufunc``) straight into ``x``, once
    every byte has gone both ways.

    Recursive doubling's one round without its working copy: ``x`` is sent as it is and the
    peer's arrives in scratch; nothing can fail once every request is done, so ``x`` is written
    then, in place, with no copy back (a failed call leaves it untouched). Both members compute
    ``x0 op x1``: the same bits. The combine does not overlap the transfer, which on a loaded
    2-core host it barely did anyway; it saves one pass over the buffer instead.
    """
    peer = 1 - ctx.rank
    incoming = ctx.team.scratch.take("incoming", x.size, x.dtype)
    if x.nbytes <= config.TCP_CHUNK_BYTES:
        receiving = [ctx.irecv(peer, incoming, 1)]
        sending = [ctx.isend(peer, x, 1)]
    else:
        pieces = spans(0, x.size, chunk_elements(x.itemsize))
        receiving = [ctx.irecv(peer, incoming[lo:hi], 1) for lo, hi in pieces]
        sending = [ctx.isend(peer, x[lo:hi], 1) for lo, hi in pieces]
    for request in receiving:
        ctx.wait(request)
    for request in sending:
        ctx.wait(request)
    if ctx.rank:
        fn(incoming, x, out=x)
    else:
        fn(x, incoming, out=x)


def recursive_doubling(ctx: Ctx, buf: np.ndarray, op: ReduceOp, source: np.ndarray | None = None) -> None:
    """Exchange whole buffers with partners at distance 1, 2, 4, ... and combine.

    With p the largest power of two <= size and e = size - p, ranks 2i and 2i + 1 (i < e) first
    fold: the even rank sends its buffer to the odd one and waits; p ranks remain, renumbered
    0..p-1, and run log2(p) exchange rounds; the odd ranks then send the result back. Both peers
    of a round compute ``(value of the lower-numbered half) op (value of the upper half)``, so
    every rank evaluates the same expression tree in the same operand order and the results are
    bit-identical (operand order matters for signed zeros and NaN payloads). Buffers travel in
    chunks, each combined as it arrives. With wire compression both partners of a round round
    their own value to the wire dtype first (each then adds the same two rounded values), and the
    result is rounded once more at the end. Scratch: one buffer (two with compression).
    """
    n, rank = ctx.size, ctx.rank
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    wire = None if ctx.transport.wire_dtype is None else compressed(ctx, buf.dtype, op)
    fn = ufunc(op)
    unfold_step = p.bit_length()  # fold is step 0, the rounds are steps 1 .. log2(p)
    virtual, mine = rank, buf if source is None else source
    if extra or n == 1:
        folded = _fold(ctx, buf, fn, mine, wire, unfold_step)
        if folded is None:
            return
        virtual, mine = folded
    incoming = ctx.team.scratch.take("incoming", buf.size, buf.dtype if wire is None else wire)
    mask, step = 1, 1
    while mask < p:
        partner = virtual ^ mask
        partner = 2 * partner + 1 if partner < extra else partner + extra  # its group rank
        _exchange(ctx, partner, partner, mine, buf, incoming, step, fn, wire,
                  partner_first=bool(virtual & mask))
        mine = buf
        mask, step = mask * 2, step + 1
    if wire is not None:
        round_to(wire, buf)
    if rank < 2 * extra:
        _unfold(ctx, buf, wire, unfold_step)


def _fold(ctx: Ctx, buf: np.ndarray, fn: np.ufunc, mine: np.ndarray, wire: np.dtype | None,
          unfold_step: int) -> tuple[int, np.ndarray] | None:
    """Fold the ranks beyond the largest power of two p: rank 2i (i < size - p) sends ``mine`` to
    rank 2i + 1, which combines it into ``buf`` (the sender's value on the left), and waits for
    the result at ``unfold_step``. Returns None when this rank's result is already in ``buf``
    (a folded rank, or a group of one), else its virtual rank among the p that go on and its
    value so far (``mine``, or ``buf`` after a fold)."""
    n, r = ctx.size, ctx.rank
    extra = n - (1 << (n.bit_length() - 1))
    if n == 1:
        if mine is not buf:
            buf[...] = mine
        return None
    if r >= 2 * extra:
        return r - extra, mine
    if r % 2 == 0:
        send_chunked(ctx, r + 1, mine, 0, wire)
        recv_chunked(ctx, r + 1, buf, unfold_step, wire)
        return None
    incoming = scratch(ctx, "incoming", buf.size, buf.dtype if wire is None else wire)
    _exchange(ctx, None, r - 1, mine, buf, incoming, 0, fn, wire, partner_first=True)
    return r // 2, buf


def _real_rank(ctx: Ctx, virtual: int) -> int:
    """The group rank of virtual rank ``virtual`` after ``_fold``."""
    extra = ctx.size - (1 << (ctx.size.bit_length() - 1))
    return 2 * virtual + 1 if virtual < extra else virtual + extra


def _unfold(ctx: Ctx, buf: np.ndarray, wire: np.dtype | None, unfold_step: int) -> None:
    """Send the result back to the rank this one folded (``_fold``), if any."""
    extra = ctx.size - (1 << (ctx.size.bit_length() - 1))
    if ctx.rank < 2 * extra:
        send_chunked(ctx, ctx.rank - 1, buf, unfold_step, wire)


def _exchange(ctx: Ctx, dst: int | None, src: int, mine: np.ndarray, buf: np.ndarray,
              incoming: np.ndarray, step: int, fn: np.ufunc, wire: np.dtype | None,
              partner_first: bool) -> None:
    """Send ``mine`` to ``dst`` (None: send nothing) while receiving ``src``'s into ``incoming``,
    chunk by chunk, and write each chunk combined (``fn``) with ``mine`` into ``buf`` as it
    arrives (``mine`` may be ``buf``; the partner's value is the left operand when
    ``partner_first``)."""
    size = buf.size
    pieces = [(0, size)] if size * incoming.itemsize <= config.TCP_CHUNK_BYTES else \
        spans(0, size, chunk_elements(incoming.itemsize))
    outgoing = mine
    if wire is not None and dst is not None:
        outgoing = scratch(ctx, "outgoing", buf.size, wire)
        outgoing[...] = mine
        buf[...] = outgoing  # both partners combine the same two rounded values
        mine = buf
    if len(pieces) == 1:  # the common small case, without the loops' comprehensions
        receiving = [ctx.irecv(src, incoming, step)]
        sending = [] if dst is None else [ctx.isend(dst, outgoing, step)]
    else:
        receiving = [ctx.irecv(src, incoming[lo:hi], step) for lo, hi in pieces]
        sending = [] if dst is None else [ctx.isend(dst, outgoing[lo:hi], step) for lo, hi in pieces]
    if wire is None and len(pieces) == 1:  # as the loop below does, inline
        ctx.wait(receiving[0])
        if sending and outgoing is buf:
            ctx.wait(sending[0])
        if partner_first:
            fn(incoming, mine, out=buf)
        else:
            fn(mine, incoming, out=buf)
        if sending and outgoing is not buf:
            ctx.wait(sending[0])
        return
    widened = None if wire is None else scratch(ctx, "widened", pieces[0][1], buf.dtype)
    for index, ((lo, hi), request) in enumerate(zip(pieces, receiving, strict=True)):
        ctx.wait(request)
        if sending and outgoing is buf:
            ctx.wait(sending[index])  # buf[lo:hi] changes next: its send must be out
        _combine_arrived(fn, incoming[lo:hi], widened, mine[lo:hi], buf[lo:hi], partner_first)
    for request in sending:
        ctx.wait(request)


def halving_doubling(ctx: Ctx, buf: np.ndarray, op: ReduceOp, source: np.ndarray | None = None) -> None:
    """Reduce-scatter by recursive halving, then all-gather by recursive doubling (Rabenseifner).

    Moves ring's bytes (about twice the buffer per rank) in 2 log2(p) rounds instead of ring's
    2 (size - 1), each with one partner: with many ranks per core, or a per-message cost, fewer
    rounds are faster. With p the largest power of two <= size, extra ranks fold into a partner
    first and get the result back at the end, as in ``recursive_doubling``. The buffer is cut into
    p segments; in the round with distance d each rank keeps the half of its segments on its own
    side of d and sends the other half to its partner, which combines it with its own (the value
    of the lower-numbered partner as the left operand). Every segment is thus reduced at exactly
    one rank, in one fixed order, and copied from there: the results are bit-identical. Each
    halving round but the last combines the partner's chunks into the buffer they arrived in, in
    place (two operands in memory rather than three; the chunk is still in cache), and the next
    round sends from there; the last writes the finished segment into ``buf``. With wire
    compression, partials travel rounded and are combined into ``buf``; each rank rounds its
    segment before the all-gather. Scratch: 1 - 1/p of the buffer for the halving rounds'
    receives (plus packed copies with compression).
    """
    p = 1 << (ctx.size.bit_length() - 1)
    wire = compressed(ctx, buf.dtype, op)
    rounds = p.bit_length() - 1
    unfold_step = 2 * rounds + 1  # fold is step 0, halving 1 .. rounds, doubling rounds + 1 .. 2 rounds
    folded = _fold(ctx, buf, ufunc(op), buf if source is None else source, wire, unfold_step)
    if folded is None:
        return
    virtual, mine = folded
    offsets = bounds(even_counts(buf.size, p))
    halves: list[tuple[int, bool, _Span, _Span]] = []  # (partner, upper, kept, given), in elements
    lo, hi, mask = 0, p, p >> 1
    while mask:
        partner = _real_rank(ctx, virtual ^ mask)
        mid = (lo + hi) // 2
        upper = bool(virtual & mask)
        kept, given = ((mid, hi), (lo, mid)) if upper else ((lo, mid), (mid, hi))
        halves.append((partner, upper, (offsets[kept[0]], offsets[kept[1]]),
                       (offsets[given[0]], offsets[given[1]])))
        lo, hi = kept
        mask >>= 1
    # Every receive of the rounds is posted before anything is sent: a partner running ahead
    # then finds its messages expected and they land in place (an unexpected message is copied
    # once more: on 2 cores, 4 ranks, 4 MiB, 46% of the messages did, and posting first cut the
    # CPU time per call by 9%). Halving rounds receive into consecutive parts of one scratch
    # buffer, doubling rounds straight into the segments they complete.
    carried = buf.dtype if wire is None else wire
    carrier = buf if wire is None else scratch(ctx, "carrier", buf.size, wire)
    inbox = scratch(ctx, "halves", sum(keep[1] - keep[0] for _, _, keep, _ in halves), carried)
    chunk = chunk_elements(carried.itemsize, ROUND_CHUNKS)
    halving, doubling, start = [], [], 0
    for step, (partner, _, keep, give) in enumerate(halves, 1):
        part = inbox[start:start + keep[1] - keep[0]]
        start += part.size
        halving.append((part, [ctx.irecv(partner, part[a:b], step) for a, b in spans(0, part.size, chunk)]))
        doubling.append([ctx.irecv(partner, carrier[a:b], 2 * rounds + 1 - step)
                         for a, b in spans(give[0], give[1], chunk)])
    fn, base = ufunc(op), 0  # ``mine[i]`` is element ``base + i`` of the buffer
    for step in range(1, rounds + 1):
        partner, upper, keep, give = halves[step - 1]
        part, receiving = halving[step - 1]
        ours = mine[keep[0] - base:keep[1] - base]
        target = part if wire is None and step < rounds else buf[keep[0]:keep[1]]
        _halve(ctx, partner, mine[give[0] - base:give[1] - base], ours, target, part, receiving, step, fn,
               wire, chunk, partner_first=upper)
        mine, base = target, keep[0]
    own = buf[offsets[lo]:offsets[hi]]
    if wire is not None:
        round_to(wire, own)
        carrier[offsets[lo]:offsets[hi]] = own
    for step in range(rounds, 0, -1):
        partner, _, keep, give = halves[step - 1]
        _double(ctx, partner, buf, carrier, keep, give, doubling[step - 1], 2 * rounds + 1 - step, chunk)
    _unfold(ctx, buf, wire, unfold_step)


def _halve(ctx: Ctx, partner: int, outgoing: np.ndarray, ours: np.ndarray, target: np.ndarray,
           incoming: np.ndarray, receiving: list[Request], step: int, fn: np.ufunc,
           wire: np.dtype | None, chunk: int, partner_first: bool) -> None:
    """Send ``outgoing`` to ``partner`` while its values for ``ours`` arrive in ``incoming``
    (``receiving``, posted in ``chunk``-element pieces); write each piece combined with ``ours``
    into ``target`` (``incoming`` itself, or a part of ``buf`` with compression) as it arrives."""
    if wire is not None:
        packed = scratch(ctx, "outgoing", outgoing.size, wire)
        packed[...] = outgoing
        outgoing = packed
    sending = [ctx.isend(partner, outgoing[a:b], step) for a, b in spans(0, outgoing.size, chunk)]
    widened = None if wire is None else scratch(ctx, "widened", min(chunk, incoming.size), target.dtype)
    for (a, b), request in zip(spans(0, incoming.size, chunk), receiving, strict=True):
        ctx.wait(request)
        _combine_arrived(fn, incoming[a:b], widened, ours[a:b], target[a:b], partner_first)
    for request in sending:
        ctx.wait(request)


def _double(ctx: Ctx, partner: int, buf: np.ndarray, carrier: np.ndarray, keep: _Span, give: _Span,
            receiving: list[Request], step: int, chunk: int) -> None:
    """Send ``carrier[keep]`` (this rank's finished segments) to ``partner`` while its finished
    segments arrive in ``carrier[give]`` (``receiving``, posted in chunks); widened into ``buf``
    when ``carrier`` is packed."""
    sending = [ctx.isend(partner, carrier[a:b], step) for a, b in spans(keep[0], keep[1], chunk)]
    for (a, b), request in zip(spans(give[0], give[1], chunk), receiving, strict=True):
        ctx.wait(request)
        if carrier is not buf:
            buf[a:b] = carrier[a:b]
    for request in sending:
        ctx.wait(request)


def _combine_arrived(fn: np.ufunc, arrived: np.ndarray, widened: np.ndarray | None, mine: np.ndarray,
                     out: np.ndarray, partner_first: bool) -> None:
    """Write the partner's ``arrived`` chunk combined with ``mine`` into ``out``: widened first
    (into ``widened``) when it travelled packed, the partner's value as the left operand when
    ``partner_first``."""
    theirs = arrived
    if widened is not None:
        theirs = widened[:arrived.size]
        theirs[...] = arrived
    if partner_first:
        fn(theirs, mine, out=out)
    else:
        fn(mine, theirs, out=out)
