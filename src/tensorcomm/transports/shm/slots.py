"""The control area of a shared segment: one counter per rank, the waits on it, and fault records.

Owns the layout of the segment's first pages and every cross-process synchronisation of the shared
-memory path. Imports ``errors``, ``transports.liveness`` and ``transports.threads`` only (plus the
standard library); knows nothing of collectives
beyond the five integers of a call signature.

Protocol. Every rank owns one monotonically increasing *counter*, on its own cache line, that only
it writes. A collective is a fixed sequence of *posts* (counter += 1) and *waits* ("peer's counter
>= target"); every rank makes the same number of posts per call, so nothing is ever reset and a
wait is one comparison. The first post of a call (``start``) also *announces* the call: its step
(sequence number), a 64-bit *token* (the hash of its signature, the five integers collective,
dtype, count, op, root, mixed with the step and with the code of the algorithm that runs the call,
so that members that chose different algorithms for it fail it too) and an *extent* (how many bytes this rank
contributes), written before the counter, on its cache line; the signature itself goes on the
next line (rewritten only when it changes), for messages. ``start`` then waits for every peer's
first post and compares their tokens with this rank's: a difference raises
``CollectiveMismatchError`` naming both sides and signatures, on every rank, since every rank
checks every peer. (Two different calls with one token would go unnoticed; Python's tuple hash
makes that practically impossible for calls that differ by mistake.) Per call and peer that is
two reads of a word, and no numpy call.
Announcements alternate between two entries by step parity: a peer that already started its next
call (it may: nothing makes it wait for this rank to finish reading) leaves this call's entry
intact.

Memory ordering. Data is written, then the counter; readers read the counter, then the data. On
x86-64 stores are not reordered with other stores nor loads with other loads (TSO), so that is
enough; on other CPUs it is not, and ``SUPPORTED`` is False there (the caller falls back to TCP)
because Python offers no fence to put between the two.

Waiting. A wait reads the counter ``SPIN_READS`` times, then calls ``sched_yield`` in a loop (cheap
when ranks have cores of their own, and it hands the core over when they share one; pure spinning
would cost a whole time slice; before the first, a member with a core of its own moves away from a
peer it finds on its core: ``apart.py``), and after ``YIELD_SECONDS`` sleeps on a futex on the
counter's low 32 bits, waking at least every ``SLEEP_SECONDS`` (on an engine's worker thread it
skips the yielding and sleeps at once: ``transports/threads.py`` says why). A poster wakes futex
sleepers only when one has raised the flag on its line, so posts stay syscall-free. While yielding
or sleeping, a wait watches for: the call's deadline (``CommTimeoutError`` naming the ranks whose
counters did not arrive), a fault recorded by any rank (mismatch, abort, lost peer: raised here
too), a peer that left the group (``destroy``), and, every ``LIVENESS_SECONDS``, whether the
processes of the peers it waits for still exist (``transports/liveness.py``, which holds no
descriptor per peer): ``PeerLostError`` names a dead one.

Faults. A rank that fails a call writes a record (kind, step, peer, text) on its own line and sets
the segment's fault word; the other ranks raise an error of the same kind from that record at
their next wait, so a failure on one rank ends the call everywhere within microseconds.
"""

from __future__ import annotations

import logging
import os
import platform
import struct
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Protocol

from ...errors import CollectiveMismatchError, CommError, CommTimeoutError, GroupAbortedError, PeerLostError
from ..liveness import ProcessWatch
from ..threads import on_worker
from . import futex
from .apart import Apart

log = logging.getLogger("tensorcomm.shm")

# Only x86-64 keeps stores in order without a fence (see the module docstring).
SUPPORTED = platform.machine().lower() in ("x86_64", "amd64")

SPIN_READS = 10
YIELD_SECONDS = 0.002  # then sleep on the futex instead of yielding
SLEEP_SECONDS = 0.02  # longest futex sleep: bounds a lost wake-up and the checks below
LIVENESS_SECONDS = 0.1  # how often a waiter checks that its peers' processes are alive

MAGIC = 0x4D48534D43544E45  # b"ENTCMSHM" read little-endian
VERSION = 3  # 2: announcements carry a token (hash mixed with the step); 3: and the algorithm
PAGE = 4096
HEADER_BYTES = 512
LINE_BYTES = 1024  # per rank
TEXT_BYTES = 512  # fault text per rank

