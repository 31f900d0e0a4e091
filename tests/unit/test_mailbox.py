"""The shared-memory mailbox's rings (``transports/shm/mailbox.py``): two members' ends over one
region, as two processes would map it."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from tensorcomm.transports.shm.mailbox import (
    MAX_RING,
    MIN_RING,
    Mailbox,
    MailboxCorrupt,
    region_bytes,
    ring_bytes,
)


def pair(size: int = 2) -> tuple[Mailbox, Mailbox, np.ndarray]:
    segment = mmap.mmap(-1, region_bytes(size))
    return Mailbox(segment, 0, size), Mailbox(segment, 1, size), np.frombuffer(segment, np.uint8)


def test_records_arrive_whole_and_in_order_across_the_wrap():
    sender, receiver, _ = pair()
    sent, got = [], []
    rng = np.random.default_rng(0)
    for i in range(3000):  # several times around the ring, records of every alignment
        record = rng.integers(0, 256, int(rng.integers(0, 5000)), dtype=np.uint8).tobytes()
        head = i.to_bytes(8, "little")
        if not sender.push(1, head, record):
            got.extend(receiver.pull(0))
            assert sender.push(1, head, record)
        sent.append(head + record)
    got.extend(receiver.pull(0))
    assert got == sent
    assert receiver.pull(0) == [] and not receiver.pending(0)


def test_a_full_ring_refuses_and_takes_again_once_read():
    sender, receiver, _ = pair()
    body = bytes(sender.longest - 8)
    pushed = 0
    while sender.push(1, b"h" * 8, body):
        pushed += 1
    assert pushed == 1  # half a ring each: the second does not fit beside its length words
    assert receiver.pending(0)
    assert receiver.pull(0) == [b"h" * 8 + body]
    assert sender.push(1, b"h" * 8, body)


def test_own_ring_and_other_pairs_are_apart():
    segment = mmap.mmap(-1, region_bytes(3))
    boxes = [Mailbox(segment, q, 3) for q in range(3)]
    boxes[0].push(0, b"self")
    boxes[0].push(2, b"to two")
    boxes[1].push(2, b"from one")
    assert boxes[0].pull(0) == [b"self"]
    assert boxes[1].pull(0) == [] and boxes[2].pull(1) == [b"from one"]
    assert boxes[2].pull(0) == [b"to two"]


def test_too_long_a_record_is_refused_by_name():
    sender, _, _ = pair()
    with pytest.raises(ValueError, match="longer than a ring takes"):
        sender.push(1, bytes(sender.longest + 1))


def test_region_stays_small_as_members_grow():
    assert region_bytes(1) == 0
    assert ring_bytes(2) == MAX_RING and ring_bytes(1024) == MIN_RING
    for size in (2, 8, 64, 128):
        assert region_bytes(size) <= size * ((1 << 20) + size * 128 + MIN_RING * size)
    assert region_bytes(128) < 150 << 20  # about 1 MiB of rings per member


def test_a_short_region_is_refused():
    with pytest.raises(ValueError, match="needs"):
        Mailbox(mmap.mmap(-1, 100), 0, 2)


def test_impossible_counters_and_lengths_are_refused_not_read():
    sender, receiver, region = pair()
    words = region.view(np.int64)
    sender.push(1, b"ok")
    words[receiver._in[0] // 8] = 10 ** 9  # the written counter, far past what a ring holds
    with pytest.raises(MailboxCorrupt, match="claims"):
        receiver.pull(0)
    sender2, receiver2, region2 = pair()
    sender2.push(1, b"ok")
    region2.view(np.int64)[(receiver2._in[0] + 128) // 8] = 1 << 40  # the record's length word
    with pytest.raises(MailboxCorrupt, match="record of"):
        receiver2.pull(0)
