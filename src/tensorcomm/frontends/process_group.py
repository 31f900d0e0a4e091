"""Lifecycle and groups, torch.distributed style: init, destroy, ranks, new_group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.group import Group
from ..core.lifecycle import current_world, destroy, init, is_initialized
from . import validate

__all__ = ["init", "init_process_group", "destroy", "destroy_process_group", "is_initialized",
           "get_rank", "get_world_size", "get_local_rank", "new_group", "create_group",
           "new_subgroups_by_enumeration", "get_group_rank", "get_global_rank"]

init_process_group = init
destroy_process_group = destroy


def get_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (default: the world).

    Raises:
        RuntimeError: not initialised.
        ValueError: this process is not a member of ``group``.
    """
    return validate.group(group, "get_rank").rank


def get_world_size(group: Any = None) -> int:
    """Number of ranks in ``group`` (default: the world)."""
    return validate.group(group, "get_world_size").size


def get_local_rank() -> int:
    """This process's rank among the ranks on its host (``LOCAL_RANK``)."""
    return current_world().local_rank


def _ranks(ranks: Any, fn: str) -> list[int]:
    world = current_world()
    if ranks is None:
        return list(range(world.size))
    if isinstance(ranks, (str, bytes)) or (not isinstance(ranks, Sequence)
                                           and not hasattr(ranks, "__iter__")):
        raise TypeError(f"{fn}: ranks must be a list of ints, got {type(ranks).__name__}")
    checked = [validate.integer(r, f"ranks[{i}]", fn) for i, r in enumerate(ranks)]
    if not checked:
        raise ValueError(f"{fn}: ranks must not be empty")
    bad = [r for r in checked if not 0 <= r < world.size]
    if bad:
        raise ValueError(f"{fn}: ranks {bad} are out of range for a world of size {world.size}")
    if len(set(checked)) != len(checked):
        raise ValueError(f"{fn}: ranks must be unique, got {checked}")
    return checked


def new_group(ranks: Sequence[int] | None = None) -> Group:
    """A group of the given global ranks (in that order); ``None`` means every rank.

    May be called by every process (torch style) or by the members only; a non-member gets a
    ``Group`` with ``is_member`` False, and collectives on it raise ValueError.
    """
    return current_world().new_group(_ranks(ranks, "new_group"))


def new_subgroups_by_enumeration(ranks_per_subgroup_list: Sequence[Sequence[int]],
                                 ) -> tuple[Group | None, list[Group]]:
    """One group per list of global ranks, as ``torch.distributed.new_subgroups_by_enumeration``.

    Every process calls it with the same lists (each made as ``new_group`` makes it, in the
    order given). A rank may appear in one list at most; ranks in none get no subgroup.

    Returns:
        ``(this process's subgroup or None, every subgroup in the order given)``.

    Raises:
        TypeError: the argument is not a list of lists of ints.
        ValueError: it is empty, a list is empty or out of range, or a rank is in two lists.
    """
    fn = "new_subgroups_by_enumeration"
    if isinstance(ranks_per_subgroup_list, (str, bytes)) or not isinstance(ranks_per_subgroup_list, Sequence):
        raise TypeError(f"{fn}: ranks_per_subgroup_list must be a list of lists of ranks, got "
                        f"{type(ranks_per_subgroup_list).__name__}")
    if not ranks_per_subgroup_list:
        raise ValueError(f"{fn}: ranks_per_subgroup_list must not be empty")
    lists: list[list[int]] = []
    seen: dict[int, int] = {}
    for i, ranks in enumerate(ranks_per_subgroup_list):
        if ranks is None:
            raise TypeError(f"{fn}: ranks_per_subgroup_list[{i}] must be a list of ranks, got None")
        lists.append(_ranks(ranks, f"{fn} (ranks_per_subgroup_list[{i}])"))
        for rank in lists[-1]:
            if rank in seen:
                raise ValueError(f"{fn}: rank {rank} is in ranks_per_subgroup_list[{seen[rank]}] "
                                 f"and ranks_per_subgroup_list[{i}]")
            seen[rank] = i
    world = current_world()
    subgroups = [world.new_group(ranks) for ranks in lists]
    mine = next((g for g in subgroups if g.is_member), None)
    return mine, subgroups


def create_group(name: str, ranks: Sequence[int]) -> Group:
    """``new_group`` that also registers ``name``, usable wherever a group is accepted."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"create_group: name must be a non-empty str, got {name!r}")
    return current_world().new_group(_ranks(ranks, "create_group"), name=name)


def get_group_rank(group: Group, global_rank: int) -> int:
    """Translate a global rank to its rank in ``group`` (ValueError if not a member)."""
    rank = validate.integer(global_rank, "global_rank", "get_group_rank")
    return validate.group(group, "get_group_rank").group_rank(rank)


def get_global_rank(group: Group, group_rank: int) -> int:
    """Translate a rank in ``group`` to the global rank (ValueError if out of range)."""
    return validate.group(group, "get_global_rank").global_rank(group_rank)
