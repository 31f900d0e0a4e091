"""torch.distributed's own clients on backend "tensorcomm", each compared with Gloo.

Every rank runs the same checks twice in one process, on tensorcomm and then on Gloo, from the
same seeds; the results must agree up to summation order. One launch per world size keeps the
framework tier short. Covered: the process group's name, description and device types; the
eight functional collectives; DeviceMesh and DTensor; tensor parallelism; FSDP2 (``fully_shard``);
legacy FSDP (FULL_SHARD, SHARD_GRAD_OP); DCP with FSDP2's and legacy FSDP's sharded state dicts;
``all_gather_coalesced``; the c10d ``ProcessGroup`` convenience overloads; reduce_scatter with
blocks of different sizes; DDP communication hooks (fp16 compression, PowerSGD), ``no_sync``,
``Join`` and ZeroRedundancyOptimizer (with ``overlap_with_ddp``, which torch refuses on Gloo).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import pytest

from tensorcomm.testing import run_ranks

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]  # margins for a loaded machine
torch = pytest.importorskip("torch")

# Gloo's process group can deadlock when freed while the GIL is held (pytorch/pytorch#56297), as
# freeing a DDP module does; rank processes end with os._exit, so what is kept here is never freed.
_KEEP: list[Any] = []


def _mlp(width: int = 16) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 4))


def _batches(rank: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    return [(torch.randn(8, 8, generator=data), torch.randn(8, 4, generator=data)) for _ in range(steps)]


def _loss(model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x), y)


def _trained(model: Any, rank: int) -> Any:
    """``model`` after three SGD steps on this rank's shard."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in _batches(rank, 3):
        _loss(model, x, y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


# -- the process group and the functional collectives -------------------------------------------

def _group(dist: Any, rank: int, size: int) -> Any:
    pg = dist.group.WORLD
    return [pg.group_name, pg.group_desc, "cpu" in [d.type for d in pg._device_types]]


def _functional(dist: Any, rank: int, size: int) -> Any:
    import torch.distributed._functional_collectives as fc

    pg = dist.group.WORLD
    x = torch.randn(size * 2, size * 3, generator=torch.Generator().manual_seed(rank))
    return [fc.all_reduce(x, "sum", pg), fc.broadcast(x, 0, pg), fc.all_gather_tensor(x, 0, pg),
            fc.reduce_scatter_tensor(x, "sum", 0, pg), *fc.all_reduce_coalesced([x, 2 * x], "avg", pg),
            *fc.all_gather_into_tensor_coalesced([x, 2 * x], pg),
            *fc.reduce_scatter_tensor_coalesced([x, 2 * x], "sum", [0, 1], pg),
            fc.all_to_all_single(x, None, None, pg)]


# -- DeviceMesh, DTensor, tensor parallelism, FSDP2, DCP ----------------------------------------

def _dtensor(dist: Any, rank: int, size: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (size,))
    torch.manual_seed(0)
    a, b = torch.randn(size * 2, 5), torch.randn(5, 3)
    product = distribute_tensor(a, mesh, [Shard(0)]) @ distribute_tensor(b, mesh, [Replicate()])
    moved = distribute_tensor(a, mesh, [Shard(1)]).redistribute(mesh, [Shard(0)])
    return [product.full_tensor(), moved.to_local(), moved.full_tensor()]


def _tensor_parallel(dist: Any, rank: int, size: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = _mlp(4 * size)
    parallelize_module(model, init_device_mesh("cpu", (size,)),
                       {"0": ColwiseParallel(), "2": RowwiseParallel()})
    out = model(torch.randn(6, 8, generator=torch.Generator().manual_seed(1)))
    out.sum().backward()
    return [out.detach(), *(p.grad.full_tensor() for p in model.parameters())]


def _fsdp2_model(dist: Any, rank: int) -> Any:
    from torch.distributed.fsdp import fully_shard

    model = _mlp()
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    return _trained(model, rank)


def _fsdp2(dist: Any, rank: int, size: int) -> Any:
    return [p.full_tensor() for p in _fsdp2_model(dist, rank).parameters()]


def _dcp_roundtrip(state: Any, path: str, clear: Callable[[], None]) -> Any:
    import torch.distributed.checkpoint as dcp

    dcp.save(state(), checkpoint_id=path)
    clear()
    restored = state()
    dcp.load(restored, checkpoint_id=path)
    return restored


def _dcp_fsdp2(dist: Any, rank: int, size: int, path: str) -> Any:
    model = _fsdp2_model(dist, rank)

    def clear() -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()

    model.load_state_dict(_dcp_roundtrip(model.state_dict, path, clear))
    return [p.full_tensor() for p in model.parameters()]


def _fsdp1_model(dist: Any, rank: int, strategy: str) -> Any:
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    model = FullyShardedDataParallel(_mlp(), sharding_strategy=getattr(ShardingStrategy, strategy),
                                     use_orig_params=True, device_id=torch.device("cpu"))
    _KEEP.append(model)
    return _trained(model, rank)


def _full_params(model: Any) -> list[torch.Tensor]:
    from torch.distributed.fsdp import FullyShardedDataParallel

    with FullyShardedDataParallel.summon_full_params(model):
        return [p.detach().clone() for p in model.parameters()]


def _fsdp1(strategy: str) -> Callable[..., Any]:
    def check(dist: Any, rank: int, size: int) -> Any:
        return _full_params(_fsdp1_model(dist, rank, strategy))
    return check


def _dcp_fsdp1_sharded(dist: Any, rank: int, size: int, path: str) -> Any:
    from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType

    model = _fsdp1_model(dist, rank, "FULL_SHARD")

    def clear() -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()

    with FullyShardedDataParallel.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        model.load_state_dict(_dcp_roundtrip(model.state_dict, path, clear))
    return _full_params(model)


# -- c10d calls ---------------------------------------------------------------------------------

def _all_gather_coalesced(dist: Any, rank: int, size: int) -> Any:
    results = []
    for count in (size, size + 1):  # as many tensors as ranks once: the transposition shows there
        inputs = [torch.arange(i + 2.0) + 10 * rank for i in range(count)]
        outputs = [[torch.zeros(i + 2) for i in range(count)] for _ in range(size)]
        dist.all_gather_coalesced(outputs, inputs)
        results += [t for per_rank in outputs for t in per_rank]
    return results


def _overloads(dist: Any, rank: int, size: int) -> Any:
    pg = dist.group.WORLD
    mine = torch.arange(3.0) + rank + 1
    summed, top, cast, reduced = mine.clone(), mine.clone(), mine.clone(), mine.clone()
    pg.allreduce(summed).wait()
    pg.allreduce([top], dist.ReduceOp.MAX).wait()
    pg.broadcast(cast, root=size - 1).wait()
    pg.reduce(reduced, 0, dist.ReduceOp.SUM).wait()
    everyone = [torch.zeros(3) for _ in range(size)]
    pg.allgather(everyone, mine).wait()
    gathered = [torch.zeros(3) for _ in range(size)] if rank == 0 else []
    pg.gather(gathered, mine, 0).wait()
    scattered = torch.zeros(3)
    pg.scatter(scattered, [mine * (r + 1) for r in range(size)] if rank == 0 else [], 0).wait()
    block = torch.zeros(3)
    pg.reduce_scatter(block, [mine * (r + 1) for r in range(size)]).wait()
    exchanged = [torch.zeros(3) for _ in range(size)]
    pg.alltoall(exchanged, [mine + 10 * r for r in range(size)]).wait()
    pg.barrier().wait()
    return [summed, top, cast, reduced if rank == 0 else mine, *everyone, *gathered, scattered,
            block, *exchanged]


def _reduce_scatter_uneven(dist: Any, rank: int, size: int) -> Any:
    output = torch.zeros(rank + 1, 2)  # rank r's block has r + 1 rows
    dist.reduce_scatter(output, [torch.full((r + 1, 2), rank + 1.0) + r for r in range(size)])
    return [output]


# -- DDP hooks, Join, ZeRO -----------------------------------------------------------------------

def _ddp_train(dist: Any, rank: int, hook: str, backend: str) -> list[torch.Tensor]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.distributed.algorithms.join import Join
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    model = _mlp(32)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.001 if hook == "powersgd_buckets" else 25)
    _KEEP.append(ddp)
    steps = 6
    optimizer: Any = torch.optim.SGD(ddp.parameters(), lr=0.05)
    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook.startswith("powersgd"):
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2, min_compression_rate=0.5)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif hook == "zero_overlap" and backend == "tensorcomm":
        from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step

        optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, lr=0.05,
                                            overlap_with_ddp=True)
        ddp.register_comm_hook(None, hook_with_zero_step(default_hooks.allreduce_hook, ddp, optimizer))
        steps += 2  # its first two iterations set up and update nothing
    elif hook.startswith("zero"):  # Gloo's reference for zero_overlap: the same updates, after backward
        optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, lr=0.05)
    batches = _batches(rank, steps)
    if hook.startswith("zero"):
        batches = [batches[0]] * steps  # the set-up iterations must not shift the data
    for step, (x, y) in enumerate(batches):
        if hook == "no_sync" and step % 2 == 0:
            with ddp.no_sync():  # accumulate locally; the next backward reduces both
                _loss(ddp, x, y).backward()
            continue
        _loss(ddp, x, y).backward()
        if not (hook == "zero_overlap" and backend == "tensorcomm"):
            optimizer.step()
        optimizer.zero_grad()
    if hook == "join":  # uneven inputs: rank r trains r more steps than rank 0
        with Join([ddp]):
            for x, y in _batches(rank + 50, 2 + rank):
                _loss(ddp, x, y).backward()
                optimizer.step()
                optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _ddp_hook(hook: str) -> Callable[..., Any]:
    def check(dist: Any, rank: int, size: int) -> Any:
        return _ddp_train(dist, rank, hook, dist.get_backend())
    return check


