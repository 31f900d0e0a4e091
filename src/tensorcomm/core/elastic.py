"""Shrinking a group to its survivors: the agreement behind ``Group.shrink`` (ULFM's
``MPIX_Comm_shrink``).

Owns the protocol below. Imports ``errors`` only (the world and its store, transport and
shared-memory set-up are handed in as a ``Registry``, which ``core.world.World`` is);
``core/group.py`` turns the agreement into a ``Group``.

The survivors agree through the world's store, which must outlive the ranks that fail (the
launcher's, or one passed to ``init(store=...)``; a store rank 0 hosts dies with it, as does the
one it hosts beside a torch store, ``rendezvous.own_store``). Every decision is one
``compare_set`` on a key nobody has set yet: the first value wins, whoever wrote it, so every
survivor reads the same decisions, and a rank that comes back after them (one that was stopped,
say) reads them too and learns that it was left out.

Keys, under ``shrink/<group id>/<n>/`` for the n-th shrink of that group::

    here/<rank>       the rank arrived; value: the ranks its transport had lost by then
    <a>/proposal      round a's members and new group id ("5:0,2,3"); the first proposal wins
    <a>/ack/<rank>    the rank set up its part of round a's group ("1": with shared memory)
    <a>/outcome       "ok", or "retry:<ranks>": round a failed and leaves those ranks out

Round a, on every member that arrives:

1. Gather: wait until every member of the group has arrived, is known lost (its transport link
   closed: the process died or left), or was left out by an earlier round; or until ``timeout``
   passes, which leaves out whoever is still missing (too slow counts as gone). Then propose the
   members that arrived and are not lost, minus one of every pair whose link is broken (the
   later one; by the arrivals' reports), under a fresh group id.
2. Set up: a member left out of the winning proposal raises ``ExcludedError``. The others set up
   the new group's shared memory if it can have some (giving up at once when a member is lost or
   the round's outcome is already written).
3. Conclude: each member acknowledges and waits for the others. The first to see every
   acknowledgement writes "ok"; the first to see a missing member lost, or ``timeout`` pass,
   writes "retry" naming the missing ones. "ok": the group is the proposal's. "retry": the next
   round, without them.

So a second failure during the agreement is seen in step 1 (the rank is left out) or in steps
2-3 (the round is retried without it); a failure after "ok" shows in the new group's first call,
and shrinking that group leaves it out in turn.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..errors import ExcludedError, RendezvousError

if TYPE_CHECKING:
    from ..rendezvous.store import Store
    from ..transports.shm.domain import ShmDomain

log = logging.getLogger("tensorcomm.elastic")

POLL_FIRST, POLL_MAX = 0.001, 0.02  # seconds between looks at the store, doubling


class Registry(Protocol):
    """The world as a shrink uses it (``core.world.World``): its store and this rank, which
    peers it knows lost, fresh group ids and new groups' shared memory."""

    rank: int

    @property
    def store(self) -> Store: ...

    def lost_peers(self, ranks: frozenset[int]) -> frozenset[int]: ...

    def take_group_id(self) -> int: ...

    def open_shared_memory(self, ranks: tuple[int, ...], group_id: int, name: str,
                           abandon: Callable[[], str | None] | None = None,
                           timeout: float | None = None) -> ShmDomain | None: ...


@dataclass(frozen=True)
class Agreement:
    """What a shrink agreed on: the survivors (global ranks, in the old group's order), the new
    group's id, and this member's shared-memory domain of it (None: the group uses TCP)."""

    ranks: tuple[int, ...]
    group_id: int
    shm: ShmDomain | None


def choose(members: Sequence[int], arrived: Mapping[int, frozenset[int]], lost: frozenset[int],
           left_out: frozenset[int]) -> tuple[int, ...]:
    """The members a proposal keeps, in group order: those that arrived (``arrived[r]``: the
    ranks ``r`` had lost), are not ``lost`` here and not ``left_out``, leaving out a member when
    it and one kept before it report each other's link broken."""
    kept: list[int] = []
    for r in members:
        if r not in arrived or r in lost or r in left_out:
            continue
        if any(r in arrived[k] or k in arrived[r] for k in kept):
            continue
        kept.append(r)
    return tuple(kept)


def agree(world: Registry, group_id: int, n: int, members: Sequence[int], name: str,
          timeout: float) -> Agreement:
    """Run the n-th shrink of group ``group_id`` (of ``members``, named ``name``) on this rank.

    Raises:
        ExcludedError: the others agreed without this rank.
        RendezvousError: the store is gone.
    """
    try:
        return _Shrink(world, group_id, n, tuple(members), name, timeout).run()
    except RendezvousError as exc:
        raise RendezvousError(
            f"group {name!r}: shrink() lost the store ({exc}). The survivors agree through it, so "
            "it must outlive the ranks that fail: a store rank 0 hosts (env:// or tcp:// without a "
            "launcher, or beside torch's store) dies with rank 0; run under `tensorcomm run "
            "--keep-going`, or pass init(store=...) a tensorcomm store that outlives the ranks") from exc


