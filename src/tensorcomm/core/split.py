"""``Group.split``: MPI's ``Comm_split``, new groups chosen by a color and ordered by a key.

A collective of the parent group: every member gives a color and a key; the members exchange
them with one all-gather (under a signature of its own, so a member that called something else
at this step is told so), and the members of each color make a group together, ordered by key,
then by parent rank, the way ``new_group`` makes any group (so it gets shared memory when its
members share a host). Imports ``algorithms`` and ``signature``; ``group.py`` imports this module,
so it must not import ``group`` or ``collectives`` (which imports ``group``), not even for types:
it sees the group as a ``Parent`` and returns the new group's members, whom ``Group.split`` makes
a group of.
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable
from typing import Any, Protocol

import numpy as np

from ..algorithms import select
from ..algorithms.base import Plan, Team, make_plan
from ..signature import signature

_INT64 = np.dtype(np.int64)
_LIMIT = np.iinfo(np.int64)
NO_COLOR = -1  # what a member without a group sends: MPI's MPI_UNDEFINED


class Parent(Protocol):
    """The group a split runs on, as the split uses it (``group.Inside`` is one): the plans it
    keeps per call shape, this member's team, and running a plan in the group's issue order."""

    @property
    def plans(self) -> dict[Hashable, Plan]: ...

    def team(self) -> Team: ...

    def keep_plan(self, key: Hashable, plan: Plan) -> Plan: ...

    def run(self, plan: Plan, async_op: bool, *args: Any) -> Any: ...


def _checked(value: object, argument: str, allow_none: bool) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        expected = "an int or None" if allow_none else "an int"
        raise TypeError(f"split: {argument} must be {expected}, got {type(value).__name__}")
    if not _LIMIT.min <= int(value) <= _LIMIT.max:
        raise ValueError(f"split: {argument} must fit in 64 bits, got {value}")
    return int(value)


def exchange(parent: Parent, color: int, key: int, algorithm: str | None) -> np.ndarray:
    """Every member's ``(color, key)``, as a ``(size, 2)`` array in group-rank order
    (``algorithm``: the all-gather the world was told to use, if any)."""
    team = parent.team()
    n = team.size
    args = (np.array([color, key], _INT64), np.empty(2 * n, _INT64), (2,) * n)
    plan_key = ("split", n)
    plan = parent.plans.get(plan_key)
    if plan is None:
        row = select.pick("all_gather", team, args[1].nbytes, algorithm)
        plan = parent.keep_plan(plan_key, make_plan(row, f"split on group {team.group_name!r}",
                                                    signature("split", _INT64, 2 * n), team, args))
    parent.run(plan, False, *args)
    return args[1].reshape(n, 2)


def split(parent: Parent, color: object, key: object, algorithm: str | None) -> list[int] | None:
    """See ``Group.split``: the global ranks of this member's new group, in its order, or None
    (``algorithm``: the all-gather the world was told to use, if any)."""
    team = parent.team()  # a non-member may not split
    wanted = _checked(color, "color", allow_none=True)
    order = _checked(key, "key", allow_none=False)
    assert order is not None
    mine = NO_COLOR if wanted is None or wanted < 0 else wanted
    pairs = exchange(parent, mine, order, algorithm)
    if mine == NO_COLOR:
        return None
    members = sorted((q for q in range(team.size) if pairs[q, 0] == mine),
                     key=lambda q: (int(pairs[q, 1]), q))
    return [team.ranks[q] for q in members]
