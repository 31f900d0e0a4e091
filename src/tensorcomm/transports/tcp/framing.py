"""Frames on a data link: a fixed, typed header followed by the payload.

Header (little endian, 64 bytes): magic ``u32``, kind ``u32``, tag ``u64``, payload length ``u64``,
then the sender's call signature (five ``i64``: collective, dtype, count, op, root; all zero for
point-to-point messages), which the receiver compares with its own call's.
A header with the wrong magic, an unknown kind or a length past its kind's limit (a data frame:
this host's memory, ``MAX_FRAME_BYTES``) is a protocol error that closes the link; nothing is
allocated from an unchecked length. Received headers are
authenticated and decoded in one step (``sealing.Sealer.open_header``).
"""

from __future__ import annotations

import os
import struct

from ...signature import NO_SIGNATURE, Signature

HEADER = struct.Struct("<IIQQ5q")
MAGIC = 0x31434D54  # b"TMC1" read little-endian
KIND_DATA = 1
KIND_BYE = 2  # the peer is closing on purpose (destroy), not dying; tag: BYE_SENT or BYE_SPARE
KIND_ABORT = 3  # the peer aborted a group: tag is the group id, payload says why
KIND_PROBE = 4  # "which call of group <tag> have you reached?" (sent when a wait stalls)
KIND_PROBE_REPLY = 5  # the answer: payload is PROBE_REPLY, the header carries that call's signature
KINDS = (KIND_DATA, KIND_BYE, KIND_ABORT, KIND_PROBE, KIND_PROBE_REPLY)
# A pair may hold two links (both dialled at once); each end sends on one and says goodbye on
# both. Only the goodbye on the link it sent on comes after all it sent: the other may come first.
BYE_SENT = 0  # the last frame on the link the peer sent its messages on: it sends no more
BYE_SPARE = 1  # a link the peer sent no message on: this link closes, the peer may not be done
PROBE_REPLY = struct.Struct("<q")  # the latest call sequence number started, -1 for none
MAX_ABORT_BYTES = 64 << 10  # an abort payload (transports.base.encode_abort)


def _memory_bytes() -> int:
    """This host's physical memory (1 TiB where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 1 << 40


# One data frame: no more than this host's memory, since no receive could hold more, and a frame
# that arrives before its receive is buffered in memory allocated from its length.
MAX_FRAME_BYTES = min(1 << 40, _memory_bytes())


class BadFrame(ConnectionError):
    """The peer sent bytes that are not a valid frame."""


def pack_header(kind: int, tag: int, nbytes: int, signature: Signature | None = None) -> bytes:
    """Encode one frame header."""
    return HEADER.pack(MAGIC, kind, tag, nbytes, *(signature or NO_SIGNATURE))
