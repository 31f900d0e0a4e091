"""Same-host reduce-scatter: member ``i`` reduces block ``i`` of every member's input.

Members publish their input (in the accumulation dtype, premultiplied: ``kernels``' rule), one
slot per round when it does not fit one; member ``i`` reduces block ``i`` of every member's
terms, in member order, with one numpy call per round, into its output as each round brings it
(an output only: a call that fails after its first round may leave it partly written). Two
members publish only the block their peer reduces and take their own terms from their input
(``_pair``): half the bytes through the slots. More members publish their whole input and
reduce over a strided view of all the slots. This module must not import ``core``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from .allgather import bounds
from .base import Ctx, OneRound, Plan, Team
from .shm_common import (
    Journal,
    Op,
    Reduction,
    Stream,
    bound_copy,
    copy,
    domain,
    load,
    reduce_terms,
    run_rounds,
)


@dataclass(frozen=True, slots=True)
class ReduceScatter:
    """``reduce_scatter``'s state for one call shape.

    Attributes:
        d: the group's domain.
        red: the reduction (the plan's).
        offsets: element bounds of each member's block.
        pair: two members (``_pair``).
        terms: when the input fits one slot, per IN slot: on two members (this member's
            published block, the peer's block for it), typed; on more, block ``rank`` of every
            member's slot as one strided array. Else None (rounds).
        mine: on more than two members, per IN slot this member's slot (the whole input), when
            it fits; else None.
        plain: two members, one round, the caller's bytes are the terms (``red.raw``), no AVG
            division, and ``red.ufunc`` takes ``out`` positionally: a call is one copy into the
            slot and one ufunc call (``reduce_scatter``'s small-call path).
    """

    d: Any
    red: Reduction
    offsets: list[int]
    pair: bool
    terms: Any
    mine: Any
    plain: bool = False


def prepare(team: Team, plan: Plan, send: np.ndarray, out: np.ndarray, counts: Sequence[int],
            op: Op) -> ReduceScatter:
    """``reduce_scatter``'s state."""
    d = domain(team, plan)
    red = plan.reduction
    if red is None:
        raise TypeError(f"{plan.label}: a reduction's plan has no reduction descriptor")
    r, size = d.rank, red.acc.itemsize
    offsets = bounds(counts)
    if d.size == 2:
        peer = 1 - r
        pairs = None
        if max(counts) * size <= d.slot_bytes:
            pairs = tuple((d.inbox[r][p][:counts[peer] * size].view(red.acc),
                           d.inbox[peer][p][:counts[r] * size].view(red.acc)) for p in (0, 1))
        plain = pairs is not None and red.raw and red.positional and not red.average
        return ReduceScatter(d, red, offsets, True, pairs, None, plain)
    if offsets[-1] * size > d.slot_bytes:
        return ReduceScatter(d, red, offsets, False, None, None)
    a, b = offsets[r], offsets[r + 1]
    stacked = [d.stacked(p, red.acc, offsets[-1]) for p in (0, 1)]
    return ReduceScatter(d, red, offsets, False, (stacked[0][:, a:b], stacked[1][:, a:b]),
                         (stacked[0][r], stacked[1][r]))


def reduce_scatter(ctx: Ctx, send: np.ndarray, out: np.ndarray, counts: Sequence[int], op: Op) -> None:
    """Reduce block ``i`` of ``send`` across members into member ``i``'s ``out``.

    Args:
        send: this member's 1-D input, ``sum(counts)`` elements, block ``i`` for member ``i``.
        out: this member's 1-D output, ``counts[ctx.rank]`` elements.
        counts: block sizes (the same on every member).
        op: the caller's reduction.
    """
    s: ReduceScatter = ctx.plan.state
    if s.plain:  # ``_pair``'s one round, with ``load`` and ``reduce_terms`` reduced to their numpy calls
        d, offsets, ufunc = s.d, s.offsets, s.red.ufunc
        r = d.rank
        mine, theirs = s.terms[d.next_round()]
        copy(mine, send[offsets[1 - r]:offsets[2 - r]])  # the peer's block of this member's terms
        d.start(ctx)  # nobody reads extents in one round
        own = send[offsets[r]:offsets[r + 1]]
        if r == 0:  # in member order, so both members compute the same bits
            ufunc(own, theirs, out)
        else:
            ufunc(theirs, own, out)
        return
    if s.pair:
        _pair(ctx, s, send, out)
        return
    d, red, offsets, terms, mine = s.d, s.red, s.offsets, s.terms, s.mine
    r = d.rank
    if terms is not None:  # one round: every member's block r, reduced in one call
        in_slot = d.next_round()
        load(red, mine[in_slot], send)
        d.start(ctx)  # nobody reads extents in one round
        reduce_terms(red, terms[in_slot], out)
        return
    terms = send
    if not red.raw:  # terms travel in the accumulation dtype, premultiplied
        terms = np.empty(send.size, dtype=red.acc)
        load(red, terms, send)
    itemsize = red.acc.itemsize
    start, stop = offsets[r] * itemsize, offsets[r + 1] * itemsize

    def read(in_slot: int, lo: int, hi: int, journal: Journal | None) -> None:
        a, b = max(lo, start), min(hi, stop)
        if a < b:
            window = d.stacked(in_slot, red.acc, (b - a) // itemsize, offset=a - lo)
            reduce_terms(red, window, out[(a - start) // itemsize:(b - start) // itemsize])

    run_rounds(ctx, Stream.of([terms]), read)  # ``out`` is an output only: no journal


def bind(plan: Plan, send: np.ndarray, out: np.ndarray, counts: Sequence[int], op: Op) -> OneRound | None:
    """``reduce_scatter`` as one bound round (``OneRound``) where ``reduce_scatter`` runs its
    plain two-member round or its one round on more members; else None."""
    s: ReduceScatter = plan.state
    d, red, offsets, terms = s.d, s.red, s.offsets, s.terms
    r = d.rank
    if s.plain:
        given, own = send[offsets[1 - r]:offsets[2 - r]], send[offsets[r]:offsets[r + 1]]
        put = tuple((bound_copy(terms[p][0], given),) for p in (0, 1))
        ufunc = red.ufunc  # in member order, as ``reduce_scatter`` reduces
        take = tuple((partial(ufunc, *((own, terms[p][1]) if r == 0 else (terms[p][1], own)), out),)
                     for p in (0, 1))
    elif not s.pair and terms is not None:
        put = tuple((partial(load, red, s.mine[p], send),) for p in (0, 1))
        take = tuple((partial(reduce_terms, red, terms[p], out),) for p in (0, 1))
    else:
        return None
    return OneRound(d, (put[0], put[1]), (take[0], take[1]))


def _pair(ctx: Ctx, s: ReduceScatter, send: np.ndarray, out: np.ndarray) -> None:
    """``reduce_scatter`` on two members: each publishes only its peer's block of terms, and
    reduces its own block of ``send`` with the peer's, in member order."""
    d, red, offsets, views = s.d, s.red, s.offsets, s.terms
    r = d.rank
    peer = 1 - r
    given = send[offsets[peer]:offsets[peer + 1]]  # the block this member hands its peer
    own = send[offsets[r]:offsets[r + 1]]
    if not red.raw:  # terms in the accumulation dtype, premultiplied
        terms = np.empty(own.size, dtype=red.acc)
        load(red, terms, own)
        own = terms
    if views is not None:  # one round
        in_slot = d.next_round()
        mine, theirs = views[in_slot]
        load(red, mine, given)
        d.start(ctx)  # nobody reads extents in one round
        reduce_terms(red, (own, theirs) if r == 0 else (theirs, own), out)  # type: ignore[arg-type]
        return
    if not red.raw:
        staged = np.empty(given.size, dtype=red.acc)
        load(red, staged, given)
        given = staged
    itemsize = red.acc.itemsize
    stop = own.size * itemsize
    source = d.inbox[peer]

    def read(in_slot: int, lo: int, hi: int, journal: Journal | None) -> None:
        b = min(hi, stop)
        if lo < b:
            i, j = lo // itemsize, b // itemsize
            theirs = source[in_slot][:b - lo].view(red.acc)
            reduce_terms(red, (own[i:j], theirs) if r == 0 else (theirs, own[i:j]),  # type: ignore[arg-type]
                        out[i:j])

    run_rounds(ctx, Stream.of([given]), read)  # ``out`` is an output only: no journal
