"""A group's shared-memory domain: its segment, the slots in it, and the per-call bookkeeping.

Owns the data layout of the segment (after the control area of ``slots.py``), the views
algorithms read and write, the count of posts and rounds that every member keeps in step, the
failure state of the group's shared-memory path, and opening/closing all of it. Imports
``arena``, ``slots`` and ``errors``; knows nothing of collectives (``algorithms/shm_*.py`` do).

Layout of the segment, for ``n`` members::

    control area   header + one 1 KiB line per member (slots.py)            page-aligned
    member 0       IN slot 0 | IN slot 1 (slot_bytes each) | OUT (out_bytes)
    member 1       ...

A member writes only its own IN slots and OUT region (and its own control line); everyone reads
everyone's. The members are laid out at one stride, so the same slot of every member is one
strided ``(members, count)`` array (``stacked``): a reduction over all of them is one numpy call,
whatever the number of members. IN slots alternate by *round*: ``next_round`` hands out the
IN slot (0 or 1) of each round a call uses, the only place rounds advance, in step on every member, so a
member can fill its next slot while slower peers still read the previous one: the algorithms'
invariant (docs/transports.md) is that a member writes slot ``p`` of round ``g`` only after
every peer has posted in round ``g - 1``, hence finished reading round ``g - 2``.

After any failure of a call (a peer lost, a mismatch, a timeout, an abort, even a local
KeyboardInterrupt) the members' counters no longer match, so the domain refuses every later call
with an error of the same kind: the group has to be rebuilt.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import CommError, PeerLostError
from . import arena as arena_mod
from . import cma
from . import slots as slots_mod
from .arena import Arena, ShmUnavailable
from .mailbox import Mailbox, region_bytes
from .slots import CallInfo, Slots

log = logging.getLogger("tensorcomm.shm")

SLOT_BYTES = 1 << 20  # one IN slot; a call whose contribution fits one slot takes one round
# Per member: large all-reduces keep their reduced parts here until the last wait, and a
# broadcast's root its whole array, so a failed call cannot have touched the caller's array
# without a backup copy (``shm_common.Journal``). 64 MiB covers all-reduces of 64 MiB x members
# and broadcasts of 64 MiB. The segment's pages are allocated when first written: a group that
# never moves that much never holds it, and one that does holds it instead of the same bytes of
# private backup. A call too large for the region takes the algorithm's other way (all-reduce
# parts copied out chunk by chunk, a broadcast round by round; ``algorithms/shm_*.py``).
OUT_BYTES = 64 << 20
# Every member maps every member's region: past OUT_TOTAL_BYTES / OUT_BYTES (8) members the
# regions share OUT_TOTAL_BYTES, so the segment's size stays bounded (at 128 members 4 MiB each,
# 768 MiB in all with the slots, where 64 MiB each mapped 8.4 GiB of address space per rank).
# Members up to 8 keep 64 MiB, and their choices, unchanged.
# A share still holds the two parts of a slot's chunk that ``shm_split`` and ``pipelined`` keep
# there (about 2 x SLOT_BYTES / members).
OUT_TOTAL_BYTES = 512 << 20


def out_bytes_for(size: int) -> int:
    """Bytes of each member's OUT region in a ``size``-member domain: ``OUT_BYTES``, or an equal
    share of ``OUT_TOTAL_BYTES`` in whole pages where that is less."""
    share = OUT_TOTAL_BYTES // max(1, size) // mmap.PAGESIZE * mmap.PAGESIZE
    return min(OUT_BYTES, max(mmap.PAGESIZE, share))


def segment_bytes(size: int, slot_bytes: int, out_bytes: int) -> int:
    """Bytes of the segment of a ``size``-member domain: control area, each member's IN slots
    and OUT region, then the point-to-point mailbox (``mailbox.py``)."""
    return slots_mod.control_bytes(size) + size * (2 * slot_bytes + out_bytes) + region_bytes(size)


class ShmDomain:
    """This process's handle on the shared-memory domain of one group.

    Attributes:
        rank: this process's group rank.
        size: number of members.
        peers: the other members' group ranks.
        slot_bytes: bytes of one IN slot.
        out_bytes: bytes of this member's OUT region.
        inbox: ``inbox[q][p]``, member ``q``'s IN slot ``p`` (uint8 array).
        outbox: ``outbox[q]``, member ``q``'s OUT region (uint8 array).
        last_broadcast: after a broadcast through half the OUT region, the post count it ended
            at and the half it used, else None (``algorithms/shm_broadcast.staged`` reads it).
        cma: the members read each other's memory directly (``settle`` decided so).
        learning: every member learns which algorithm runs each large call
            (``algorithms/learning.py``; ``settle`` decided so).
        mailbox: this member's ends of the point-to-point rings (``mailbox.Mailbox``), or None
            for a domain of one.
        closed: ``close`` ran (this member left; nothing of the segment may be used).
    """

    def __init__(self, arena: Arena, rank: int, size: int, global_ranks: Sequence[int],
                 group_name: str, describe: Callable[[Sequence[int]], str],
                 slot_bytes: int, out_bytes: int) -> None:
        self.arena = arena
        self.rank = rank
        self.size = size
        self.peers = tuple(q for q in range(size) if q != rank)
        self.slot_bytes = slot_bytes
        self.out_bytes = out_bytes
        self.group_name = group_name
        self.global_ranks = tuple(global_ranks)
        mm = arena.mm
        anchor = ctypes.c_char.from_buffer(mm)
        address = ctypes.addressof(anchor)
        del anchor
        whole = memoryview(mm)
        control = slots_mod.control_bytes(size)
        self.slots = Slots(whole[:control], address, rank, size, arena.pids, global_ranks, group_name,
                           describe)
        whole.release()
        _check_header(self.slots.words, size, arena.nbytes, slot_bytes, out_bytes)
        self._member = member = 2 * slot_bytes + out_bytes
        self._control = control
        raw = np.frombuffer(mm, dtype=np.uint8)
        self._raw = raw
        self.inbox = tuple(tuple(raw[control + q * member + p * slot_bytes:][:slot_bytes] for p in (0, 1))
                           for q in range(size))
        self.outbox = tuple(raw[control + q * member + 2 * slot_bytes:][:out_bytes] for q in range(size))
        self.mailbox = Mailbox(mm, rank, size, control + size * member) if size > 1 else None
        self._round = 0
        self._backup = np.empty(0, dtype=np.uint8)
        self.last_broadcast: tuple[int, int] | None = None
        self.cma = False
        self.learning = False
        self._pids = arena.pids
        self._shared: list[tuple[int, int]] = []  # this member's block of each shared allocation
        self._shared_blocks: list[tuple[np.ndarray, ...]] = []  # every member's block, per allocation
        self._arenas: list[Arena] = []  # the segments of the shared allocations
        self.allocations = 0  # shared allocations asked for so far, made or not (names their keys)
        self._before_close: list[Callable[[], None]] = []
        self.closed = False

    # -- per call --------------------------------------------------------------------------------
    # The call protocol lives in ``Slots``; these pass it on.

    def start(self, ctx: CallInfo, extent: int | None = None) -> None:
        """Begin a call (``Slots.start``: announce it, wait for every peer's announcement, check
        they match)."""
        self.slots.start(ctx, extent)

    def post(self) -> None:
        """Make this member's next post (``Slots.post``)."""
        self.slots.post()

    def wait(self, ranks: Sequence[int], target: int, ctx: CallInfo) -> None:
        """Return once every member of ``ranks`` has made ``target`` posts (``Slots.wait``)."""
        self.slots.wait(ranks, target, ctx)

    def extent(self, rank: int, ctx: CallInfo) -> int:
        """The extent member ``rank`` announced for this call (``Slots.extent``)."""
        return self.slots.extent(rank, ctx)

    def extents(self, ctx: CallInfo) -> list[int]:
        """Every member's announced extent for this call (``Slots.extents``)."""
        return self.slots.extents(ctx)

    @property
    def posts(self) -> int:
        """Posts this member made so far; every member's counter reaches the same values."""
        return self.slots.posts

    @property
    def failure(self) -> BaseException | None:
        """The failure that ended this domain's usefulness (or an abort), else None."""
        return self.slots.failure

    def next_round(self) -> int:
        """Which IN slot (0 or 1) this call's next round uses; advances the round count (every member
        calls it alike: rounds advance nowhere else)."""
        in_slot = self._round & 1
        self._round += 1
        return in_slot

    def stacked(self, in_slot: int, dtype: np.dtype, count: int, offset: int = 0) -> np.ndarray:
        """Every member's IN slot ``in_slot`` from byte ``offset`` on, as one ``(size, count)``
        array of ``dtype``: row ``q`` is member ``q``'s."""
        return self._stacked(in_slot * self.slot_bytes, self.slot_bytes, dtype, count, offset, "IN slot")

    def stacked_out(self, dtype: np.dtype, count: int, offset: int = 0) -> np.ndarray:
        """Every member's OUT region from byte ``offset`` on, as ``stacked`` gives IN slots."""
        return self._stacked(2 * self.slot_bytes, self.out_bytes, dtype, count, offset, "OUT region")

    def _stacked(self, start: int, nbytes: int, dtype: np.dtype, count: int, offset: int,
                 name: str) -> np.ndarray:
        """The ``(size, count)`` view of ``dtype`` at byte ``start + offset`` of every member's
        part of the segment, within ``nbytes`` from ``start``."""
        if count * dtype.itemsize + offset > nbytes:
            raise ValueError(f"{count} x {dtype} from byte {offset} do not fit one {name}")
        return np.ndarray((self.size, count), dtype=dtype, buffer=self._raw,
                          offset=self._control + start + offset, strides=(self._member, dtype.itemsize))

    def place(self, array: np.ndarray) -> tuple[int, int, int]:
        """Where ``array`` (C-contiguous) lies, as peers find it: its address in this process,
        1 + the index of the group's shared allocation that holds it (0: none) and its byte
        offset in this member's block there."""
        address = array.__array_interface__["data"][0]
        for index, (start, stop) in enumerate(self._shared):
            if start <= address and address + array.nbytes <= stop:
                return address, index + 1, address - start
        return address, 0, 0

    @property
    def shared(self) -> bool:
        """Whether the group has shared arrays (``add_shared``)."""
        return bool(self._shared)

    def add_shared(self, arena: Arena, block: int) -> np.ndarray:
        """Take on a shared allocation: ``arena`` holds every member's block of ``block`` bytes,
        in group-rank order; every member adds its allocations in the same order. Returns this
        member's block (uint8); ``close`` lets go of it."""
        raw = np.frombuffer(arena.mm, dtype=np.uint8)
        blocks = tuple(raw[q * block:(q + 1) * block] for q in range(self.size))
        start = blocks[self.rank].__array_interface__["data"][0]
        self._shared.append((start, start + block))
        self._shared_blocks.append(blocks)
        self._arenas.append(arena)
        return blocks[self.rank]

    def shared_view(self, q: int, index: int) -> np.ndarray:
        """Member ``q``'s block of the group's shared allocation ``index``, as bytes."""
        return self._shared_blocks[index][q]

    def backup(self, nbytes: int) -> np.ndarray:
        """Private scratch of ``nbytes`` (kept between calls: it is as large as the largest need)."""
        if self._backup.size < nbytes:
            self._backup = np.empty(nbytes, dtype=np.uint8)
        return self._backup[:nbytes]

    def read(self, q: int, local: int, remote: int, nbytes: int) -> None:
        """Copy ``nbytes`` at address ``remote`` of member ``q``'s memory to address ``local``
        (``cma.read``; the group must have ``cma``).

        Raises:
            PeerLostError: ``q``'s process exited (before or during the copy).
            CommError: not every byte was copied, though ``q`` lives.
        """
        try:
            cma.read(self._pids[q], local, remote, nbytes)
        except cma.CmaError as exc:
            raise self._cma_failure(q, exc, "read") from None

    def write(self, q: int, local: int, remote: int, nbytes: int) -> None:
        """Copy ``nbytes`` at address ``local`` into member ``q``'s memory at ``remote``
        (``cma.write``); raises as ``read``."""
        try:
            cma.write(self._pids[q], local, remote, nbytes)
        except cma.CmaError as exc:
            raise self._cma_failure(q, exc, "write") from None

    def _cma_failure(self, q: int, exc: cma.CmaError, verb: str) -> CommError:
        """The error of a cross-memory copy with member ``q`` that failed with ``exc``: a lost
        peer when its process is gone or going (it may take a moment to become a zombie)."""
        me, them = self.global_ranks[self.rank], self.global_ranks[q]
        settle = time.monotonic() + 1.0
        while exc.errno != errno.ESRCH and not self.slots.exited(q) and time.monotonic() < settle:
            time.sleep(0.01)
        if exc.errno == errno.ESRCH or self.slots.exited(q):
            return PeerLostError(them, f"its process exited while rank {me} was to {verb} its memory")
        return CommError(f"rank {me} could not {verb} rank {them}'s memory in group "
                         f"{self.group_name!r}: {exc}")

    def settle(self, allowed: bool, learn: bool, timeout: float) -> None:
        """Decide with every member whether the group reads peers' memory directly (sets
        ``cma``) and whether it learns which algorithms run (sets ``learning``: only if every
        member's ``learn``); every member calls this once, when the group starts, after every
        member has its domain.

        Each member grants its peers access (``cma.grant``), offers an address to probe and,
        once every member has, reads 8 bytes there of each peer: the segment's magic number, as
        that peer has it mapped. The group uses CMA only if every read on every member succeeded;
        otherwise each member logs one INFO line saying why not. Two posts.

        Args:
            allowed: this member may use CMA (``TENSORCOMM_CMA`` is not ``off``).
            timeout: seconds the two waits may take.

        Raises:
            CommError: a peer was lost or timed out meanwhile (the group cannot work either).
        """
        slots = self.slots
        reason = None if allowed else "TENSORCOMM_CMA=off on this rank"
        if reason is None:
            reason = cma.grant(self._pids)
        slots.note(slots_mod.R_PROBE, 0 if reason else slots.address)
        slots.note(slots_mod.R_LEARNS, int(learn))
        setup = _Setup(f"the start of group {self.group_name!r}", -1, timeout,
                       time.monotonic() + timeout, ())
        slots.post()
        slots.wait(self.peers, slots.posts, setup)
        if reason is None:
            reason = self._probe()
        slots.note(slots_mod.R_VERDICT, 2 if reason else 1)
        slots.post()
        slots.wait(self.peers, slots.posts, setup)
        refused = [self.global_ranks[q] for q in self.peers if slots.noted(q, slots_mod.R_VERDICT) != 1]
        self.learning = learn and all(slots.noted(q, slots_mod.R_LEARNS) for q in self.peers)
        self.cma = reason is None and not refused
        if not self.cma:
            why = reason or f"rank(s) {', '.join(map(str, refused))} could not read their peers"
            log.info("group %r: members do not read each other's memory directly (CMA), so large "
                     "messages go through the shared slots: %s", self.group_name, why)

    def _probe(self) -> str | None:
        """Read each peer's offered address (``settle``); None if all reads succeed, else why."""
        word = np.zeros(1, dtype=np.int64)
        for q in self.peers:
            offered = self.slots.noted(q, slots_mod.R_PROBE)
            if not offered:
                return f"rank {self.global_ranks[q]} does not allow it"
            try:
                cma.read(self._pids[q], word.ctypes.data, offered, word.nbytes)
            except cma.CmaError as exc:
                return (f"process_vm_readv of rank {self.global_ranks[q]} (pid {self._pids[q]}) "
                        f"failed: {cma.refusal(exc.errno or 0)}")
            if int(word[0]) != slots_mod.MAGIC:
                return f"a probing read of rank {self.global_ranks[q]} returned the wrong bytes"
        return None

    def fail(self, error: BaseException, ctx: Any) -> None:
        """A call failed on this member: refuse later calls and tell the peers."""
        try:
            self.slots.fail(error, ctx.seq)
        except ValueError:  # the control area is already released (destroyed under the call)
            pass

    # -- lifecycle -------------------------------------------------------------------------------

    def abort(self, error: BaseException, tell_peers: bool = True) -> None:
        """Fail the pending and every later call of this member with ``error``.

        Callable from any thread: a waiting call notices within one yield or futex wake-up. With
        ``tell_peers`` the peers' pending and later calls fail too (``GroupAbortedError`` naming
        this rank); without it they learn only when this member leaves (``close``).
        """
        if not self.closed:
            self.slots.abort(error, tell_peers)

    def before_close(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` when the domain closes, before anything is let go (it must not raise):
        what must finish while the peers can still read this member's memory."""
        self._before_close.append(hook)

    def close(self) -> None:
        """Leave the domain: peers waiting on this member get PeerLostError; unmap. Idempotent."""
        if self.closed:
            return
        for hook in self._before_close:
            hook()
        self._before_close = []
        self.closed = True
        self.slots.leave()
        self.inbox = self.outbox = ()
        if self.mailbox is not None:
            self.mailbox.release()
            self.mailbox = None
        self._raw = self._backup = None  # type: ignore[assignment]
        self._shared, self._shared_blocks = [], []
        for arena in self._arenas:  # an array the caller still holds keeps its segment mapped
            arena.close()
        self._arenas = []
        self.slots.close()
        self.arena.close()


@dataclass
class _Setup:
    """The waits of ``settle``, as a call (``slots.CallInfo``) describes them in errors."""

    name: str
    seq: int
    timeout: float
    deadline: float
    signature: tuple[int, ...]
    design: int = 0


def _write_header(mm: mmap.mmap, size: int, nbytes: int, slot_bytes: int, out_bytes: int) -> None:
    words = memoryview(mm).cast("q")
    try:
        words[slots_mod.H_VERSION] = slots_mod.VERSION
        words[slots_mod.H_SIZE] = size
        words[slots_mod.H_NBYTES] = nbytes
        words[slots_mod.H_SLOT] = slot_bytes
        words[slots_mod.H_OUT] = out_bytes
        words[slots_mod.H_MAGIC] = slots_mod.MAGIC
    finally:
        words.release()


def _check_header(words: memoryview, size: int, nbytes: int, slot_bytes: int, out_bytes: int) -> None:
    found = (words[slots_mod.H_MAGIC], words[slots_mod.H_VERSION], words[slots_mod.H_SIZE],
             words[slots_mod.H_NBYTES], words[slots_mod.H_SLOT], words[slots_mod.H_OUT])
    expected = (slots_mod.MAGIC, slots_mod.VERSION, size, nbytes, slot_bytes, out_bytes)
    if found != expected:
        raise ShmUnavailable(f"the shared segment's header {found} does not match this member's "
                             f"layout {expected} (different tensorcomm versions?)")


def open_domain(rank: int, global_ranks: Sequence[int], group_name: str, secret: bytes,
                publish: Callable[[str], None], lookup: Callable[[float], str | None],
                failed: Callable[[], str | None], timeout: float,
                describe: Callable[[Sequence[int]], str],
                slot_bytes: int = SLOT_BYTES, out_bytes: int | None = None) -> ShmDomain:
    """Set up the shared-memory domain of a group; every member calls this at the same time.

    Args:
        rank: this process's group rank.
        global_ranks: global rank of every member, in group-rank order.
        group_name: for messages.
        secret: the job's HMAC key.
        publish, lookup, failed: the leader's address exchange (see ``arena.establish``).
        timeout: seconds the set-up may take.
        describe: turns signature codes into text, for mismatch messages.
        slot_bytes, out_bytes: the layout; must be equal on every member (``out_bytes``
            defaults to ``out_bytes_for`` the group's size).

    Raises:
        ShmUnavailable: shared memory cannot serve this group (the caller falls back to TCP).
    """
    if not slots_mod.SUPPORTED:
        raise ShmUnavailable("the shared-memory path needs x86-64 store ordering; this CPU is not "
                             "x86-64, so ranks talk over TCP")
    size = len(global_ranks)
    if out_bytes is None:
        out_bytes = out_bytes_for(size)
    if slot_bytes % 64 or out_bytes % 64 or slot_bytes < 8 * (size + 8):
        raise ValueError("slot_bytes and out_bytes must be multiples of 64 bytes, and a slot must "
                         "hold a header of one 8-byte offset per member")
    nbytes = segment_bytes(size, slot_bytes, out_bytes)
    seg = arena_mod.establish(rank, size, nbytes, secret, publish, lookup, failed, timeout,
                              lambda mm: _write_header(mm, size, nbytes, slot_bytes, out_bytes))
    try:
        return ShmDomain(seg, rank, size, global_ranks, group_name, describe, slot_bytes, out_bytes)
    except BaseException:
        seg.close()
        raise
