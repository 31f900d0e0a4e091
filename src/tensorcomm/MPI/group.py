"""``MPI.Group``: an ordered set of processes (global ranks), made and compared locally.
Imports the MPI package's ``constants`` and ``exceptions``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import exceptions, runtime
from .constants import IDENT, PROC_NULL, SIMILAR, UNDEFINED, UNEQUAL


class Group:
    """Processes by their global rank; ``Group()`` is ``GROUP_NULL``."""

    __slots__ = ("_ranks",)

    def __init__(self, group: Group | None = None) -> None:
        self._ranks: tuple[int, ...] | None = None if group is None else group._ranks

    @classmethod
    def _of(cls, ranks: Sequence[int]) -> Group:
        made = cls()
        made._ranks = tuple(ranks)
        return made

    def _members(self) -> tuple[int, ...]:
        if self._ranks is None:
            raise exceptions.error(exceptions.ERR_GROUP, "the group is MPI.GROUP_NULL")
        return self._ranks

    def __bool__(self) -> bool:
        return self._ranks is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Group):
            return NotImplemented
        return self._ranks == other._ranks

    def __hash__(self) -> int:
        return hash(self._ranks)

    def __reduce__(self) -> Any:
        for name in ("GROUP_NULL", "GROUP_EMPTY"):
            if self is globals()[name]:
                return name
        if self._ranks is None:
            return Group, ()
        if self._ranks == ():
            return Group, (GROUP_EMPTY,)
        raise ValueError("cannot pickle an MPI.Group of processes")

    @property
    def size(self) -> int:
        """Number of processes."""
        return self.Get_size()

    @property
    def rank(self) -> int:
        """This process's rank in the group (UNDEFINED if not a member)."""
        return self.Get_rank()

    def Get_size(self) -> int:
        """Number of processes."""
        return len(self._members())

    def Get_rank(self) -> int:
        """This process's rank in the group (UNDEFINED if not a member)."""
        members = self._members()
        me = runtime.world_rank()
        return members.index(me) if me in members else UNDEFINED

    def Dup(self) -> Group:
        """A copy."""
        return Group._of(self._members())

    def Free(self) -> None:
        """Release the group."""
        self._members()
        self._ranks = None

    def Translate_ranks(self, ranks: Sequence[int] | None = None, group: Group | None = None) -> list[int]:
        """Ranks in ``group`` of the processes ``ranks`` of this group (UNDEFINED: not there)."""
        members = self._members()
        if ranks is None:
            ranks = range(len(members))
        other = None if group is None else group._members()
        out = []
        for rank in ranks:
            if rank == PROC_NULL:
                out.append(PROC_NULL)
                continue
            if not 0 <= rank < len(members):
                raise exceptions.error(exceptions.ERR_RANK, f"Translate_ranks: rank {rank} is not in a "
                                       f"group of {len(members)}")
            process = members[rank]
            if other is None:
                out.append(process)
            else:
                out.append(other.index(process) if process in other else UNDEFINED)
        return out

    def Compare(self, group: Group) -> int:
        """IDENT, SIMILAR (same processes, another order) or UNEQUAL."""
        mine, theirs = self._members(), group._members()
        if mine == theirs:
            return IDENT
        return SIMILAR if set(mine) == set(theirs) else UNEQUAL

    def Incl(self, ranks: Sequence[int]) -> Group:
        """The group of this group's ``ranks``, in that order."""
        members = self._members()
        ranks = list(ranks)
        if len(set(ranks)) != len(ranks) or any(not 0 <= r < len(members) for r in ranks):
            raise exceptions.error(exceptions.ERR_RANK, f"Incl: ranks {ranks} are not distinct ranks "
                                   f"of a group of {len(members)}")
        return Group._of([members[r] for r in ranks])

    def Excl(self, ranks: Sequence[int]) -> Group:
        """This group without its ``ranks``."""
        members = self._members()
        ranks = list(ranks)
        if len(set(ranks)) != len(ranks) or any(not 0 <= r < len(members) for r in ranks):
            raise exceptions.error(exceptions.ERR_RANK, f"Excl: ranks {ranks} are not distinct ranks "
                                   f"of a group of {len(members)}")
        return Group._of([p for r, p in enumerate(members) if r not in ranks])

    @staticmethod
    def _ranges(ranks: Sequence[tuple[int, int, int]]) -> list[int]:
        out: list[int] = []
        for first, last, stride in ranks:
            if stride == 0:
                raise exceptions.error(exceptions.ERR_ARG, "a range's stride must not be 0")
            out.extend(range(first, last + (1 if stride > 0 else -1), stride))
        return out

    def Range_incl(self, ranks: Sequence[tuple[int, int, int]]) -> Group:
        """``Incl`` of the ranks in ``(first, last, stride)`` ranges."""
        return self.Incl(self._ranges(ranks))

    def Range_excl(self, ranks: Sequence[tuple[int, int, int]]) -> Group:
        """``Excl`` of the ranks in ``(first, last, stride)`` ranges."""
        return self.Excl(self._ranges(ranks))

    def Union(group1: Group, group2: Group) -> Group:  # noqa: N805 - also called on the class
        """Processes of either group, ``group1``'s first."""
        first = group1._members()
        return Group._of(first + tuple(p for p in group2._members() if p not in first))

    def Intersection(group1: Group, group2: Group) -> Group:  # noqa: N805
        """Processes of both groups, in ``group1``'s order."""
        second = group2._members()
        return Group._of([p for p in group1._members() if p in second])

    def Difference(group1: Group, group2: Group) -> Group:  # noqa: N805
        """Processes of ``group1`` not in ``group2``."""
        second = group2._members()
        return Group._of([p for p in group1._members() if p not in second])


GROUP_NULL = Group()
GROUP_EMPTY = Group._of(())
