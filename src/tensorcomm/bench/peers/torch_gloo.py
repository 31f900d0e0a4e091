"""torch.distributed with the Gloo backend (TCP) as a benchmark peer.

Ranks are started by ``tensorcomm run`` (it writes torchrun's RANK/WORLD_SIZE); Gloo then meets at
its own ``tcp://127.0.0.1:PORT`` store, because the launcher's store speaks tensorcomm's protocol.
``GLOO_SOCKET_IFNAME=lo`` keeps Gloo's own connections on loopback (by default it resolves the
hostname, which may name an external interface). Tensors wrap the numpy buffers without copying.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ...testing import free_port
from ..check import ROOT
from ..timing import Case
from . import LOOPBACK, Command
from .base import ArrayCase, Peer, Task, ping_pong, require


def commands(ranks: int, worker: list[str], env: dict[str, str]) -> list[Command]:
    """One ``tensorcomm run -n ranks`` launcher; Gloo meets at a free loopback port."""
    init = f"tcp://{LOOPBACK}:{free_port()}"
    return [Command([sys.executable, "-m", "tensorcomm", "run", "-n", str(ranks), "-m",
                     *worker[2:], "--init-method", init], {**env, "GLOO_SOCKET_IFNAME": "lo"})]


class GlooPeer(Peer):
    """torch.distributed's Gloo process group."""

    name = "gloo"

    def __init__(self, init_method: str) -> None:
        import torch
        import torch.distributed as dist

        from tensorcomm.rendezvous.discovery import discover

        info = discover()  # the launcher's RANK / WORLD_SIZE
        if info.rank is None or info.world_size is None:
            raise RuntimeError("gloo peer: RANK and WORLD_SIZE are not set; run it under the bench "
                               "launcher")
        dist.init_process_group("gloo", init_method=init_method, rank=info.rank,
                                world_size=info.world_size)
        self.torch, self.dist = torch, dist
        self.version = f"torch {torch.__version__} (gloo)"
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        ops = dist.ReduceOp
        self.ops = {"sum": ops.SUM, "prod": ops.PRODUCT, "min": ops.MIN, "max": ops.MAX,
                    "avg": ops.AVG}

    def _tensor(self, array: np.ndarray) -> Any:
        if array.dtype.name == "bfloat16":  # ml_dtypes' bfloat16 has the same bits as torch's
            return self.torch.from_numpy(array.view(np.int16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(array)

    def case(self, task: Task) -> Case:
        dist = self.dist
        require(task.op != "avg" or task.dtype.startswith(("float", "bfloat")),
                "gloo: avg is for floating-point dtypes")
        case = ArrayCase(task, self.size, self.rank)
        x = self._tensor(case.input)
        out = None if case.output is None else self._tensor(case.output)
        op = self.ops[task.op]
        # torch 2.13 renamed the *_tensor collectives to *_single; older versions have only these.
        gather_into = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
        reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        root = self.rank == ROOT
        calls: dict[str, Callable[[], Any]] = {
            "all_reduce": lambda: dist.all_reduce(x, op),
            "broadcast": lambda: dist.broadcast(x, ROOT),
            "reduce": lambda: dist.reduce(x, ROOT, op),
            "all_gather": lambda: gather_into(out, x),
            "reduce_scatter": lambda: reduce_scatter(out, x, op),
            "all_to_all": lambda: dist.all_to_all_single(out, x),
        }
        if task.collective == "gather":
            pieces = list(out.reshape(self.size, -1)) if root and out is not None else None
            calls["gather"] = lambda: dist.gather(x, pieces, ROOT)
        if task.collective == "scatter":
            pieces = list(x.reshape(self.size, -1)) if root else None
            calls["scatter"] = lambda: dist.scatter(out, pieces, ROOT)
        if task.collective == "send_recv":
            calls["send_recv"] = ping_pong(self.rank, self.size, lambda peer: dist.send(x, peer),
                                           lambda peer: dist.recv(x, peer))
        case.run = calls[task.collective]
        return case

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self) -> None:
        self.dist.destroy_process_group()


def open(init_method: str | None = None) -> GlooPeer:  # noqa: A001 - the peer contract
    """Join the Gloo group at ``init_method`` (``tcp://127.0.0.1:PORT``)."""
    if init_method is None:
        raise ValueError("gloo: the worker needs --init-method tcp://127.0.0.1:PORT")
    return GlooPeer(init_method)
