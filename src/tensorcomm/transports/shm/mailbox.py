"""Point-to-point records in a shared-memory domain: one ring per ordered pair of members.

A record is a run of bytes one member hands another, in order, with no system call on either
side: the sender copies it into the ring of the pair (sender, receiver) and moves that ring's
*written* counter on; the receiver copies it out and moves the ring's *read* counter on. Only the
sender writes a ring's data and *written*, only the receiver its *read* (single producer, single
consumer), so no lock is needed; data is written before the counter that publishes it and read
after the counter that says it is there, which x86-64's store order makes enough (the domain is
only set up there: ``slots.SUPPORTED``). A member's own ring (sender == receiver) carries its
messages to itself.

A receiver with nothing to read may sleep (``sleep``): it raises the *sleeping* flag on its
*doorbell* line and sleeps on a futex on the line's bell word; a sender that finds the flag
raised after a push rings the bell (changes the word and wakes its sleepers). A wake-up lost to
the two sides' store buffers (Python has no fence) costs at most the sleep's bound.

Layout: one doorbell line per member (flag, bell), then per pair (sender ``s``, receiver ``r``)
at ``(s * size + r) * stride`` past them: the *written* counter on one cache line, *read* on the
next, then ``capacity`` bytes of ring. Each record is an
8-byte length, then the bytes, padded to 8; a record may wrap around the end of the ring. The
capacity shrinks as members grow (``ring_bytes``), so the region stays about 1 MiB per member.

Owns nothing but this layout; imports numpy and ``futex.py``. What the records mean is the caller's
(``MPI/p2p.py``).
"""

from __future__ import annotations

import mmap

import numpy as np

from . import futex

HEADER = 128  # the two counters, on cache lines of their own
_LINE = 64  # a member's doorbell: sleeping flag, bell
_WORD = 8
_JOINED = 2048  # records up to this long are pushed as one copy of head + body
MIN_RING, MAX_RING = 8 << 10, 256 << 10
_PER_MEMBER = 1 << 20  # what one member's incoming rings take at most, once there are many


def ring_bytes(size: int) -> int:
    """Capacity of one ring in a domain of ``size`` members (a power of two)."""
    share = _PER_MEMBER // max(size, 1)
    capacity = MIN_RING
    while capacity * 2 <= min(share, MAX_RING):
        capacity *= 2
    return capacity


def region_bytes(size: int) -> int:
    """Bytes of the mailbox region of a ``size``-member domain (0 for one member)."""
    return 0 if size < 2 else size * _LINE + size * size * (HEADER + ring_bytes(size))


class MailboxCorrupt(RuntimeError):
    """A ring holds what no member of this layout wrote."""


