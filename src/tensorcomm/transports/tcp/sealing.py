"""Authenticated (and optionally encrypted) frames on a data link, keyed by its handshake.

Every frame header (``framing.HEADER``) travels with a 32-byte trailer: a 16-byte *payload tag*
and a 16-byte *header tag*. Each direction of a link has keys of its own, derived from the link's
session key (``rendezvous.auth.Session``), and numbers its frames 0, 1, 2... (the number is never
sent: both ends count). ``TENSORCOMM_LINK_PROTECTION`` picks the level; a link runs at the
stronger of its two ends' levels:

``headers`` (default)
    header tag = HMAC-SHA256(header key, number + header + payload tag), cut to 16 bytes, on
    every frame; control payloads (aborts, probe replies) get a payload tag (HMAC-SHA256 as
    below). A frame that is altered, dropped, replayed, reordered or injected fails its header
    tag. Data payloads are not covered: a man in the middle can read them and alter their bytes.
``mac``
    every payload also gets payload tag = HMAC-SHA256(payload key, number + payload), cut to 16
    bytes, checked when the payload is in (before its receive completes).
``encrypt``
    every data payload is encrypted with AES-256-GCM (the ``cryptography`` package, extra
    ``tensorcomm[crypto]``), nonce = the frame number, the header as associated data; the GCM
    tag is the payload tag. Nobody on the path can read or alter payloads.

A frame that fails its check raises :class:`~tensorcomm.errors.LinkAuthenticationError`
naming the peer; the link is closed for good.
"""

from __future__ import annotations

import hmac
import os
from typing import Any

from ...config import ENV_LINK_PROTECTION, LINK_PROTECTIONS
from ...errors import LinkAuthenticationError
from ...rendezvous.auth import Session
from ...signature import NO_SIGNATURE, Signature
from . import framing

try:  # hmac.digest's own one-shot, without its Python frame (one per sealed or opened header)
    from _hashlib import hmac_digest as _digest
except ImportError:  # a Python built without OpenSSL
    _digest = hmac.digest  # type: ignore[assignment]

LEVELS = LINK_PROTECTIONS
HEADERS, MAC, ENCRYPT = range(len(LEVELS))
TAG_BYTES = 16
HEADER_BYTES = framing.HEADER.size + 2 * TAG_BYTES  # a header and its trailer, as on the wire
_NO_TAG = bytes(TAG_BYTES)
_HEADER_SIZE = framing.HEADER.size
_unpack_header = framing.HEADER.unpack
_NO_SIGNATURE = list(NO_SIGNATURE)


def configured_level() -> int:
    """This process's level from ``TENSORCOMM_LINK_PROTECTION`` (default ``headers``).

    Raises:
        ValueError: an unknown level, or ``encrypt`` without the ``cryptography`` package.
    """
    value = os.environ.get(ENV_LINK_PROTECTION, "").strip().lower() or LEVELS[HEADERS]
    if value not in LEVELS:
        raise ValueError(f"{ENV_LINK_PROTECTION}: expected one of {', '.join(LEVELS)}, got {value!r}")
    level = LEVELS.index(value)
    if level == ENCRYPT:
        _aes_class()
    return level


def _aes_class() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise ValueError(f"{ENV_LINK_PROTECTION}=encrypt needs the 'cryptography' package "
                         "(pip install 'tensorcomm[crypto]')") from None
    return AESGCM


