"""Collectives of arbitrary picklable Python objects, torch.distributed style.

**These functions unpickle what peers send.** Unpickling runs arbitrary code chosen by the sender,
so use them only among processes you trust as much as your own (every rank of one job is
authenticated by the job secret, but any rank of it can make every other rank run code). This
module and ``object_p2p.py`` (which uses its pickling) are the only places in tensorcomm that
unpickle; array collectives never do.

Objects travel as pickled bytes (uint8 arrays) through the array collectives: sizes first (a
small collective of int64s, so every member knows every length), then the bytes in rounds of at
most ``CHUNK_BYTES`` per member. The rounds keep each message, and the core's scratch copy of it,
bounded whatever the object's size, so objects past 2 GiB work on every transport. Ranks given
(``src``, ``dst``) are global ranks.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core import collectives
from ..core.group import Group
from . import validate

CHUNK_BYTES = 1 << 30
"""Largest slice of one member's bytes moved per round (module-level so tests can shrink it)."""


def _dumps(obj: Any, argument: str, fn: str) -> np.ndarray:
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise TypeError(f"{fn}: {argument} cannot be pickled: {exc}") from exc
    return np.frombuffer(data, dtype=np.uint8)


def _loads(data: np.ndarray) -> Any:
    return pickle.loads(data.data)  # the unpickling the module docstring warns about


def _list(value: Any, argument: str, fn: str, length: int | None) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{fn}: {argument} must be a list, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise ValueError(f"{fn}: {argument} must hold {length} items (one per group member), "
                         f"got {len(value)}")
    return value


def _rounds(sizes: np.ndarray, run: Callable[[int, np.ndarray], None]) -> None:
    """Call ``run(start, counts)`` once per round: byte offset and each member's bytes this round."""
    chunk = CHUNK_BYTES
    for start in range(0, max(int(sizes.max(initial=0)), 1), chunk):
        run(start, np.clip(sizes - start, 0, chunk))


def _lengths(group: Group, length: int) -> np.ndarray:
    """Every member's byte count (an all-gather of one int64 each)."""
    table = np.empty(group.size, dtype=np.int64)
    collectives.all_gather(group, np.array([length], dtype=np.int64), table, [1] * group.size, False)
    return table


def _spread(flat: np.ndarray, counts: np.ndarray, into: Sequence[np.ndarray], start: int) -> None:
    """Copy block ``q`` of ``flat`` (``counts[q]`` bytes) to ``into[q][start:]``."""
    offset = 0
    for target, count in zip(into, counts.tolist(), strict=True):
        target[start:start + count] = flat[offset:offset + count]
        offset += count


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """Put every member's ``obj`` into ``object_list[member]`` on every member.

    Unpickles the objects peers send: use only among trusted processes (see the module docstring).

    Args:
        object_list: a list of group-size items, overwritten in place.
        obj: any picklable object.
        group: a ``Group``, a group name, or ``None`` (the world).

    Raises:
        TypeError: ``object_list`` is not a list; ``obj`` cannot be pickled.
        ValueError: ``object_list`` does not hold group-size items.
    """
    fn = "all_gather_object"
    g = validate.group(group, fn)
    _list(object_list, "object_list", fn, g.size)
    data = _dumps(obj, "obj", fn)
    sizes = _lengths(g, data.size)
    received = [np.empty(int(n), dtype=np.uint8) for n in sizes]

    def run(start: int, counts: np.ndarray) -> None:
        out = np.empty(int(counts.sum()), dtype=np.uint8)
        collectives.all_gather(g, data[start:start + int(counts[g.rank])], out, counts.tolist(), False)
        _spread(out, counts, received, start)

    _rounds(sizes, run)
    object_list[:] = [_loads(r) for r in received]


