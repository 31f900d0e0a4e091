"""The header every tensorcomm message over MPI starts with (abort payloads: ``transports.base``).

A header holds the message's kind, its 64-bit tensorcomm tag, its payload size, the sender's call
signature and, for bulk messages, the MPI tag the payload follows on. Imports the ``Signature``
value type only.
"""

from __future__ import annotations

import struct

from ...signature import Signature

# kind, collective, op, has signature, dtype, (pad), root, bulk MPI tag, tag, nbytes, count
HEADER = struct.Struct("<BBBBHxxiIQQq")

DATA = 1  # payload follows the header in the same MPI message
BULK = 2  # payload follows as its own MPI message on the header's bulk tag
ABORT = 3  # tag: the group id; payload: the encoded cause
PROBE = 4  # tag: a group id; "which call of this group have you reached?"
PROBE_REPLY = 5  # tag: the group id; nbytes: that call's sequence number + 1; its signature
BYE = 6  # the sender's transport is closing

EAGER_TAG = 1  # the MPI tag of every header; bulk payloads use tags above it
FIRST_BULK_TAG = 2

MAX_ABORT_BYTES = 4096  # an ABORT payload (transports.base.encode_abort)


def frame(kind: int, tag: int, payload: memoryview | bytes = b"", signature: Signature | None = None,
          nbytes: int | None = None, bulk: int = 0) -> bytearray:
    """A header (and, for ``DATA``, the payload after it) as one buffer to send."""
    out = bytearray(HEADER.size + (len(payload) if kind != BULK else 0))
    s = signature
    HEADER.pack_into(out, 0, kind, s.collective if s else 0, s.op if s else 0, s is not None,
                     s.dtype if s else 0, s.root if s else 0, bulk, tag,
                     len(payload) if nbytes is None else nbytes, s.elements if s else 0)
    if kind != BULK and payload:
        out[HEADER.size:] = payload
    return out


def parse(buffer: bytearray) -> tuple[int, int, int, int, Signature | None]:
    """``(kind, tag, nbytes, bulk tag, signature)`` of a received header.

    Raises:
        ValueError: the buffer is shorter than a header.
    """
    if len(buffer) < HEADER.size:
        raise ValueError(f"a {len(buffer)}-byte message is shorter than a tensorcomm header")
    kind, collective, op, signed, dtype, root, bulk, tag, nbytes, count = HEADER.unpack_from(buffer)
    signature = Signature(collective, dtype, count, op, root) if signed else None
    return kind, tag, nbytes, bulk, signature

