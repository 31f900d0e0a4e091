"""Frames on a data link: a fixed, typed header followed by the payload.

Header (little endian, 24 bytes): magic ``u32``, kind ``u32``, tag ``u64``, payload length ``u64``.
A header with the wrong magic, an unknown kind or a length past ``MAX_FRAME_BYTES`` is a protocol
error that closes the link; nothing is allocated from an unchecked length.
"""

from __future__ import annotations

import socket
import struct

HEADER = struct.Struct("<IIQQ")
MAGIC = 0x31434D54  # b"TMC1" read little-endian
KIND_DATA = 1
KIND_BYE = 2  # the peer is closing on purpose (destroy), not dying
MAX_FRAME_BYTES = 1 << 40  # one message: far above any array a CPU host holds, far below 2**60
SMALL_FRAME_BYTES = 64 << 10  # payloads up to this size go out in one syscall with the header


class ProtocolError(ConnectionError):
    """The peer sent bytes that are not a valid frame."""


def pack_header(kind: int, tag: int, nbytes: int) -> bytes:
    """Encode one frame header."""
    return HEADER.pack(MAGIC, kind, tag, nbytes)


def recv_exact_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock`` (zero-copy ``recv_into``); EOF midway raises ConnectionError."""
    got = 0
    total = len(view)
    while got < total:
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            raise ConnectionError(f"connection closed after {got} of {total} bytes")
        got += n


def read_header(sock: socket.socket) -> tuple[int, int, int] | None:
    """Read one header; return ``(kind, tag, nbytes)``, or ``None`` on a clean EOF before it."""
    raw = bytearray(HEADER.size)
    view = memoryview(raw)
    first = sock.recv_into(view, HEADER.size)
    if first == 0:
        return None
    if first < HEADER.size:
        recv_exact_into(sock, view[first:])
    magic, kind, tag, nbytes = HEADER.unpack(raw)
    if magic != MAGIC or kind not in (KIND_DATA, KIND_BYE):
        raise ProtocolError(f"bad frame header (magic {magic:#x}, kind {kind})")
    if nbytes > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {nbytes} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    return kind, tag, nbytes


def send_frame(sock: socket.socket, kind: int, tag: int, payload: memoryview) -> None:
    """Send a header and its payload; small payloads share one syscall with the header."""
    header = pack_header(kind, tag, len(payload))
    if len(payload) <= SMALL_FRAME_BYTES:
        sock.sendall(header + payload.tobytes() if len(payload) else header)
    else:
        sock.sendall(header)
        sock.sendall(payload)
