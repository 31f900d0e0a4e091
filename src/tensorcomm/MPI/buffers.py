"""mpi4py's buffer specifications, turned into numpy views of the caller's memory (no copy).

A message is an object with the buffer protocol, ``__dlpack__`` (CPU) or a
``__cuda_array_interface__`` that points at host memory, alone or in a list: ``[buf, datatype]``,
``[buf, count, datatype]``, ``[buf, (count, displ), datatype]``, ``[buf, count, displ,
datatype]``; the vector forms take ``(counts, displs)`` instead of a count. ``IN_PLACE`` and
``BOTTOM`` are sentinels. Imports numpy and the MPI package's ``datatype`` and ``exceptions``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..adapters.buffer import has_buffer
from . import exceptions
from .datatype import Datatype, of_dtype


class _Sentinel:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return f"MPI.{self._name}"

    def __int__(self) -> int:
        return 0 if self._name == "BOTTOM" else -1


IN_PLACE = _Sentinel("IN_PLACE")
BOTTOM = _Sentinel("BOTTOM")
_UINT8 = np.dtype(np.uint8)


class Message(NamedTuple):
    """A message: ``array`` (flat, of ``datatype``'s element dtype) holds ``count`` elements of
    ``datatype`` (``count * datatype.count`` array elements)."""

    array: np.ndarray
    datatype: Datatype
    length: int


class Vector(NamedTuple):
    """A vector message: the whole flat buffer, and per member a count and a displacement in
    elements of ``datatype``."""

    array: np.ndarray
    datatype: Datatype
    counts: list[int]
    displs: list[int]


def as_array(obj: Any, fn: str, writable: bool) -> np.ndarray:
    """A flat numpy view of the memory ``obj`` exposes, without a copy.

    Raises:
        TypeError: ``obj`` exposes no memory, or is read-only where the call writes.
        ValueError: its memory is not contiguous.
    """
    if type(obj) is np.ndarray:
        array = obj
    elif isinstance(obj, np.ndarray):
        array = obj.view(np.ndarray)
    elif hasattr(obj, "__cuda_array_interface__") and not hasattr(obj, "__array_interface__"):
        array = _from_interface(obj.__cuda_array_interface__)
    elif hasattr(obj, "__dlpack__") and not has_buffer(obj):
        array = _from_dlpack(obj, fn)
    else:
        try:
            view = memoryview(obj)
        except TypeError:
            raise TypeError(f"{fn}: expected a buffer (an array, bytes, bytearray...) or a list "
                            f"[buffer, datatype], got {type(obj).__name__}") from None
        array = np.asarray(view) if view.ndim else np.frombuffer(view, np.uint8)
    if not array.flags.c_contiguous:
        raise ValueError(f"{fn}: the buffer must be contiguous, got a {array.shape} view with "
                         f"strides {array.strides}")
    if writable and not array.flags.writeable:
        raise TypeError(f"{fn}: the receive buffer is read-only")
    return array.reshape(-1)


def _from_interface(interface: dict[str, Any]) -> np.ndarray:
    """A numpy array over host memory described by a ``__cuda_array_interface__``."""
    address, readonly = interface["data"]
    dtype = np.dtype(interface["typestr"])
    count = int(np.prod(interface["shape"], dtype=np.int64))
    if count == 0 or address == 0:
        return np.empty(0, dtype)
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(address)
    array = np.frombuffer(raw, dtype)
    if readonly:
        array.flags.writeable = False
    return array


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(obj: Any, fn: str) -> np.ndarray:
    """A numpy array over a CPU DLPack tensor, reading its capsule in place (as a consumer
    that does not take ownership: the array keeps the capsule alive, and the producer frees
    the tensor when the capsule goes)."""
    capsule = obj.__dlpack__()
    tensor = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    if tensor.device_type != 1:
        raise TypeError(f"{fn}: a DLPack buffer must be in CPU memory, got device type {tensor.device_type}")
    shape = [tensor.shape[i] for i in range(tensor.ndim)]
    count = int(np.prod(shape, dtype=np.int64)) * tensor.lanes
    dtype = np.dtype(f"{_DL_KINDS[tensor.code]}{tensor.bits // 8}")
    if tensor.strides:
        expected = 1
        for i in reversed(range(tensor.ndim)):
            if shape[i] != 1 and tensor.strides[i] != expected:
                raise ValueError(f"{fn}: the DLPack buffer must be contiguous")
            expected *= shape[i]
    if count == 0 or not tensor.data:
        return np.empty(0, dtype)
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(tensor.data + tensor.byte_offset)
    raw._capsule = capsule
    return np.frombuffer(raw, dtype)


def _typed(array: np.ndarray, datatype: Datatype | None, fn: str) -> tuple[np.ndarray, Datatype]:
    """``array`` as elements of ``datatype``'s dtype (inferred from the array when None)."""
    if datatype is None:
        datatype = of_dtype(array.dtype)
    if not isinstance(datatype, Datatype):
        raise TypeError(f"{fn}: expected an MPI.Datatype, got {type(datatype).__name__}")
    dtype = datatype._checked()
    if array.dtype != dtype:
        raw = array.view(_UINT8)
        usable = raw.size - raw.size % dtype.itemsize
        array = raw[:usable].view(dtype)
    return array, datatype


def _parts(spec: Any) -> tuple[Any, Any, Any, Datatype | None]:
    """(buffer, count-or-counts, displ-or-displs, datatype) of a list specification."""
    if not isinstance(spec, (list, tuple)):
        return spec, None, None, None
    items = list(spec)
    datatype = None
    if items and isinstance(items[-1], (Datatype, str)) and len(items) > 1:
        last = items.pop()
        datatype = last if isinstance(last, Datatype) else of_dtype(np.dtype(last))
    if len(items) == 1:
        return items[0], None, None, datatype
    if len(items) == 2:
        second = items[1]
        if isinstance(second, tuple) and len(second) == 2 and not isinstance(spec, tuple):
            return items[0], second[0], second[1], datatype
        if isinstance(second, tuple) and len(second) == 2 and (
                second[0] is None or isinstance(second[0], (int, np.integer, Sequence))):
            return items[0], second[0], second[1], datatype
        return items[0], second, None, datatype
    if len(items) == 3:
        return items[0], items[1], items[2], datatype
    raise TypeError(f"expected [buffer, datatype], [buffer, count, datatype] or "
                    f"[buffer, (count, displ), datatype], got a list of {len(spec)} items")


def message(spec: Any, fn: str, writable: bool) -> Message:
    """The message ``spec`` describes (count: the whole buffer when not given)."""
    if type(spec) is np.ndarray and spec.flags.c_contiguous:  # the common call: a plain array
        flat = spec.reshape(-1)
        if writable and not flat.flags.writeable:
            raise TypeError(f"{fn}: the receive buffer is read-only")
        datatype = of_dtype(flat.dtype)
        return Message(flat, datatype, flat.size // datatype.count)
    if spec is None or spec is BOTTOM:
        return Message(np.empty(0, _UINT8), of_dtype(_UINT8), 0)
    obj, count, displ, given = _parts(spec)
    flat = np.empty(0, _UINT8) if obj is None or obj is BOTTOM else as_array(obj, fn, writable)
    flat, datatype = _typed(flat, given, fn)
    per = datatype.count
    start = 0 if displ is None else int(displ) * per
    if count is None:
        count = (flat.size - start) // per
    count = int(count)
    if count < 0 or start < 0 or start + count * per > flat.size:
        raise exceptions.error(exceptions.ERR_COUNT, f"{fn}: a message of {count} x {datatype.name} at "
                               f"displacement {displ or 0} does not fit a buffer of {flat.size} "
                               f"elements of {flat.dtype}")
    return Message(flat[start:start + count * per], datatype, count)


def vector(spec: Any, size: int, fn: str, writable: bool) -> Vector:
    """The vector message ``spec`` describes for ``size`` members (counts: equal blocks of the
    buffer when not given; displacements: blocks back to back when not given)."""
    obj, counts, displs, given = _parts(spec)
    flat = np.empty(0, _UINT8) if obj is None or obj is BOTTOM else as_array(obj, fn, writable)
    flat, datatype = _typed(flat, given, fn)
    if counts is None:
        counts = [flat.size // datatype.count // size] * size if size else []
    elif isinstance(counts, (int, np.integer)):
        counts = [int(counts)] * size
    counts = [int(c) for c in counts]
    if displs is None:
        displs = [sum(counts[:i]) for i in range(len(counts))]
    elif isinstance(displs, (int, np.integer)):
        displs = [int(displs) + sum(counts[:i]) for i in range(len(counts))]
    displs = [int(d) for d in displs]
    if len(counts) != size or len(displs) != size:
        raise exceptions.error(exceptions.ERR_COUNT, f"{fn}: expected {size} counts and displacements, "
                               f"got {len(counts)} and {len(displs)}")
    per = datatype.count
    for c, d in zip(counts, displs, strict=True):
        if c < 0 or d < 0 or (d + c) * per > flat.size:
            raise exceptions.error(exceptions.ERR_COUNT, f"{fn}: a block of {c} at displacement {d} "
                                   f"does not fit a buffer of {flat.size} elements")
    return Vector(flat, datatype, counts, displs)
