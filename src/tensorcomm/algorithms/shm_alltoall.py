"""Same-host all-to-all with per-pair block sizes: every member copies its block from each peer.

A member's stream is a header (the byte offset of each destination's block, as int64) followed by
the blocks for its peers, packed: its own block never enters the slots (it is copied straight
from input to output), so each byte that crosses members is copied twice and the member's own
block once. Peers read every member's header in the first round, all at once (a strided view of
the headers of all the slots), check the size of the block they get against the size they
expect, and copy their block out of the rounds that carry it. When the call takes one round and
every block has one size, each peer's block comes out of its slot with one numpy call through
views made once per call shape. Outputs only: a call that fails after its first round may leave
them partly written. This module must not import ``core``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ..errors import CollectiveMismatchError
from . import shm_cma
from .allgather import bounds
from .base import Ctx, OneRound, Plan, Team
from .shm_cma import READS_EXTENT
from .shm_common import Journal, Stream, copy, domain, run_rounds


@dataclass(frozen=True, slots=True)
class AllToAll:
    """``all_to_all``'s state for one call shape.

    Attributes:
        d: the group's domain.
        header: this member's header (its packed stream's block offsets), padded to 64 bytes.
        expected: bytes this member expects from each member.
        send_offsets, recv_offsets: element bounds of the blocks of ``send`` and ``out``.
        uniform: when every block this member gets has one size and the call fits one slot:
            where each member's header must place that block, and per IN slot each peer's
            block in its slot, typed; else None.
        outgoing: when this member's stream fits one slot, per IN slot the places of its
            blocks for the peers in its slot, typed (the one-slot fast path); else None.
        nbytes: bytes of this member's stream (header included).
        header_slots: per IN slot the place of this member's header in its slot.
        places: per IN slot where each member's header places the block for this member:
            columns ``rank, rank + 1`` of every member's header, as one strided view of the slots.
        peer_place: on two members with ``uniform``, per IN slot those two words of the peer's
            header alone (a memoryview: read without a numpy call); else None.
        reads: where the group may read its members' memory directly, the state of that design
            for this call shape (``shm_cma.prepare_all_to_all``), for a call a peer starts so
            (``shm_cma.READS_EXTENT``); else None.
    """

    d: Any
    header: np.ndarray
    expected: list[int]
    send_offsets: list[int]
    recv_offsets: list[int]
    uniform: tuple[list[list[int]], tuple[tuple[np.ndarray, ...], ...]] | None
    outgoing: tuple[tuple[np.ndarray, ...], ...] | None
    nbytes: int
    header_slots: tuple[np.ndarray, np.ndarray]
    places: tuple[np.ndarray, np.ndarray]
    peer_place: tuple[memoryview, memoryview] | None
    reads: Any


def prepare(team: Team, plan: Plan, send: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
            recv_counts: Sequence[int]) -> AllToAll:
    """``all_to_all``'s state."""
    d = domain(team, plan)
    n, r, itemsize = d.size, d.rank, send.itemsize
    sizes = [0 if j == r else count * itemsize for j, count in enumerate(send_counts)]
    offsets = np.cumsum([0, *sizes], dtype=np.int64)  # packed: this member's own block is empty
    header_bytes = -(-offsets.nbytes // 64) * 64
    header = np.zeros(header_bytes, dtype=np.uint8)
    header[:offsets.nbytes] = offsets.view(np.uint8)
    headers = tuple(d.stacked(p, np.dtype(np.int64), n + 1) for p in (0, 1))
    expected = [count * itemsize for count in recv_counts]
    block = recv_counts[0] * itemsize
    uniform = None
    if len(set(recv_counts)) == 1 and header_bytes + (n - 1) * block <= d.slot_bytes:
        # In peer q's packed stream the block for r follows those for r's r or r - 1 others.
        places = [[(r - (q < r)) * block, (r - (q < r) + 1) * block] for q in range(n)]
        places[r] = offsets[r:r + 2].tolist()  # this member's own header
        views = tuple(tuple(d.inbox[q][p][header_bytes + places[q][0]:][:block].view(send.dtype)
                            for q in d.peers) for p in (0, 1))
        uniform = places, views
    nbytes = header_bytes + int(offsets[-1])
    outgoing = None
    if nbytes <= d.slot_bytes:
        outgoing = tuple(tuple(d.inbox[r][p][header_bytes + offsets[j]:header_bytes + offsets[j + 1]]
                               .view(send.dtype) for j in d.peers) for p in (0, 1))
    header_slots = (d.inbox[r][0][:header_bytes], d.inbox[r][1][:header_bytes])
    places_of = (headers[0][:, r:r + 2], headers[1][:, r:r + 2])
    peer_place = None
    if uniform is not None and n == 2:
        peer_place = (memoryview(d.inbox[1 - r][0][:header_bytes]).cast("q")[r:r + 2],
                      memoryview(d.inbox[1 - r][1][:header_bytes]).cast("q")[r:r + 2])
    reads = shm_cma.prepare_all_to_all(team, plan, send, send_counts, out, recv_counts) if d.cma else None
    return AllToAll(d, header, expected, bounds(send_counts), bounds(recv_counts), uniform,
                    outgoing, nbytes, header_slots, places_of, peer_place, reads)


def all_to_all(ctx: Ctx, send: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
               recv_counts: Sequence[int]) -> None:
    """Block ``j`` of member ``i``'s ``send`` lands in block ``i`` of member ``j``'s ``out``.

    Args:
        send: 1-D, ``sum(send_counts)`` elements, block ``j`` for member ``j``.
        send_counts: elements this member sends each member.
        out: 1-D, ``sum(recv_counts)`` elements, block ``i`` from member ``i``.
        recv_counts: elements this member receives from each member.
    """
    s: AllToAll = ctx.plan.state
    if s.outgoing is not None and s.uniform is not None:  # one round, blocks of one size
        in_slot = s.d.next_round()
        publish(s, send, in_slot)
        s.d.start(ctx, s.nbytes)
        after_first_round(s, send, send_counts, out, recv_counts, ctx, in_slot)
        return
    _rounds(ctx, s, send, send_counts, out, recv_counts, None)


def publish(s: AllToAll, send: np.ndarray, in_slot: int) -> None:
    """Write this member's header and its blocks for the peers into its IN slot ``in_slot``
    (its stream fits one slot: ``AllToAll.outgoing``)."""
    s.header_slots[in_slot][...] = s.header
    send_offsets = s.send_offsets
    for j, place in zip(s.d.peers, s.outgoing[in_slot], strict=True):  # type: ignore[index]
        copy(place, send[send_offsets[j]:send_offsets[j + 1]])


def one_round(s: AllToAll, ctx: Ctx, in_slot: int) -> bool:
    """Whether the first round in IN slot ``in_slot`` was the whole call: every peer started
    through the slots, its stream fitted its slot and put this member's block where ``uniform``
    has it (read once every peer's first post is there; a peer in another call reads as
    anything, which ``start`` or ``meet`` then reports)."""
    d, uniform = s.d, s.uniform
    assert uniform is not None  # a one-round call
    if s.peer_place is not None:  # two members: one extent, the peer's two header words
        peer = 1 - d.rank
        return (READS_EXTENT < d.extent(peer, ctx) <= d.slot_bytes
                and s.peer_place[in_slot].tolist() == uniform[0][peer])
    extents = d.extents(ctx)
    return (min(extents) > READS_EXTENT and max(extents) <= d.slot_bytes
            and s.places[in_slot].tolist() == uniform[0])


def after_first_round(s: AllToAll, send: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
                      recv_counts: Sequence[int], ctx: Ctx, in_slot: int) -> None:
    """The rest of a call whose first round (``publish``, then ``start``) fitted this member's
    stream: where it was the whole call (``one_round``), copy the blocks out of the slots; else go
    on round by round."""
    d, uniform, recv_offsets, send_offsets = s.d, s.uniform, s.recv_offsets, s.send_offsets
    assert uniform is not None  # a one-round call
    r = d.rank
    if not one_round(s, ctx, in_slot):
        _rounds(ctx, s, send, send_counts, out, recv_counts, in_slot)
        return
    for q, block in zip(d.peers, uniform[1][in_slot], strict=True):
        copy(out[recv_offsets[q]:recv_offsets[q + 1]], block)
    copy(out[recv_offsets[r]:recv_offsets[r + 1]], send[send_offsets[r]:send_offsets[r + 1]])


class _ReadingPeer(Exception):
    """A peer started the call reading directly (``shm_cma.READS_EXTENT``): ``_rounds``'
    ``verify`` ends the rounds with it before anything is read."""


def bind(plan: Plan, send: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
         recv_counts: Sequence[int]) -> OneRound | None:
    """``all_to_all`` as one bound round (``OneRound``) where it starts with one round of blocks
    of one size: the same ``publish``, then ``after_first_round`` (which goes on round by round
    where a peer's stream did not fit); else None."""
    s: AllToAll = plan.state
    if s.outgoing is None or s.uniform is None:
        return None
    put = tuple((partial(publish, s, send, p),) for p in (0, 1))
    return OneRound(s.d, (put[0], put[1]), ((), ()), s.nbytes,
                    finish=partial(after_first_round, s, send, send_counts, out, recv_counts),
                    whole=partial(one_round, s))


def _rounds(ctx: Ctx, s: AllToAll, send: np.ndarray, send_counts: Sequence[int], out: np.ndarray,
            recv_counts: Sequence[int], started: int | None) -> None:
    """The call round by round (``run_rounds``), its first round already started in IN slot
    ``started`` (``after_first_round``) or not (None)."""
    d, header, expected, uniform = s.d, s.header, s.expected, s.uniform
    send_offsets, recv_offsets, header_bytes = s.send_offsets, s.recv_offsets, s.header.size
    r, itemsize = d.rank, out.itemsize
    raw = out.view(np.uint8)
    taken: list[tuple[int, int, int]] = []  # (peer, start, stop) of this member's block in its stream
    whole: list[tuple[np.ndarray, ...]] = []  # each peer's block in its slot, when that applies

    def verify(in_slot: int, extents: list[int]) -> None:
        if READS_EXTENT in extents:
            raise _ReadingPeer
        pairs = s.places[in_slot].tolist()  # where each member's block for r lies
        if uniform is not None and pairs == uniform[0] and max(extents) <= d.slot_bytes:
            whole.append(uniform[1][in_slot])
            return
        sizes = [stop - start for start, stop in pairs]
        sizes[r] = expected[r]  # this member's own block does not travel
        if sizes != expected:
            q = next(q for q, size in enumerate(sizes) if size != expected[q])
            raise CollectiveMismatchError(
                f"rank {d.global_ranks[q]} called {ctx.name} sending {sizes[q] // itemsize} "
                f"elements to rank {d.global_ranks[r]}, which called it expecting "
                f"{expected[q] // itemsize}, at step {ctx.seq}")
        for q in d.peers:
            start = pairs[q][0] + header_bytes
            taken.append((q, start, start + sizes[q]))

    def read(in_slot: int, lo: int, hi: int, journal: Journal | None) -> None:
        if whole:
            for q, slot in zip(d.peers, whole[0], strict=True):
                copy(out[recv_offsets[q]:recv_offsets[q + 1]], slot)
            return
        for q, start, stop in taken:
            a, b = max(lo, start), min(hi, stop)
            if a < b:
                base = recv_offsets[q] * itemsize
                copy(raw[base + a - start:base + b - start], d.inbox[q][in_slot][a - lo:b - lo])

    blocks = [send[send_offsets[j]:send_offsets[j + 1]] for j in d.peers]
    try:
        run_rounds(ctx, Stream.of(blocks, start=header_bytes), read, verify=verify, header=header,
                   started=started)
    except _ReadingPeer:  # every member saw it in the first round's extents: all read directly
        assert s.reads is not None  # a peer reads directly only where the group can (``select``)
        shm_cma.all_to_all_joined(ctx, s.reads, send, send_counts, out, recv_counts)
        return
    copy(out[recv_offsets[r]:recv_offsets[r + 1]], send[send_offsets[r]:send_offsets[r + 1]])
