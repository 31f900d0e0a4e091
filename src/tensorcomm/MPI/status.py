"""``MPI.Status``: source, tag, error, byte count and cancelled flag of a finished receive.
Imports numpy and the MPI package's ``constants`` and ``datatype``."""

from __future__ import annotations

from typing import Any

import numpy as np

from .constants import ANY_SOURCE, ANY_TAG, UNDEFINED
from .datatype import Datatype

_SOURCE, _TAG, _ERROR = 0, 1, 2


class Status:
    """What a receive (or probe) found: ``Status()`` is empty; ``Status(other)`` copies."""

    __slots__ = ("_fields", "nbytes", "cancelled")

    def __init__(self, status: Status | None = None) -> None:
        if status is not None and not isinstance(status, Status):
            raise TypeError(f"Status: expected a Status to copy, got {type(status).__name__}")
        self._fields = np.array([ANY_SOURCE, ANY_TAG, 0], np.int32)
        self.nbytes = 0
        self.cancelled = False
        if status is not None:
            self._fields[:] = status._fields
            self.nbytes, self.cancelled = status.nbytes, status.cancelled

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (int(self._fields[0]), int(self._fields[1]), int(self._fields[2]),
                          self.nbytes, self.cancelled)

    def _set(self, source: int, tag: int, nbytes: int, error: int = 0, cancelled: bool = False) -> None:
        self._fields[:] = (source, tag, error)
        self.nbytes, self.cancelled = nbytes, cancelled

    def _clear(self) -> None:
        self._set(ANY_SOURCE, ANY_TAG, 0)

    @property
    def source(self) -> int:
        """The sender's rank in the communicator."""
        return int(self._fields[_SOURCE])

    @source.setter
    def source(self, value: int) -> None:
        self._fields[_SOURCE] = value

    @property
    def tag(self) -> int:
        """The message's tag."""
        return int(self._fields[_TAG])

    @tag.setter
    def tag(self, value: int) -> None:
        self._fields[_TAG] = value

    @property
    def error(self) -> int:
        """The error class (``MPI.SUCCESS``: none)."""
        return int(self._fields[_ERROR])

    @error.setter
    def error(self, value: int) -> None:
        self._fields[_ERROR] = value

    @property
    def count(self) -> int:
        """The message's length in bytes."""
        return self.nbytes

    @count.setter
    def count(self, value: int) -> None:
        self.nbytes = int(value)

    def Get_source(self) -> int:
        """The sender's rank in the communicator."""
        return self.source

    def Set_source(self, source: int) -> None:
        """Set the source field."""
        self.source = source

    def Get_tag(self) -> int:
        """The message's tag."""
        return self.tag

    def Set_tag(self, tag: int) -> None:
        """Set the tag field."""
        self.tag = tag

    def Get_error(self) -> int:
        """The error field."""
        return self.error

    def Set_error(self, error: int) -> None:
        """Set the error field."""
        self.error = error

    def Get_count(self, datatype: Datatype | None = None) -> int:
        """How many elements of ``datatype`` (bytes when None) the message held; UNDEFINED
        when its length is not a whole number of them."""
        size = 1 if datatype is None else datatype.Get_size()
        if size == 0:
            return 0 if self.nbytes == 0 else UNDEFINED
        return self.nbytes // size if self.nbytes % size == 0 else UNDEFINED

    def Get_elements(self, datatype: Datatype) -> int:
        """How many basic elements of ``datatype`` the message held."""
        item = datatype._checked().itemsize
        return self.nbytes // item if item else 0

    def Set_elements(self, datatype: Datatype, count: int) -> None:
        """Set the length to ``count`` elements of ``datatype``."""
        self.nbytes = int(count) * datatype._checked().itemsize

    def Is_cancelled(self) -> bool:
        """Whether the request was cancelled."""
        return bool(self.cancelled)

    def Set_cancelled(self, flag: bool) -> None:
        """Set the cancelled flag."""
        self.cancelled = bool(flag)

    def tomemory(self) -> memoryview:
        """The source, tag and error fields as a writable memory view."""
        return self._fields.data

    def py2f(self) -> list[int]:
        """The fields as a list."""
        return [self.source, self.tag, self.error, self.nbytes, int(self.cancelled)]


def _rebuild(source: int, tag: int, error: int, nbytes: int, cancelled: bool) -> Status:
    status = Status()
    status._set(source, tag, nbytes, error, cancelled)
    return status