def _ranks_text(ranks: Sequence[int]) -> str:
    return ",".join(map(str, ranks))


def _rank_list(text: str) -> tuple[int, ...]:
    return tuple(int(r) for r in text.split(",") if r)


class _Shrink:
    """One member's side of one shrink (see the module docstring)."""

    def __init__(self, world: Registry, group_id: int, n: int, members: tuple[int, ...], name: str,
                 timeout: float) -> None:
        self.world = world
        self.store = world.store
        self.me = world.rank
        self.members = members
        self.name = name
        self.label = f"{name}/shrink{n}"
        self.timeout = timeout
        self.prefix = f"shrink/{group_id}/{n}/"

    def lost(self) -> frozenset[int]:
        return self.world.lost_peers(frozenset(self.members))

    def run(self) -> Agreement:
        store, prefix = self.store, self.prefix
        store.set(f"{prefix}here/{self.me}", _ranks_text(sorted(self.lost())).encode())
        left_out: frozenset[int] = frozenset()
        round_ = 0
        while True:
            group_id, ranks = self.gather(round_, left_out)
            if self.me not in ranks:
                raise ExcludedError(
                    f"rank {self.me} was left out when group {self.name!r} shrank to ranks "
                    f"{list(ranks)}: it came after they had waited {self.timeout:g} s for it, "
                    "stopped answering during the agreement, or they had lost their connection "
                    "to it. It cannot rejoin them: end this process (or destroy() and init() a "
                    "new world)")
            shm = self.world.open_shared_memory(ranks, group_id, self.label,
                                                functools.partial(self.abandon, round_, ranks),
                                                self.timeout)
            try:
                dropped = self.conclude(round_, ranks, shm is not None)
                keep = dropped is None and shm is not None and all(
                    store.get(f"{prefix}{round_}/ack/{r}") == b"1" for r in ranks)
            except BaseException:
                if shm is not None:
                    shm.close()
                raise
            if shm is not None and not keep:
                shm.close()
            if dropped is None:
                return Agreement(ranks, group_id, shm if keep else None)
            log.warning("group %r: ranks %s were lost during the shrink; agreeing again without them",
                        self.name, sorted(dropped))
            left_out |= (frozenset(self.members) - frozenset(ranks)) | dropped
            round_ += 1

    def gather(self, round_: int, left_out: frozenset[int]) -> tuple[int, tuple[int, ...]]:
        """Step 1: the round's proposal (group id, ranks), made here if nobody made one yet."""
        store, key = self.store, f"{self.prefix}{round_}/proposal"
        deadline = time.monotonic() + self.timeout
        arrived: dict[int, frozenset[int]] = {}
        pause = POLL_FIRST
        while not store.check([key]):
            for r in self.members:
                here = f"{self.prefix}here/{r}"
                if r not in arrived and r not in left_out and store.check([here]):
                    arrived[r] = frozenset(_rank_list(store.get(here).decode()))
            lost = self.lost()
            missing = [r for r in self.members
                       if r not in arrived and r not in lost and r not in left_out]
            if missing and time.monotonic() < deadline:
                time.sleep(pause)
                pause = min(2 * pause, POLL_MAX)
                continue
            if missing:
                log.warning("group %r: ranks %s did not arrive within %g s; shrinking without them",
                            self.name, missing, self.timeout)
            ranks = choose(self.members, arrived, lost, left_out)
            store.compare_set(key, b"", f"{self.world.take_group_id()}:{_ranks_text(ranks)}".encode())
            break
        group_id, _, members = store.get(key).decode().partition(":")
        return int(group_id), _rank_list(members)

    def abandon(self, round_: int, ranks: tuple[int, ...]) -> str | None:
        """Why to stop setting up round ``round_``'s shared memory, if there is a reason."""
        gone = self.lost() & frozenset(ranks)
        if gone:
            return f"ranks {sorted(gone)} were lost"
        if self.store.check([f"{self.prefix}{round_}/outcome"]):
            return "the shrink's round ended"
        return None

    def conclude(self, round_: int, ranks: tuple[int, ...], shm: bool) -> frozenset[int] | None:
        """Step 3: acknowledge, wait for the outcome; None for "ok", else the ranks to drop."""
        store, prefix = self.store, f"{self.prefix}{round_}/"
        store.set(f"{prefix}ack/{self.me}", b"1" if shm else b"0")
        key = prefix + "outcome"
        deadline = time.monotonic() + self.timeout
        acked: set[int] = set()
        pause = POLL_FIRST
        while not store.check([key]):
            acked.update(r for r in ranks if r not in acked and store.check([f"{prefix}ack/{r}"]))
            missing = frozenset(ranks) - acked
            gone = missing & self.lost()
            if not missing:
                store.compare_set(key, b"", b"ok")
            elif gone or time.monotonic() >= deadline:
                store.compare_set(key, b"", f"retry:{_ranks_text(sorted(gone or missing))}".encode())
            else:
                time.sleep(pause)
                pause = min(2 * pause, POLL_MAX)
        outcome = store.get(key).decode()
        return None if outcome == "ok" else frozenset(_rank_list(outcome.removeprefix("retry:")))
