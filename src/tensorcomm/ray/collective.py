"""tensorcomm as a ``ray.util.collective`` backend (``backend="tensorcomm"``).

Ray builds the backend's group object inside each actor with only ``(world_size, rank,
group_name)``; the ranks meet on a store actor named after the group (``tensorcomm-store-<name>``,
started by whichever rank comes first) and the secret it generated. A process holds one
tensorcomm world, so it may be in one such group at a time. Imported only by
``tensorcomm.ray.register_collective_backend`` (``ray.util.collective`` imports torch, seconds).
"""

from __future__ import annotations

from typing import Any

from ray.util.collective import types
from ray.util.collective.backend_registry import register_collective_backend
from ray.util.collective.collective_group.base_collective_group import BaseGroup

from .. import all_gather, all_reduce, barrier, broadcast, config, recv, reduce, reduce_scatter, send
from ..core import lifecycle
from ..types import ReduceOp
from .store import RayStore

NAME = "TENSORCOMM"
_OPS = {types.ReduceOp.SUM: ReduceOp.SUM, types.ReduceOp.PRODUCT: ReduceOp.PROD,
        types.ReduceOp.MIN: ReduceOp.MIN, types.ReduceOp.MAX: ReduceOp.MAX}


def _one(tensors: list[Any], argument: str) -> Any:
    """The single tensor of a per-device list (tensorcomm runs one device per process)."""
    if len(tensors) != 1:
        raise ValueError(f"{argument}: tensorcomm takes one tensor per process, got {len(tensors)}")
    return tensors[0]


def _op(options: Any) -> ReduceOp:
    return _OPS[getattr(options, "reduceOp", types.ReduceOp.SUM)]


class TensorcommGroup(BaseGroup):
    """A ``ray.util.collective`` group whose calls run on this process's tensorcomm world."""

    def __init__(self, world_size: int, rank: int, group_name: str) -> None:
        super().__init__(world_size, rank, group_name)
        if lifecycle.is_initialized():
            raise RuntimeError(f"ray.util.collective group {group_name!r}: this process is already "
                               "in a tensorcomm job; tensorcomm holds one per process")
        seconds = lifecycle._seconds(None, config.DEFAULT_TIMEOUT)
        self._store = RayStore.create(seconds, name=f"tensorcomm-store-{group_name}")
        lifecycle.init(store=self._store, rank=rank, world_size=world_size, timeout=seconds,
                        secret=self._store.secret())

    @classmethod
    def backend(cls) -> str:
        return NAME

    @classmethod
    def check_backend_availability(cls) -> bool:
        return True

    def destroy_group(self) -> None:
        lifecycle.destroy()

    def allreduce(self, tensors: list[Any], allreduce_options: Any = None) -> None:
        all_reduce(_one(tensors, "tensors"), op=_op(allreduce_options))

    def barrier(self, barrier_options: Any = None) -> None:
        barrier()

    def reduce(self, tensors: list[Any], reduce_options: Any = None) -> None:
        reduce(_one(tensors, "tensors"), dst=getattr(reduce_options, "root_rank", 0),
                  op=_op(reduce_options))

    def allgather(self, tensor_lists: list[list[Any]], tensors: list[Any],
                  allgather_options: Any = None) -> None:
        all_gather(_one(tensor_lists, "tensor_lists"), _one(tensors, "tensors"))

    def broadcast(self, tensors: list[Any], broadcast_options: Any = None) -> None:
        broadcast(_one(tensors, "tensors"), src=getattr(broadcast_options, "root_rank", 0))

    def reducescatter(self, tensors: list[Any], tensor_lists: list[list[Any]],
                      reducescatter_options: Any = None) -> None:
        reduce_scatter(_one(tensors, "tensors"), _one(tensor_lists, "tensor_lists"),
                          op=_op(reducescatter_options))

    def send(self, tensors: list[Any], send_options: Any) -> None:
        send(_one(tensors, "tensors"), dst=send_options.dst_rank)

    def recv(self, tensors: list[Any], recv_options: Any) -> None:
        recv(_one(tensors, "tensors"), src=recv_options.src_rank)


def register() -> None:
    """Register ``TensorcommGroup`` under ``"tensorcomm"``, unless this process already did."""
    try:
        register_collective_backend(NAME, TensorcommGroup)
    except ValueError as exc:
        if "already registered" not in str(exc):
            raise