CHECKS: dict[str, Callable[..., Any]] = {
    "group": _group, "functional collectives": _functional, "DTensor": _dtensor,
    "tensor parallel": _tensor_parallel, "FSDP2": _fsdp2, "FSDP FULL_SHARD": _fsdp1("FULL_SHARD"),
    "FSDP SHARD_GRAD_OP": _fsdp1("SHARD_GRAD_OP"), "all_gather_coalesced": _all_gather_coalesced,
    "c10d overloads": _overloads, "reduce_scatter uneven": _reduce_scatter_uneven,
    "DDP fp16_compress_hook": _ddp_hook("fp16"), "DDP PowerSGD": _ddp_hook("powersgd"),
    "DDP no_sync": _ddp_hook("no_sync"), "DDP Join": _ddp_hook("join"),
    "ZeroRedundancyOptimizer": _ddp_hook("zero"), "ZeRO overlap_with_ddp": _ddp_hook("zero_overlap"),
}


def _plain(result: Any) -> Any:
    """Plain tensors (functional collectives return wrappers that wait when used)."""
    if isinstance(result, list):
        return [_plain(item) for item in result]
    if isinstance(result, torch.Tensor):
        return torch.Tensor(result.detach().clone()) if type(result) is not torch.Tensor else result.detach()
    return result


