"""Ray Train's ``TorchTrainer`` on tensorcomm: ``torch_config=tensorcomm.ray.train.TorchConfig()``.

Ray Train's own ``TorchConfig(backend="tensorcomm")`` reaches tensorcomm's torch backend, but
through torch's TCPStore on the first worker's node address, where tensorcomm cannot hand out a
generated secret (anyone reaching that port could read it), so it needs ``TENSORCOMM_SECRET`` in
every worker's environment, i.e. in the job's ``runtime_env`` (docs/ray.md). This config joins
the workers to one tensorcomm job first, through a store actor (``tensorcomm.ray``: the secret
stays in Ray's actor calls), then lets Ray Train call ``init_process_group(backend="tensorcomm")``,
which adopts that job; at shutdown it leaves the job. Imports Ray Train's torch backend, whose
``_TorchBackend`` is not public Ray API: this module follows Ray 2.x (tested with 2.60).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
from ray.train.torch import TorchConfig as RayTorchConfig
from ray.train.torch.config import _TorchBackend

from ..core import lifecycle
from .store import RayStore


def _join(store: RayStore, world_rank: int, size: int, timeout: float) -> None:
    import tensorcomm.torch  # noqa: F401 - registers the torch backend in this worker

    lifecycle.init(store=store, rank=world_rank, world_size=size, timeout=timeout,
                    secret=store.secret())


def _leave() -> None:
    lifecycle.destroy()


class _TensorcommTorchBackend(_TorchBackend):
    def on_start(self, worker_group: Any, backend_config: Any) -> None:
        size = len(worker_group)
        timeout = float(backend_config.timeout_s)
        store = RayStore.create(timeout)
        ray.get([worker_group.execute_single_async(rank, _join, store=store, world_rank=rank, size=size,
                                                    timeout=timeout) for rank in range(size)])
        super().on_start(worker_group, backend_config)

    def on_shutdown(self, worker_group: Any, backend_config: Any) -> None:
        super().on_shutdown(worker_group, backend_config)
        ray.get(worker_group.execute_async(_leave))


@dataclass
class TorchConfig(RayTorchConfig):
    """Ray Train's ``TorchConfig`` with the ``tensorcomm`` backend, its workers joined through Ray.

    Args:
        init_method: as Ray's (``"env"`` or ``"tcp"``): how torch's own store is found.
        timeout_s: bounds every tensorcomm call, joining included.
    """

    backend: str = "tensorcomm"

    @property
    def backend_cls(self) -> type:
        return _TensorcommTorchBackend