class Sealer:
    """One link's frame protection: seals what this rank sends, opens what it receives.

    ``seal`` must be called in the order frames go onto the wire (the transport calls it under
    the link's send lock), ``open_header`` in the order they arrive.
    """

    __slots__ = ("peer", "level", "checks_data", "_send_header", "_send_payload", "_recv_header",
                 "_recv_payload", "_send_aes", "_recv_aes", "_sent", "_received")

    def __init__(self, peer: int, level: int, send_key: bytes, recv_key: bytes) -> None:
        if level not in range(len(LEVELS)):
            raise ValueError(f"level: expected 0..{len(LEVELS) - 1}, got {level}")
        self.peer = peer
        self.level = level
        self.checks_data = level >= MAC  # data payloads have a payload tag to check (``open_payload``)
        self._send_header, self._send_payload = _derive(send_key, b"header"), _derive(send_key, b"payload")
        self._recv_header, self._recv_payload = _derive(recv_key, b"header"), _derive(recv_key, b"payload")
        self._send_aes = self._recv_aes = None
        if level == ENCRYPT:
            aes = _aes_class()
            self._send_aes, self._recv_aes = aes(_derive(send_key, b"aes")), aes(_derive(recv_key, b"aes"))
        self._sent = 0
        self._received = 0

    @classmethod
    def for_session(cls, session: Session, level: int) -> Sealer:
        """The sealer of a link whose handshake gave ``session``; the stronger level of both ends."""
        level = max(level, session.peer_options)
        if level >= len(LEVELS):
            raise LinkAuthenticationError(session.peer_rank, f"it asks for an unknown link protection "
                                                             f"level {session.peer_options}")
        return cls(session.peer_rank, level, session.direction_key(b"frames", True),
                   session.direction_key(b"frames", False))

    @property
    def received(self) -> int:
        """The frames opened so far (``open_header``)."""
        return self._received

    def seal(self, header: bytes, payload: memoryview, data: bool) -> list[memoryview]:
        """The wire parts of one frame: the header with its trailer, then the payload (if any)."""
        number = self._sent.to_bytes(8, "little")
        self._sent += 1
        tag = _NO_TAG
        if data and self._send_aes is not None:
            sealed = self._send_aes.encrypt(number.rjust(12, b"\0"), payload, header)
            payload, tag = memoryview(sealed)[:-TAG_BYTES], sealed[-TAG_BYTES:]
        elif self.level >= MAC or not data:
            tag = _payload_tag(self._send_payload, number, payload)
        head = header + tag
        parts = [memoryview(head + _digest(self._send_header, number + head, "sha256")[:TAG_BYTES])]
        return [*parts, payload] if len(payload) else parts

    def open_header(self, raw: bytes) -> tuple[int, int, int, Signature | None, tuple[bytes, int, bytes]]:
        """Check and decode one received header (``HEADER_BYTES`` long), as
        ``framing.parse_header`` does, in one step: return its kind, tag, payload length and
        signature, and what ``open_payload`` needs (the header, its number, its payload tag).

        Raises:
            LinkAuthenticationError: the header tag does not match.
            framing.BadFrame: an authentic header that is not a valid one.
        """
        number = self._received
        self._received += 1
        head, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
        if not hmac.compare_digest(tag, _digest(self._recv_header, number.to_bytes(8, "little") + head,
                                                "sha256")[:TAG_BYTES]):
            raise LinkAuthenticationError(self.peer, f"frame {number} failed its header check (altered, "
                                                     "injected or replayed on the way)")
        header = head[:_HEADER_SIZE]
        magic, kind, frame_tag, nbytes, *fields = _unpack_header(header)
        if magic != framing.MAGIC or kind not in framing.KINDS:
            raise framing.BadFrame(f"bad frame header (magic {magic:#x}, kind {kind})")
        limit = framing.MAX_FRAME_BYTES if kind == framing.KIND_DATA else framing.MAX_ABORT_BYTES
        if nbytes > limit:
            what = "more than this host's memory" if kind == framing.KIND_DATA else "past the limit"
            raise framing.BadFrame(f"it sent a frame of {nbytes} bytes, {what} ({limit} bytes): "
                                   f"refused before allocating anything")
        # ``tuple.__new__``: a Signature without its Python ``__new__`` frame
        signature = None if fields == _NO_SIGNATURE else tuple.__new__(Signature, fields)
        return kind, frame_tag, nbytes, signature, (header, number, head[_HEADER_SIZE:])

    def open_payload(self, header: bytes, number: int, tag: bytes, payload: memoryview, data: bool) -> None:
        """Check (``mac``, control frames) or decrypt in place (``encrypt``) one received payload.

        Raises:
            LinkAuthenticationError: the payload was altered.
        """
        nonce = number.to_bytes(8, "little")
        if data and self._recv_aes is not None:
            sealed = bytearray(len(payload) + TAG_BYTES)
            sealed[:len(payload)], sealed[len(payload):] = payload, tag
            try:
                self._recv_aes.decrypt_into(nonce.rjust(12, b"\0"), sealed, header, payload)
            except Exception as exc:  # cryptography's InvalidTag
                raise LinkAuthenticationError(self.peer, f"frame {number} failed its payload "
                                                         "decryption (altered on the way)") from exc
        elif (self.level >= MAC or not data) and not hmac.compare_digest(
                tag, _payload_tag(self._recv_payload, nonce, payload)):
            raise LinkAuthenticationError(self.peer, f"frame {number} failed its payload check "
                                                     "(altered on the way)")


def _derive(key: bytes, label: bytes) -> bytes:
    return hmac.digest(key, label, "sha256")


def _payload_tag(key: bytes, number: bytes, payload: memoryview) -> bytes:
    mac = hmac.new(key, number, "sha256")
    mac.update(payload)  # no copy of the payload (and the GIL is released for large ones)
    return mac.digest()[:TAG_BYTES]