def _run_all(directory: str) -> dict[str, dict[str, Any]]:
    import torch.distributed as dist

    import tensorcomm.torch  # noqa: F401  (registers the backend)

    results: dict[str, dict[str, Any]] = {}
    for backend in ("tensorcomm", "gloo"):
        dist.init_process_group(backend=backend)
        rank, size = dist.get_rank(), dist.get_world_size()
        checks = dict(CHECKS)
        checks["DCP FSDP2"] = functools.partial(_dcp_fsdp2, path=os.path.join(directory, backend, "fsdp2"))
        if size == 2:  # at 3 ranks torch's ShardedTensor asks CUDA for the device of a rank with
            # no shard, except on Gloo, which it names (docs/frameworks.md)
            checks["DCP FSDP SHARDED_STATE_DICT"] = functools.partial(
                _dcp_fsdp1_sharded, path=os.path.join(directory, backend, "fsdp1"))
        if backend == "tensorcomm":  # Gloo can hang here: hooks issue calls from its threads
            checks["DDP PowerSGD, one bucket per parameter"] = _ddp_hook("powersgd_buckets")
        results[backend] = {name: _plain(check(dist, rank, size)) for name, check in checks.items()}
        dist.barrier()
        dist.destroy_process_group()
    return results


@pytest.mark.parametrize("world_size", [2, 3])
def test_torch_clients_on_tensorcomm_match_gloo(world_size: int, tmp_path: Any) -> None:
    per_rank = run_ranks(_run_all, world_size, str(tmp_path), timeout=240, init=False)
    for rank, results in enumerate(per_rank):
        ours, gloo = results["tensorcomm"], results["gloo"]
        assert ours["group"][2], "the tensorcomm process group reports no cpu device"
        for name, expected in gloo.items():
            got = ours[name]
            if name == "group":
                assert got[:2] == expected[:2], (rank, got, expected)
                continue
            assert len(got) == len(expected), (name, rank)
            # float16 sums: tensorcomm accumulates in float32 and rounds once, Gloo rounds each step
            rtol, atol = (1e-3, 1e-5) if "fp16" in name else (1e-5, 1e-6)
            for index, (a, b) in enumerate(zip(got, expected, strict=True)):
                where = f"{name}, rank {rank}, tensor {index}"
                torch.testing.assert_close(a, b, rtol=rtol, atol=atol,
                                           msg=lambda m, where=where: f"{where}: {m}")
        # Many buckets whose hooks issue further calls: every rank ends with the same model.
        for a, b in zip(ours["DDP PowerSGD, one bucket per parameter"],
                        per_rank[0]["tensorcomm"]["DDP PowerSGD, one bucket per parameter"], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