# Header words.
H_MAGIC, H_VERSION, H_SIZE, H_NBYTES, H_SLOT, H_OUT = 0, 1, 2, 3, 4, 5
H_FAULT = 8  # nonzero once any rank recorded a fault; on a cache line of its own
# Words of a rank's line, relative to its start. Line 0: the counter, then two announcements (by
# step parity) of 3 words: step, token, extent. Lines 1-2: the two signatures (5 words).
R_COUNTER = 0
R_ENTRY = (1, 4)
R_SIGNATURE = (8, 13)
# Line 3: written rarely, but for the core this rank last waited on, plus one (``apart.py``).
R_SLEEPERS, R_STATE, R_CPU = 24, 25, 26
# Line 4: this rank's fault record; its text from byte 512.
R_FAULT_KIND, R_FAULT_SEQ, R_FAULT_PEER = 32, 33, 34
# Line 5: written once, when the group starts (``ShmDomain.settle``): the address this rank
# offers for a probing cross-memory read (0: it will not be read), then its verdict on its peers,
# then whether it learns which algorithms run (``algorithms/learning.py``).
R_PROBE, R_VERDICT, R_LEARNS = 40, 41, 42
# Lines 6-7: this rank's decision log (``publish``): how many records it appended, then a ring of
# ``LOG_RECORDS`` records of ``LOG_WORDS`` words.
R_LOG_HEAD, R_LOG = 48, 49
LOG_RECORDS, LOG_WORDS = 5, 3
R_TEXT_BYTE = 512

STATE_ACTIVE, STATE_LEFT = 0, 1
FAULT_MISMATCH, FAULT_ABORTED, FAULT_PEER_LOST, FAULT_TIMEOUT, FAULT_FAILED = 1, 2, 3, 4, 5
_KIND_OF = {CollectiveMismatchError: FAULT_MISMATCH, GroupAbortedError: FAULT_ABORTED,
            PeerLostError: FAULT_PEER_LOST, CommTimeoutError: FAULT_TIMEOUT}

SIGNATURE = struct.Struct("5q")
# Per step parity, (word, extent) of every peer: what a bound call expects announced.
ExtentChecks = tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]


def control_bytes(size: int) -> int:
    """Bytes of the control area for ``size`` ranks (page-aligned)."""
    raw = HEADER_BYTES + size * LINE_BYTES
    return (raw + PAGE - 1) // PAGE * PAGE


# --- the control area ------------------------------------------------------------------------