class Mailbox:
    """This member's ends of the rings of one domain, whose region lies in ``segment`` from
    ``offset`` (a multiple of 8).

    Attributes:
        capacity: bytes of one ring; the longest record is ``capacity // 2``.
    """

    def __init__(self, segment: mmap.mmap, rank: int, size: int, offset: int = 0) -> None:
        capacity = self.capacity = ring_bytes(size)
        stride = HEADER + capacity
        if offset % _WORD or len(segment) - offset < region_bytes(size):
            raise ValueError(f"a mailbox of {size} members needs {region_bytes(size)} bytes at a "
                             f"multiple of {_WORD}, the segment has {len(segment) - offset} at {offset}")
        self.longest = capacity // 2
        # Records are copied by slicing the mmap itself (its slices are bytes: one step, where a
        # memoryview's take two); the counters are words of a view on it.
        # Positions (bytes and words) count from the start of the segment.
        self._bytes = segment
        self._words = memoryview(segment)[:len(segment) // _WORD * _WORD].cast("q")
        self._address = np.frombuffer(segment, np.uint8).ctypes.data
        self._flag = [(offset + q * _LINE) // _WORD for q in range(size)]  # each sleeping flag (word)
        self._bell = self._flag[rank] + 1  # this member's bell (word)
        # Where each ring this member writes (to each receiver) and reads (from each sender) starts.
        bells = offset + size * _LINE
        self._out = [bells + (rank * size + q) * stride for q in range(size)]
        self._in = [bells + (q * size + rank) * stride for q in range(size)]
        # The same as word indices (the counters) and byte offsets (the data), made once: each
        # bytecode counts on a push or pull of a short record.
        self._written_word = [base // _WORD for base in self._in]  # each incoming ring's counter
        self._read_word = [word + _LINE // _WORD for word in self._written_word]
        self._in_data = [base + HEADER for base in self._in]
        self._out_word = [base // _WORD for base in self._out]
        self._out_data = [base + HEADER for base in self._out]
        # Sender's side: where each outgoing ring is written to, and the last read count seen.
        self._written = [0] * size
        self._seen_read = [0] * size
        # Receiver's side: how far each incoming ring has been read.
        self._read = [0] * size

    def push(self, receiver: int, head: bytes, body: memoryview | bytes = b"") -> bool:
        """Append the record ``head + body`` to the ring to ``receiver``; False (nothing written)
        when the ring has no room for it now.

        Raises:
            ValueError: the record is longer than ``longest``.
        """
        nbytes = len(head) + len(body)
        if nbytes > self.longest:
            raise ValueError(f"a record of {nbytes} bytes is longer than a ring takes "
                             f"({self.longest})")
        written = self._written[receiver]
        end = written + ((nbytes + 15) & -8)  # its length word and it, padded to 8 bytes (_WORD)
        capacity = self.capacity
        words = self._words
        if end - self._seen_read[receiver] > capacity:
            self._seen_read[receiver] = words[self._out_word[receiver] + _LINE // _WORD]
            if end - self._seen_read[receiver] > capacity:
                return False
        data = self._out_data[receiver]
        at = data + written % capacity  # the length word's place
        words[at // 8] = nbytes
        at += 8
        if at + nbytes > data + capacity:  # the record wraps around the end of the ring
            at = (at - data) % capacity
            self._copy_in(data, at, head)
            self._copy_in(data, (at + len(head)) % capacity, body)
        elif nbytes <= _JOINED:  # one copy into the ring of the two joined: fewer steps
            self._bytes[at:at + nbytes] = head + body
        else:
            middle = at + len(head)
            self._bytes[at:middle] = head
            self._bytes[middle:at + nbytes] = body
        self._written[receiver] = end
        words[self._out_word[receiver]] = end  # publish: after the data (x86-64 store order)
        flag = self._flag[receiver]
        if words[flag]:  # the receiver sleeps: ring its bell
            words[flag + 1] = (words[flag + 1] + 1) & 0xFFFFFFFF
            futex.wake(self._address + (flag + 1) * _WORD)
        return True

    def _copy_in(self, data: int, at: int, part: memoryview | bytes) -> None:
        n = len(part)
        first = min(n, self.capacity - at)
        self._bytes[data + at:data + at + first] = part[:first] if first < n else part
        if first < n:
            self._bytes[data:data + n - first] = part[first:]

    def pull(self, sender: int) -> list[bytes]:
        """The records that came from ``sender`` since the last pull, oldest first.

        Raises:
            MailboxCorrupt: the ring's counter or a record's length is impossible (the memory
                was written by something that does not keep this layout).
        """
        records = []
        record = self.pull_one(sender)
        while record is not None:
            records.append(record)
            record = self.pull_one(sender)
        return records

    def pull_one(self, sender: int) -> bytes | None:
        """The oldest record from ``sender`` not pulled yet, or None.

        Raises:
            MailboxCorrupt: as ``pull``.
        """
        words = self._words
        written = words[self._written_word[sender]]
        read = self._read[sender]
        if written == read:
            return None
        capacity = self.capacity
        data = self._in_data[sender]
        at = data + read % capacity  # the length word's place
        nbytes = words[at // 8]
        end = read + ((nbytes + 15) & -8)  # the length word and the record, padded to 8 bytes
        if nbytes < 0 or end > written or written - read > capacity:
            self._corrupt(sender, written - read, nbytes)
        at += 8
        if at + nbytes <= data + capacity:
            record = self._bytes[at:at + nbytes]  # an mmap's slice is bytes
        else:
            at = (at - data) % capacity
            first = min(nbytes, capacity - at)
            record = self._bytes[data + at:data + at + first] + self._bytes[data:data + nbytes - first]
        self._read[sender] = end
        words[self._read_word[sender]] = end  # the space may be reused: after the copy
        return record

    def _corrupt(self, sender: int, unread: int, nbytes: int) -> None:
        """Raise ``MailboxCorrupt`` for ``pull_one``'s impossible counter or length."""
        if not 0 < unread <= self.capacity:
            raise MailboxCorrupt(f"the ring from member {sender} claims {unread} bytes "
                                 f"written unread; it holds {self.capacity}")
        raise MailboxCorrupt(f"a record of {nbytes} bytes in the ring from member {sender}")

    def pending(self, sender: int) -> bool:
        """Whether ``sender``'s ring holds records not yet pulled."""
        return self._words[self._written_word[sender]] != self._read[sender]

    def arrives(self, sender: int, looks: int) -> bool:
        """Whether ``sender``'s ring holds a record not yet pulled, looking up to ``looks`` times
        (a spin in one frame: it sees a record a few bytecodes after the sender published it)."""
        words, word, read = self._words, self._written_word[sender], self._read[sender]
        for _ in range(looks):  # noqa: SIM110 - a plain loop: no generator frame per look
            if words[word] != read:
                return True
        return False

    def waiting(self) -> bool:
        """Whether any ring to this member holds records not yet pulled."""
        words, read = self._words, self._read
        return any(words[word] != read[sender] for sender, word in enumerate(self._written_word))

    def arrivals(self) -> list[tuple[int, bytes]]:
        """``(sender, record)`` for every record that came since the last look, each sender's
        oldest first (``pull`` of every ring that holds one)."""
        words, read = self._words, self._read
        found: list[tuple[int, bytes]] = []
        for sender, word in enumerate(self._written_word):
            if words[word] != read[sender]:
                for record in self.pull(sender):
                    found.append((sender, record))
        return found

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, or until a sender rings this member's bell; at once if a
        record is waiting already."""
        words = self._words
        flag = self._bell - 1
        words[flag] = 1
        try:
            bell = words[self._bell]
            if not any(self.pending(q) for q in range(len(self._read))):
                futex.wait(self._address + self._bell * _WORD, bell, seconds)
        finally:
            words[flag] = 0

    def release(self) -> None:
        """Let go of the view on the segment (before it is unmapped)."""
        self._words.release()
