"""A persistent call that is one round of the shared-memory protocol, run in one Python frame.

A persistent request (``core.persistent.Prequest``) whose algorithm binds it as one round
(``Row.bind`` made a ``OneRound``: the small all_reduce, all_gather, reduce_scatter, broadcast and
all_to_all) runs through the closure ``runner`` makes instead of the group's ordinary path,
whenever it can start at once. It takes the same steps in the same order, with the same effects,
as the ordinary path that runs the request otherwise; each step is a copy of code that lives
elsewhere, because at 8 bytes every Python call it saves costs about a tenth of the protocol itself
(``benchmarks/bare_protocol.py``; docs/performance.md has the figures):

- ``Engine.enter`` / ``leave``: the call's place in the group's issue order and its sequence
  number (a call queued or running ahead, or a stopped engine: the closure steps aside);
- ``recorder.begin`` / ``done``: its flight record (a recorder that keeps callers' sites or
  feeds a timeline: the closure steps aside);
- ``ShmDomain.next_round`` and ``Slots.start``: the round's IN slot, the announcement (step,
  token, extent), the post, the wait for every peer and the comparison of their tokens;
- ``group._execute``: ``Group.last_call``; when anything fails it calls the same ``_failing``.

The call's ``Ctx`` is the request's own, made once: its step is set each run, its deadline only
when the round has to wait (``Slots._block`` reads it) or goes on with more rounds, since a round
that finds its peers there never reads the clock for it (nor sweeps the group's idle scratch, as
``Ctx.of`` does: the next ordinary call does). The group drops the closure when it stops or the
process is forked (``Group._stop``, ``World._inherited``): it holds views of the group's shared
memory and the engine of its time. ``tests/multiprocess/test_one_round.py`` runs each copy beside
its original; ``tests/unit/test_inlined.py`` counts them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from threading import get_ident
from typing import TYPE_CHECKING

from ..algorithms.base import Ctx, OneRound
from ..trace import recorder
from ..transports.shm.slots import H_FAULT
from .group import _failing

if TYPE_CHECKING:
    from .group import Group

_monotonic = time.monotonic
_now = recorder._now  # the recorder's clock


def runner(group: Group, ctx: Ctx, one: OneRound) -> Callable[[], bool]:
    """A function that runs one round of ``one`` on ``group`` as the call ``ctx.plan`` and
    returns True, or returns False at once, having done nothing, where the ordinary path must run
    it (a call of the group runs or is queued ahead of it, the group stopped, or the recorder keeps
    sites or feeds a timeline). Raises what the ordinary path raises."""
    engine, team, plan, signature = group._engine, ctx.team, ctx.plan, ctx.signature
    running = engine._running
    acquire, release = running.acquire, running.release
    queue = engine._queue
    d = one.domain
    slots = d.slots
    words, peers = slots.words, slots.peers
    put, take, extent, extents, verify, finish = one.put, one.take, one.extent, one.extents, one.verify, \
        one.finish
    digest = hash(tuple(signature))  # as ``Slots._announce_signature`` hashes it
    my_entry, my_counter, my_sleepers = slots._my_entry, slots._my_counter, slots._my_sleepers
    peer_counters, peer_tokens = slots._peer_counters, slots._peer_tokens
    peer_extents = None if extents is None else tuple(
        tuple((slots._entry[q][p] + 2, extents[q]) for q in peers) for p in (0, 1))
    rec = recorder

    def run() -> bool:
        if rec._sites or rec.sink is not None or not acquire(False):
            return False
        # ``Engine.enter``, inline
        if queue or engine._stopped is not None:
            release()
            return False
        engine._inline = thread = get_ident()
        seq = engine._seq
        engine._seq = seq + 1
        try:
            # ``_execute``: the plan that ran, the step, and ``recorder.begin``, inline
            group._last_plan = plan
            ctx.seq = seq
            size = rec._size
            index = -1
            if size:
                index = next(rec._counter)
                rec._ring[index % size] = (index, seq, team, plan, _now(), thread)
            try:
                # ``ShmDomain.next_round``, inline
                in_slot = d._round & 1
                d._round += 1
                for step in put[in_slot]:
                    step()
                # ``Slots.start``, inline
                if slots.failure is not None or words[H_FAULT]:
                    raise slots.refusal()
                step_parity = seq & 1
                if slots._written[step_parity][0] is not signature:
                    slots._announce_signature(step_parity, signature)
                token = digest ^ seq
                entry = my_entry[step_parity]
                words[entry] = seq
                words[entry + 1] = token
                if extent is not None:
                    words[entry + 2] = extent
                slots.posts = target = slots.posts + 1
                words[my_counter] = target
                if words[my_sleepers]:
                    slots._wake_sleepers()
                timed = False  # the deadline is set once, when the run first has to wait
                for word in peer_counters:
                    if words[word] < target:
                        ctx.deadline = _monotonic() + team.timeout
                        timed = True
                        slots._block(peers, target, ctx)
                        break
                for word in peer_tokens[step_parity]:
                    if words[word] != token:
                        raise slots._mismatch(word, ctx)
                if peer_extents is not None:
                    for word, expected in peer_extents[step_parity]:
                        if words[word] != expected:
                            verify(ctx)  # type: ignore[misc]  # given with extents
                if finish is not None:  # it may wait for more rounds
                    if not timed:
                        ctx.deadline = _monotonic() + team.timeout
                    finish(ctx, in_slot)
                for step in take[in_slot]:
                    step()
            except BaseException as exc:
                cause = _failing(ctx, exc, index)
                if cause is exc:
                    raise
                raise cause from exc
            if index >= 0:  # ``recorder.done``, inline
                ring = rec._ring
                if ring:  # (``configure`` may have emptied it meanwhile, from another thread)
                    slot = index % len(ring)
                    if ring[slot][0] == index:
                        rec._ended[slot] = _now()
        finally:
            # ``Engine.leave``, inline
            engine._inline = None
            release()
        return True

    return run
