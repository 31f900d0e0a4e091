"""``MPI.buffer``, ``Alloc_mem``/``Free_mem`` and the buffered-send buffer calls. Buffered sends
need no attached buffer here (every send is buffered by the transport), so attaching one only
keeps it to hand back. Imports numpy and the MPI package's ``buffers``."""

from __future__ import annotations

from typing import Any

import numpy as np

from .buffers import BOTTOM

BSEND_OVERHEAD = 96  # MPICH's; kept for programs that size their buffers with it
BUFFER_AUTOMATIC = BOTTOM


class buffer:  # noqa: N801 - mpi4py's name
    """Memory as mpi4py's ``MPI.buffer`` describes it: ``address``, ``nbytes``, ``obj``."""

    __slots__ = ("_view", "obj")

    def __init__(self, obj: Any = None) -> None:
        self.obj = obj
        self._view = memoryview(b"" if obj is None else obj).cast("B")

    @property
    def address(self) -> int:
        """Where the memory starts."""
        if not self._view.nbytes:
            return 0
        return int(np.frombuffer(self._view, np.uint8).ctypes.data)

    @property
    def nbytes(self) -> int:
        """How many bytes."""
        return self._view.nbytes

    @property
    def readonly(self) -> bool:
        """Whether the memory is read-only."""
        return self._view.readonly

    def tobytes(self) -> bytes:
        """A copy of the bytes."""
        return self._view.tobytes()

    def release(self) -> None:
        """Let go of the memory."""
        self._view.release()

    def __len__(self) -> int:
        return self._view.nbytes

    def __getitem__(self, item: Any) -> Any:
        return self._view[item]

    def __setitem__(self, item: Any, value: Any) -> None:
        self._view[item] = value


def Alloc_mem(size: int, info: Any = None) -> buffer:
    """``size`` bytes of ordinary memory."""
    return buffer(bytearray(size))


def Free_mem(mem: Any) -> None:
    """Release memory from ``Alloc_mem``."""
    if isinstance(mem, buffer):
        mem.release()


class Attached:
    """The buffer attached for buffered sends (kept and handed back, never used)."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held: Any = None

    def attach(self, buf: Any) -> None:
        self.held = buf

    def detach(self) -> Any:
        held, self.held = self.held, None
        return held


PROCESS = Attached()
