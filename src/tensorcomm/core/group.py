"""``Group``: which ranks take part, how group ranks map to global ranks, and where calls run.

Each group owns an ``Engine`` (issue order and sequence numbers) and builds one ``Ctx`` per call
for the algorithms. ``WORLD`` is a handle that always means the current world group, so it can
be imported before ``init()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..algorithms.base import Ctx
from ..algorithms.signature import Signature
from .engine import Engine
from .work import Work

if TYPE_CHECKING:
    from .world import World


class Group:
    """An ordered set of global ranks that run collectives together.

    Every member must issue the same collectives on a group in the same order. A process that
    is not a member holds a ``Group`` too (``is_member`` is False); using it raises ValueError.
    """

    def __init__(self, name: str, ranks: Sequence[int], group_id: int, world: "World") -> None:
        self._name = name
        self._ranks = tuple(ranks)
        self._group_id = group_id
        self._world = world
        self._index = {g: i for i, g in enumerate(self._ranks)}
        self._engine = Engine(name)

    # The WORLD handle overrides this to follow whichever world is current.
    def _target(self) -> "Group":
        return self

    @property
    def name(self) -> str:
        """The group's name (``"world"`` for the world group)."""
        return self._target()._name

    @property
    def ranks(self) -> tuple[int, ...]:
        """Global ranks of the members, in group-rank order."""
        return self._target()._ranks

    @property
    def size(self) -> int:
        """Number of members."""
        return len(self._target()._ranks)

    @property
    def is_member(self) -> bool:
        """Whether this process belongs to the group."""
        target = self._target()
        return target._world.rank in target._index

    @property
    def rank(self) -> int:
        """This process's rank within the group.

        Raises:
            ValueError: this process is not a member.
        """
        target = self._target()
        return target.group_rank(target._world.rank)

    def group_rank(self, global_rank: int) -> int:
        """Translate a global rank to this group's rank.

        Raises:
            ValueError: ``global_rank`` is not a member.
        """
        target = self._target()
        try:
            return target._index[global_rank]
        except (KeyError, TypeError):
            raise ValueError(f"global rank {global_rank!r} is not a member of group "
                             f"{target._name!r} (ranks {list(target._ranks)})") from None

    def global_rank(self, group_rank: int) -> int:
        """Translate a rank of this group to the global rank.

        Raises:
            ValueError: ``group_rank`` is outside ``0 .. size-1``.
        """
        target = self._target()
        if isinstance(group_rank, bool) or not isinstance(group_rank, int) \
                or not 0 <= group_rank < len(target._ranks):
            raise ValueError(f"group rank {group_rank!r} is outside group {target._name!r} "
                             f"of size {len(target._ranks)}")
        return target._ranks[group_rank]

    # -- used by the core's collectives ---------------------------------------------------------

    @property
    def world(self) -> "World":
        return self._target()._world

    @property
    def group_id(self) -> int:
        return self._target()._group_id

    def run(self, name: str, body: Callable[[Ctx], Any], async_op: bool, signature: Signature) -> Work | Any:
        """Run ``body`` with a fresh ``Ctx`` in this group's issue order."""
        target = self._target()
        world = target._world
        my_rank = target.rank  # raises for non-members

        def with_ctx(seq: int) -> Any:
            ctx = Ctx(transport=world.transport, ranks=target._ranks, rank=my_rank,
                      group_id=target._group_id, seq=seq, timeout=world.timeout,
                      name=f"{name} on group {target._name!r}", host_of=world.hosts_of(target._ranks),
                      signature=signature, group_name=target._name)
            return body(ctx)

        return target._engine.submit(f"{name} on group {target._name!r}", with_ctx, async_op)

    def _stop(self, error: BaseException) -> None:
        self._engine.stop(error)

    def __repr__(self) -> str:
        return f"Group(name={self.name!r}, ranks={list(self.ranks)})"


class _WorldHandle(Group):
    """``tensorcomm.WORLD``: the world group of whichever ``init()`` is current."""

    def __init__(self) -> None:  # no state of its own
        pass

    def _target(self) -> Group:
        from .world import current_world  # world imports group: resolve at call time

        return current_world().world_group

    def __repr__(self) -> str:
        return "tensorcomm.WORLD"


WORLD: Group = _WorldHandle()
