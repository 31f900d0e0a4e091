"""Lifecycle and groups, torch.distributed style: init, destroy, ranks, new_group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.group import Group
from ..core.world import current_world, destroy, init, is_initialized
from . import validate

__all__ = ["init", "init_process_group", "destroy", "destroy_process_group", "is_initialized",
           "get_rank", "get_world_size", "get_local_rank", "new_group", "create_group",
           "get_group_rank", "get_global_rank"]

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