def broadcast_object_list(object_list: list[Any], src: int = 0, group: Any = None) -> None:
    """Replace the items of ``object_list`` with global rank ``src``'s, on every member.

    Unpickles what ``src`` sends: use only among trusted processes (see the module docstring).

    Args:
        object_list: on ``src`` the objects to send; elsewhere a list of the same length, filled in place.
        src: global rank that sends.
        group: a ``Group``, a group name, or ``None`` (the world).

    Raises:
        TypeError: ``object_list`` is not a list; an item on ``src`` cannot be pickled.
        ValueError: ``src`` is not a member, or (after the transfer) this list's length differs
            from ``src``'s.
    """
    fn = "broadcast_object_list"
    g = validate.group(group, fn)
    root = validate.rank(src, "src", fn, g)
    _list(object_list, "object_list", fn, None)
    data = _dumps(list(object_list), "object_list", fn) if g.rank == root else np.empty(0, dtype=np.uint8)
    size = np.array([data.size], dtype=np.int64)
    collectives.broadcast(g, size, root, False)
    if g.rank != root:
        data = np.empty(int(size[0]), dtype=np.uint8)

    def run(start: int, counts: np.ndarray) -> None:
        collectives.broadcast(g, data[start:start + int(counts[0])], root, False)

    _rounds(size, run)
    if g.rank != root:
        objects = _loads(data)
        # Checked after the transfer, so a mismatch cannot leave src waiting for this rank.
        if len(objects) != len(object_list):
            raise ValueError(f"{fn}: object_list holds {len(object_list)} items but src {src} sent "
                             f"{len(objects)}")
        object_list[:] = objects


def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int = 0,
                  group: Any = None) -> None:
    """Put every member's ``obj`` into ``object_gather_list`` on global rank ``dst`` only.

    Unpickles the objects peers send (on ``dst``): use only among trusted processes (see the
    module docstring).

    Args:
        obj: any picklable object.
        object_gather_list: on ``dst``, a list of group-size items overwritten in place; ignored
            (and left untouched) elsewhere.
        dst: global rank that receives.
        group: a ``Group``, a group name, or ``None`` (the world).

    Raises:
        TypeError: ``object_gather_list`` on ``dst`` is not a list; ``obj`` cannot be pickled.
        ValueError: ``dst`` is not a member; the list on ``dst`` does not hold group-size items.
    """
    fn = "gather_object"
    g = validate.group(group, fn)
    root = validate.rank(dst, "dst", fn, g)
    if g.rank == root:
        _list(object_gather_list, "object_gather_list", fn, g.size)
    data = _dumps(obj, "obj", fn)
    sizes = _lengths(g, data.size)  # every member needs the sizes to agree on the rounds
    received = [np.empty(int(n), dtype=np.uint8) for n in sizes] if g.rank == root else None

    def run(start: int, counts: np.ndarray) -> None:
        out = None if received is None else np.empty(int(counts.sum()), dtype=np.uint8)
        collectives.gather(g, data[start:start + int(counts[g.rank])], out, counts.tolist(), root, False)
        if out is not None and received is not None:
            _spread(out, counts, received, start)

    _rounds(sizes, run)
    if received is not None and object_gather_list is not None:
        object_gather_list[:] = [_loads(r) for r in received]


def scatter_object_list(scatter_object_output_list: list[Any],
                        scatter_object_input_list: list[Any] | None = None,
                        src: int = 0, group: Any = None) -> None:
    """Send ``scatter_object_input_list[i]`` from global rank ``src`` to member i.

    Unpickles what ``src`` sends: use only among trusted processes (see the module docstring).

    Args:
        scatter_object_output_list: a non-empty list; its first item becomes this member's object.
        scatter_object_input_list: on ``src``, group-size picklable objects; ignored elsewhere.
        src: global rank that sends.
        group: a ``Group``, a group name, or ``None`` (the world).

    Raises:
        TypeError: a list argument is not a list; an input object cannot be pickled.
        ValueError: ``src`` is not a member; an empty output list; an input list on ``src`` that
            does not hold group-size items.
    """
    fn = "scatter_object_list"
    g = validate.group(group, fn)
    root = validate.rank(src, "src", fn, g)
    _list(scatter_object_output_list, "scatter_object_output_list", fn, None)
    if not scatter_object_output_list:
        raise ValueError(f"{fn}: scatter_object_output_list must hold at least one item")
    if g.rank == root:
        items = _list(scatter_object_input_list, "scatter_object_input_list", fn, g.size)
        sent = [_dumps(item, f"scatter_object_input_list[{i}]", fn) for i, item in enumerate(items)]
        sizes = np.array([s.size for s in sent], dtype=np.int64)
    else:
        sizes = np.empty(g.size, dtype=np.int64)
    collectives.broadcast(g, sizes, root, False)  # every member needs all sizes for the rounds
    mine = np.empty(int(sizes[g.rank]), dtype=np.uint8)

    def run(start: int, counts: np.ndarray) -> None:
        send = np.concatenate([s[start:start + int(c)] for s, c in zip(sent, counts, strict=True)]) \
            if g.rank == root else None
        collectives.scatter(g, send, mine[start:start + int(counts[g.rank])], counts.tolist(), root, False)

    _rounds(sizes, run)
    scatter_object_output_list[0] = _loads(mine)