class Slots:
    """This rank's handle on the control area of a group's segment, and its per-call protocol.

    Args:
        buffer: the control area (writable), ``control_bytes(size)`` bytes at the segment's start.
        address: the segment's base address (for futexes).
        rank: this process's group rank.
        size: number of members.
        pids: every member's pid, in group-rank order.
        global_ranks: every member's global rank, for messages.
        group_name: for messages.
        describe: turns five signature codes into text such as ``all_reduce(float32[4], op=sum)``.

    Attributes:
        posts: posts this rank made so far; every member's counter goes through the same values.
        failure: the first failure of a call on this rank, or an abort; later calls are refused.
    """

    def __init__(self, buffer: memoryview, address: int, rank: int, size: int, pids: Sequence[int],
                 global_ranks: Sequence[int], group_name: str,
                 describe: Callable[[Sequence[int]], str]) -> None:
        self.describe = describe
        self.bytes = buffer
        self.words = buffer.cast("q")
        self.address = address
        self.rank = rank
        self.size = size
        self.global_ranks = tuple(global_ranks)
        self.group_name = group_name
        self.peers = tuple(q for q in range(size) if q != rank)
        base = [(HEADER_BYTES + q * LINE_BYTES) // 8 for q in range(size)]
        self._base = base
        self.counter_word = tuple(b + R_COUNTER for b in base)
        self._entry = tuple(tuple(b + e for e in R_ENTRY) for b in base)  # word of each entry
        self._peer_counters = tuple(self.counter_word[q] for q in self.peers)
        self._peer_tokens = tuple(tuple(self._entry[q][p] + 1 for q in self.peers) for p in (0, 1))
        self._my_counter = base[rank] + R_COUNTER
        self._my_sleepers = base[rank] + R_SLEEPERS
        self._my_entry = self._entry[rank]
        self._my_signature_byte = tuple(8 * (base[rank] + s) for s in R_SIGNATURE)
        self._written: list[tuple[object, int]] = [(None, 0), (None, 0)]  # per step parity
        self._liveness = ProcessWatch({q: pids[q] for q in self.peers})
        self.apart = Apart(self.words, tuple(b + R_CPU for b in base), rank)
        self.posts = 0
        self.failure: BaseException | None = None  # set by fail() or abort(), from any thread

    # -- the per-call protocol -----------------------------------------------------------------

    def start(self, ctx: CallInfo, extent: int | None = None, expected: ExtentChecks | None = None) -> bool:
        """Begin a call, as every algorithm does first: announce it with this rank's first post
        (``announce``), wait for every peer's first post of it and check that they announced the
        same call (``meet``). Returns whether a peer announced an extent other than
        ``expected`` says (``extents_differ``; False without ``expected``).

        Raises:
            CollectiveMismatchError: a peer announced a different call; names both.
            CommError: a call failed earlier here or on a peer (the counters no longer match):
                an error of the same kind as that failure; or as ``wait``.
        """
        # ``announce`` then ``meet``, inline: every call starts here, two Python calls fewer
        words = self.words
        if self.failure is not None or words[H_FAULT]:
            raise self.refusal()
        seq, signature = ctx.seq, ctx.signature
        step_parity = seq & 1
        written = self._written[step_parity]
        digest = written[1] if signature is written[0] else self._announce_signature(step_parity, signature)
        token = digest ^ seq ^ ctx.design
        entry = self._my_entry[step_parity]
        words[entry] = seq
        words[entry + 1] = token
        if extent is not None:
            words[entry + 2] = extent
        self.posts = target = self.posts + 1
        words[self._my_counter] = target
        if words[self._my_sleepers]:
            self._wake_sleepers()
        for word in self._peer_counters:
            if words[word] < target:
                self._block(self.peers, target, ctx)
                break
        for word in self._peer_tokens[step_parity]:
            if words[word] != token:
                raise self._mismatch(word, ctx)
        if expected is not None:  # ``extents_differ``, inline: a bound round's check, every run
            for word, want in expected[step_parity]:
                if words[word] != want:
                    return True
        return False

    def announce(self, ctx: CallInfo, extent: int | None = None) -> None:
        """Announce a call with this rank's first post of it, without waiting for the peers'.

        The announcement is the call's step, a token (its signature's hash mixed with the step
        and the algorithm's code) and, when given, ``extent``: the bytes this rank contributes,
        for algorithms whose peers read it (``extents``); None leaves it unwritten. ``meet``
        completes the start.

        Raises:
            CommError: a call failed earlier here or on a peer: an error of the same kind.
        """
        words = self.words
        if self.failure is not None or words[H_FAULT]:
            raise self.refusal()
        seq, signature = ctx.seq, ctx.signature
        step_parity = seq & 1
        written = self._written[step_parity]  # (signature, its hash) last announced with this step parity
        digest = written[1] if signature is written[0] else self._announce_signature(step_parity, signature)
        entry = self._my_entry[step_parity]
        words[entry] = seq
        words[entry + 1] = digest ^ seq ^ ctx.design
        if extent is not None:
            words[entry + 2] = extent
        self.posts = target = self.posts + 1
        words[self._my_counter] = target
        if words[self._my_sleepers]:
            self._wake_sleepers()

    def arrived(self) -> bool:
        """Whether every peer has made as many posts as this rank (``meet`` would not wait)."""
        words, target = self.words, self.posts
        # a loop, not all() over a generator: 140 ns less, in every persistent start()
        for word in self._peer_counters:  # noqa: SIM110
            if words[word] < target:
                return False
        return True

    def meet(self, ctx: CallInfo) -> None:
        """Wait for every peer's first post of the call this rank announced last (``announce``)
        and check that they announced the same call.

        Raises:
            CollectiveMismatchError: a peer announced a different call; names both.
            CommError: as ``wait``.
        """
        words, target = self.words, self.posts
        for word in self._peer_counters:
            if words[word] < target:
                self._block(self.peers, target, ctx)
                break
        step_parity = ctx.seq & 1
        token = words[self._my_entry[step_parity] + 1]
        for word in self._peer_tokens[step_parity]:
            if words[word] != token:
                raise self._mismatch(word, ctx)

    def _announce_signature(self, step_parity: int, signature: Sequence[int]) -> int:
        """Write ``signature`` beside the announcements of this step parity; return its hash."""
        SIGNATURE.pack_into(self.bytes, self._my_signature_byte[step_parity], *signature)
        digest = hash(tuple(signature))
        self._written[step_parity] = (signature, digest)
        return digest

    def post(self) -> None:
        """Make this rank's next post (everything written before it is visible first)."""
        words = self.words
        self.posts = posts = self.posts + 1
        words[self._my_counter] = posts
        if words[self._my_sleepers]:
            self._wake_sleepers()

    def wait(self, ranks: Sequence[int], target: int, ctx: CallInfo) -> None:
        """Return once every rank of ``ranks`` has made ``target`` posts.

        Raises:
            CommTimeoutError: ``ctx.deadline`` passed; names the ranks that did not arrive.
            PeerLostError: a peer's process exited or it left the group.
            CommError: a fault some rank recorded (mismatch, abort, ...), re-raised here.
        """
        words, counters = self.words, self.counter_word
        for q in ranks:
            if words[counters[q]] < target:
                self._block(ranks, target, ctx)
                return

    def extent(self, rank: int, ctx: CallInfo) -> int:
        """The extent ``rank`` announced for this call (valid after ``start``)."""
        return self.words[self._entry[rank][ctx.seq & 1] + 2]

    def extents(self, ctx: CallInfo) -> list[int]:
        """Every member's announced extent for this call, in group-rank order."""
        words, step_parity = self.words, ctx.seq & 1
        return [words[entry[step_parity] + 2] for entry in self._entry]

    def extent_checks(self, expected: Sequence[int]) -> ExtentChecks:
        """What ``start`` and ``extents_differ`` compare to find a peer that announced an
        extent other than ``expected[peer]`` (one per member), made once for a bound call."""
        if len(expected) != self.size:
            raise ValueError(f"expected: one extent per member ({self.size}), got {len(expected)}")
        checks = [tuple((self._entry[q][p] + 2, expected[q]) for q in self.peers) for p in (0, 1)]
        return checks[0], checks[1]

    def extents_differ(self, ctx: CallInfo, expected: ExtentChecks) -> bool:
        """Whether any peer's announced extent for this call is not what ``expected`` (made
        by ``extent_checks``) says."""
        words = self.words
        for word, extent in expected[ctx.seq & 1]:  # noqa: SIM110 - any(): a generator, a frame on every run
            if words[word] != extent:
                return True
        return False

    def counter(self, rank: int) -> int:
        return self.words[self.counter_word[rank]]

    def note(self, word: int, value: int) -> None:
        """Write ``value`` at word ``word`` (``R_PROBE``, ``R_VERDICT``) of this rank's line."""
        self.words[self._base[self.rank] + word] = value

    def noted(self, rank: int, word: int) -> int:
        """What ``rank`` wrote at word ``word`` of its line (``note``)."""
        return self.words[self._base[rank] + word]

    def publish(self, record: Sequence[int]) -> None:
        """Append ``record`` (``LOG_WORDS`` integers) to this rank's decision log: its words
        first, then the log's head, so a peer that sees the head sees the record."""
        words, base = self.words, self._base[self.rank]
        head = words[base + R_LOG_HEAD]
        start = base + R_LOG + (head % LOG_RECORDS) * LOG_WORDS
        words[start:start + LOG_WORDS] = array("q", record)
        words[base + R_LOG_HEAD] = head + 1

    def published(self, rank: int, seen: int) -> list[tuple[int, ...]]:
        """The records ``rank`` appended to its log after the first ``seen`` (``publish``).

        Raises:
            RuntimeError: more than ``LOG_RECORDS`` arrived since, so some were overwritten
                unread (the protocol that calls this must rule that out).
        """
        words, base = self.words, self._base[rank]
        head = words[base + R_LOG_HEAD]
        if head - seen > LOG_RECORDS:
            raise RuntimeError(f"group {self.group_name!r}: rank {self.global_ranks[rank]}'s decision "
                               f"log ran {head - seen} records ahead of this rank (at most {LOG_RECORDS})")
        out = []
        for index in range(seen, head):
            start = base + R_LOG + (index % LOG_RECORDS) * LOG_WORDS
            out.append(tuple(words[start:start + LOG_WORDS]))
        return out

    def log_head_word(self, rank: int) -> int:
        """The word of ``words`` that counts the records ``rank`` appended to its decision log
        (read on every learned call: a word compared, no call)."""
        return self._base[rank] + R_LOG_HEAD

    def exited(self, rank: int) -> bool:
        """Whether the process of group rank ``rank`` has exited."""
        return bool(self._liveness.dead((rank,)))

    def departed(self, rank: int) -> bool:
        """Whether group rank ``rank`` left the group (``leave``) or its process exited."""
        return self.words[self._base[rank] + R_STATE] == STATE_LEFT or self.exited(rank)

    def _wake_sleepers(self) -> None:
        self.words[self._my_sleepers] = 0
        futex.wake(self.address + self._my_counter * 8)

    def _mismatch(self, token_word: int, ctx: CallInfo) -> CollectiveMismatchError:
        q = next(q for q in self.peers if token_word - 1 in self._entry[q])
        seq, step_parity = ctx.seq, ctx.seq & 1
        theirs_seq = self.words[token_word - 1]
        theirs = SIGNATURE.unpack_from(self.bytes, 8 * (self._base[q] + R_SIGNATURE[step_parity]))
        me, them = self.global_ranks[self.rank], self.global_ranks[q]
        if theirs_seq != seq:
            return CollectiveMismatchError(
                f"rank {them} called {self.describe(theirs)} at step {theirs_seq} while rank {me} "
                f"called {self.describe(ctx.signature)} at step {seq} of group {self.group_name!r}")
        if tuple(theirs) == tuple(ctx.signature):  # one call, run by different algorithms
            return CollectiveMismatchError(
                f"ranks {them} and {me} called {self.describe(theirs)} at step {seq} of group "
                f"{self.group_name!r} but chose different algorithms to run it: give every rank the "
                "same TENSORCOMM_ALGORITHMS, TENSORCOMM_KEEP_GOING and tuning file")
        return CollectiveMismatchError(
            f"rank {them} called {self.describe(theirs)} while rank {me} called "
            f"{self.describe(ctx.signature)} at step {seq} of group {self.group_name!r}")

    # -- blocking --------------------------------------------------------------------------------

    def _block(self, ranks: Sequence[int], target: int, ctx: CallInfo) -> None:
        """Wait until every rank of ``ranks`` has made ``target`` posts (see the module docstring)."""
        words, counters = self.words, self.counter_word
        for q in ranks:  # spin a little on each peer still behind, in turn
            word = counters[q]
            for _ in range(SPIN_READS):
                if words[word] >= target:
                    break
            else:
                break  # this one is slow: wait in earnest
        else:
            return
        now = time.monotonic()
        deadline = min(ctx.deadline, now + ctx.timeout)  # a bound round's starts with its wait
        check_alive = now + LIVENESS_SECONDS
        sleep_from = now if on_worker() else now + YIELD_SECONDS  # transports/threads.py says why
        apart = self.apart.enabled
        while True:
            behind = [q for q in ranks if words[counters[q]] < target]
            if not behind:
                return
            if words[H_FAULT] or self.failure is not None:
                raise self.fault()
            for q in behind:  # the counter is read again after the state: a peer posts, then leaves
                if words[self._base[q] + R_STATE] == STATE_LEFT and words[counters[q]] < target:
                    last = max(words[self._entry[q][0]], words[self._entry[q][1]])
                    raise PeerLostError(self.global_ranks[q], "it left the group (destroy() was called)",
                                        left=True, last_step=last)
            now = time.monotonic()
            if now >= deadline:
                raise self._timeout(ranks, target, ctx)
            if now >= check_alive:
                self._check_alive(ranks, target)
                check_alive = now + LIVENESS_SECONDS
            if now < sleep_from:
                if apart:  # first: a peer waiting on this core would get it only by the yield
                    self.apart.check(behind[0], now)
                    apart = False
                os.sched_yield()
            else:
                self._sleep(behind[0], target, min(SLEEP_SECONDS, check_alive - now, deadline - now))

    def _sleep(self, q: int, target: int, seconds: float) -> None:
        words = self.words
        word = self.counter_word[q]
        words[self._base[q] + R_SLEEPERS] = 1
        current = words[word]
        if current < target and seconds > 0:
            futex.wait(self.address + word * 8, current & 0xFFFFFFFF, seconds)

    def _check_alive(self, ranks: Sequence[int], target: int) -> None:
        words, counter = self.words, self.counter_word
        for q in self._liveness.dead([q for q in ranks if words[counter[q]] < target]):
            if words[counter[q]] < target:
                raise PeerLostError(self.global_ranks[q], "its process exited")

    def _timeout(self, ranks: Sequence[int], target: int, ctx: CallInfo) -> CommTimeoutError:
        missing = [self.global_ranks[q] for q in ranks if self.words[self.counter_word[q]] < target]
        who = f"rank {missing[0]} did" if len(missing) == 1 else \
            f"ranks {', '.join(map(str, missing))} did"
        return CommTimeoutError(f"{ctx.name} (step {ctx.seq}) timed out after {ctx.timeout:g} s on "
                                f"rank {self.global_ranks[self.rank]}: {who} not arrive")

    # -- faults --------------------------------------------------------------------------------

    def fail(self, error: BaseException, seq: int) -> None:
        """A call failed on this rank with ``error``: refuse later calls and tell every peer.

        The peers' waits raise an error of the same kind (``fault``) within microseconds.
        """
        if self.failure is None:
            self.failure = error
        self._record(error, seq)

    def abort(self, error: BaseException, tell_peers: bool) -> None:
        """Fail this rank's pending and later calls with ``error`` (from any thread)."""
        if self.failure is None:
            self.failure = error
        if tell_peers:
            self._record(GroupAbortedError(f"rank {self.global_ranks[self.rank]} aborted group "
                                           f"{self.group_name!r}: {error}"), -1)
        else:
            self.wake_all()

    def _record(self, error: BaseException, seq: int) -> None:
        base = self._base[self.rank]
        words = self.words
        if words[base + R_FAULT_KIND]:
            return
        kind = next((k for cls, k in _KIND_OF.items() if isinstance(error, cls)), FAULT_FAILED)
        text = str(error) if isinstance(error, CommError) else \
            f"rank {self.global_ranks[self.rank]} failed during step {seq}: {type(error).__name__}: {error}"
        raw = text.encode("utf-8", "replace")[:TEXT_BYTES - 1]
        start = base * 8 + R_TEXT_BYTE
        self.bytes[start:start + TEXT_BYTES] = raw.ljust(TEXT_BYTES, b"\0")
        words[base + R_FAULT_SEQ] = seq
        words[base + R_FAULT_PEER] = getattr(error, "rank", -1)
        words[base + R_FAULT_KIND] = kind
        words[H_FAULT] = self.rank + 1
        self.wake_all()

    def fault(self) -> BaseException:
        """The error a waiting call raises once a fault is known (here or on any rank)."""
        if self.failure is not None:
            return _copy(self.failure)
        words = self.words
        for q in range(self.size):
            base = self._base[q]
            kind = words[base + R_FAULT_KIND]
            if not kind:
                continue
            start = base * 8 + R_TEXT_BYTE
            text = bytes(self.bytes[start:start + TEXT_BYTES]).rstrip(b"\0").decode("utf-8", "replace")
            if kind == FAULT_MISMATCH:
                return CollectiveMismatchError(text)
            if kind == FAULT_PEER_LOST:
                return PeerLostError(words[base + R_FAULT_PEER], f"reported by rank {self.global_ranks[q]}")
            if kind == FAULT_TIMEOUT:
                return CommTimeoutError(text)
            if kind == FAULT_ABORTED:
                return GroupAbortedError(text)
            return GroupAbortedError(f"group {self.group_name!r} failed on rank "
                                     f"{self.global_ranks[q]}: {text}")
        return GroupAbortedError(f"group {self.group_name!r} failed")

    def refusal(self) -> BaseException:
        """The error a new call gets once a call of the group failed (here or on a peer)."""
        cause = self.fault()
        if isinstance(cause, PeerLostError):
            return cause
        kind = type(cause) if isinstance(cause, CommError) else GroupAbortedError
        return kind(f"group {self.group_name!r} cannot be used after an earlier failure: {cause}")

    def wake_all(self) -> None:
        """Wake every futex sleeper of the segment (they re-check faults and counters)."""
        for word in self.counter_word:
            futex.wake(self.address + word * 8)

    def leave(self) -> None:
        """Mark this rank as gone: peers still waiting on it get ``PeerLostError``."""
        self.words[self._base[self.rank] + R_STATE] = STATE_LEFT
        futex.wake(self.address + self._my_counter * 8)

    def close(self) -> None:
        self.words.release()
        self.bytes.release()


class CallInfo(Protocol):
    """What a wait needs to know about the call it serves (an ``algorithms.base.Ctx`` is one)."""

    name: str
    seq: int
    timeout: float
    deadline: float
    design: int  # the code of the algorithm that runs the call (``algorithms.base.design``)

    @property
    def signature(self) -> Sequence[int]:
        """The call's ``tensorcomm.signature.Signature`` (peers compare it with theirs)."""


def _copy(error: BaseException) -> BaseException:
    """A fresh exception equal to ``error`` (raising one object on several threads tangles tracebacks)."""
    if isinstance(error, PeerLostError):
        copy = PeerLostError.__new__(PeerLostError)
        copy.args, copy.rank = error.args, error.rank
        return copy
    try:
        return type(error)(*error.args)
    except TypeError:
        return error
