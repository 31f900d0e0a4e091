"""``Group.split``: MPI's ``Comm_split``, new groups chosen by a color and ordered by a key.

A collective of the parent group: every member gives a color and a key; the members exchange
them with one all-gather (under a signature of its own, so a member that called something else
at this step is told so), and the members of each color make a group together, ordered by key,
then by parent rank, the way ``new_group`` makes any group (so it gets shared memory when its
members share a host). Imports ``algorithms`` and ``signature``; ``group.py`` imports this module,
so it must not import ``group`` or ``collectives`` (which imports ``group``).
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

import numpy as np

from ..algorithms import select
from ..algorithms.base import make_plan
from ..signature import signature

if TYPE_CHECKING:
    from .group import Group, Inside

_INT64 = np.dtype(np.int64)
_LIMIT = np.iinfo(np.int64)
NO_COLOR = -1  # what a member without a group sends: MPI's MPI_UNDEFINED


def _checked(value: object, argument: str, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        expected = "an int or None" if allow_none else "an int"
        raise TypeError(f"split: {argument} must be {expected}, got {type(value).__name__}")
    if not _LIMIT.min <= int(value) <= _LIMIT.max:
        raise ValueError(f"split: {argument} must fit in 64 bits, got {value}")
    return int(value)


def exchange(inside: Inside, color: int, key: int) -> np.ndarray:
    """Every member's ``(color, key)``, as a ``(size, 2)`` array in group-rank order."""
    group = inside.group
    n = group.size
    args = (np.array([color, key], _INT64), np.empty(2 * n, _INT64), (2,) * n)
    plan_key = ("split", n)
    plan = inside.plans.get(plan_key)
    if plan is None:
        team = inside.team()
        row = select.pick("all_gather", team, args[1].nbytes, inside.world.algorithms.get("all_gather"))
        plan = inside.keep_plan(plan_key, make_plan(row, f"split on group {group.name!r}",
                                                    signature("split", _INT64, 2 * n), team, args))
    inside.run(plan, False, *args)
    return args[1].reshape(n, 2)


def split(inside: Inside, color: object, key: object) -> Group | None:
    """See ``Group.split`` (``inside``: the group's ``Inside``)."""
    inside.team()  # a non-member may not split
    wanted = _checked(color, "color", allow_none=True)
    order = _checked(key, "key", allow_none=False)
    assert order is not None
    mine = NO_COLOR if wanted is None or wanted < 0 else wanted
    pairs = exchange(inside, mine, order)
    group = inside.group
    if mine == NO_COLOR:
        return None
    members = sorted((q for q in range(group.size) if pairs[q, 0] == mine),
                     key=lambda q: (int(pairs[q, 1]), q))
    return inside.world.new_group([group.ranks[q] for q in members])
