"""Point-to-point sends of arbitrary picklable Python objects (mpi4py's ``comm.send``/``recv``).

**``recv_object`` and ``irecv_object`` unpickle what the sender sends**, which runs code the sender
chooses: use them only among processes you trust as much as your own, as the object collectives
(``object_collectives.py``, whose pickling this module shares; these two modules are the only
places in tensorcomm that unpickle).

An object travels as two messages on channels of their own (``transports.base.p2p_tag``), apart
from arrays sent with the same tag: a 16-byte header (the pickle's length and a sequence number
drawn by the sender) and then the pickled bytes, in pieces of at most ``CHUNK_BYTES``, on a channel
named by that sequence number. So a receiver that does not know the size, or the sender
(``src=None``), posts the header's receive, and posts the bytes' receives once the header is in;
two objects in flight between the same pair with the same tag cannot take each other's bytes,
whatever order their receives are waited on. Ranks (``src``, ``dst``) are global ranks.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np

from ..core import p2p
from ..core.group import Group
from ..core.work import Work
from ..errors import CommTimeoutError
from . import object_collectives, validate

_HEADER_CHANNEL = 1
_PAYLOAD_CHANNELS = 1 << 14  # payload channel = 2 + sequence number mod this
_sequence = itertools.count()  # next() is atomic in CPython: one counter for every thread


def _payload_channel(sequence: int) -> int:
    return 2 + sequence % _PAYLOAD_CHANNELS


def _pieces(length: int) -> list[slice]:
    chunk = object_collectives.CHUNK_BYTES
    return [slice(start, min(start + chunk, length)) for start in range(0, length, chunk)]


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class _ObjectSend(Work):
    """The header's and the pieces' sends; done when every one is."""

    def __init__(self, parts: list[Work], dst: int) -> None:
        super().__init__(f"send_object to rank {dst}")
        self._parts = parts

    def wait(self, timeout: float | None = None) -> bool:
        if not self._completed:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                for part in self._parts:
                    part.wait(_remaining(deadline))
            except CommTimeoutError:
                raise  # not failed for good: a later wait may still finish it
            except BaseException as exc:
                self._complete(error=exc)
                raise
            self._complete()
        return super().wait(0)

    def is_completed(self) -> bool:
        return self._completed or all(part.is_completed() for part in self._parts)


class _ObjectRecv(Work):
    """The header's receive, then the pieces' receives; ``result()`` is the object and
    ``source`` the sender's global rank."""

    def __init__(self, group: Group, src: int | None, tag: int) -> None:
        super().__init__(f"recv_object from {'any rank' if src is None else f'rank {src}'}")
        self._group, self._tag = group, tag
        self._header = np.empty(2, dtype=np.int64)  # pickle length, sequence number
        self._header_work = p2p.irecv(group, self._header, src, tag, _HEADER_CHANNEL)
        self._data: np.ndarray | None = None
        self._parts: list[Work] = []
        self.source: int | None = src
        """The sender's global rank (known once the header has arrived)."""

    def _post_pieces(self) -> None:
        """Post the pieces' receives, once the header is in (raises the header's error)."""
        if self._data is None:
            self.source = self._header_work.result()
            length, sequence = (int(v) for v in self._header)
            self._data = np.empty(length, dtype=np.uint8)
            self._parts = [p2p.irecv(self._group, self._data[piece], self.source, self._tag,
                                     _payload_channel(sequence)) for piece in _pieces(length)]

    def wait(self, timeout: float | None = None) -> bool:
        if not self._completed:
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                self._header_work.wait(_remaining(deadline))
                self._post_pieces()
                for part in self._parts:
                    part.wait(_remaining(deadline))
                assert self._data is not None
                value = object_collectives._loads(self._data)  # the unpickling this module warns about
            except CommTimeoutError:
                raise  # not failed for good: a later wait may still finish it
            except BaseException as exc:
                self._complete(error=exc)
                raise
            self._complete(result=value)
        return super().wait(0)

    def is_completed(self) -> bool:
        """Whether the object has arrived, without waiting (posting the pieces' receives once the
        header has): the transports move messages meanwhile, as for array receives."""
        if not self._completed and self._header_work.is_completed():
            try:
                self._post_pieces()
                if all(part.is_completed() for part in self._parts):
                    self.wait()  # everything is in: unpickles without waiting
            except Exception as exc:  # noqa: BLE001 - the call's error, which wait() raises
                if not self._completed:
                    self._complete(error=exc)
        return self._completed


def isend_object(obj: Any, dst: int, group: Any = None, tag: int = 0) -> Work:
    """Start sending the picklable ``obj`` to global rank ``dst`` (mpi4py's ``comm.isend``).

    Returns:
        A ``Work``; ``wait()`` returns once the transport has taken the bytes.

    Raises:
        TypeError: ``obj`` cannot be pickled; a bad ``dst``, ``group`` or ``tag`` type.
        ValueError: ``dst`` outside the group, a tag outside ``0 .. 2**31-1``.
    """
    fn = "isend_object"
    g = validate.group(group, fn)
    validate.rank(dst, "dst", fn, g)
    checked_tag = validate.tag(tag, fn)
    data = object_collectives._dumps(obj, "obj", fn)
    sequence = next(_sequence)
    header = np.array([data.size, sequence], dtype=np.int64)
    parts: list[Work] = [p2p.isend(g, header, dst, checked_tag, _HEADER_CHANNEL)]
    parts += [p2p.isend(g, data[piece], dst, checked_tag, _payload_channel(sequence))
              for piece in _pieces(data.size)]
    return _ObjectSend(parts, dst)


def send_object(obj: Any, dst: int, group: Any = None, tag: int = 0) -> None:
    """Send the picklable ``obj`` to global rank ``dst`` (mpi4py's ``comm.send``), matched by
    ``recv_object`` with the same ``tag``."""
    isend_object(obj, dst, group, tag).wait()


def irecv_object(src: int | None = None, group: Any = None, tag: int = 0) -> Work:
    """Post a receive of one object from global rank ``src`` (``None``: any member), as mpi4py's
    ``comm.irecv``. **Unpickles what the sender sent** (see the module docstring).

    Returns:
        A ``Work``: ``wait()`` then ``result()`` gives the object; its ``source`` attribute is
        the sender's global rank once the object has arrived.

    Raises:
        TypeError: a bad ``src``, ``group`` or ``tag`` type.
        ValueError: ``src`` outside the group, a tag outside ``0 .. 2**31-1``.
    """
    fn = "irecv_object"
    g = validate.group(group, fn)
    if src is not None:
        validate.rank(src, "src", fn, g)
    return _ObjectRecv(g, src, validate.tag(tag, fn))


def recv_object(src: int | None = None, group: Any = None, tag: int = 0) -> Any:
    """Receive one object from global rank ``src`` (``None``: any member) and return it, as
    mpi4py's ``comm.recv``. **Unpickles what the sender sent** (see the module docstring).

    Raises:
        As ``irecv_object``; the call's error (e.g. ``PeerLostError``) if the message does not come.
    """
    return irecv_object(src, group, tag).result()
