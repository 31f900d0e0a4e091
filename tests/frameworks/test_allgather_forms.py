"""Every allgather form of the torch backend gives Gloo's outputs, future values and ``result()``,
in and out of ``torch.inference_mode()``.

Each rank runs every form on a tensorcomm group and on a Gloo group of the same ranks, in one
process, and writes down what came back: the outputs, the future's value (lists of lists where
Gloo gives them) and ``Work.result()`` or the error it raises. The two records must be equal.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest

from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.multiprocess
torch = pytest.importorskip("torch")


def _record(value: Any) -> Any:
    """Tensors as (dtype, shape, values); lists as lists."""
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), list(value.shape), value.detach().flatten().tolist())
    if isinstance(value, (list, tuple)):
        return [_record(item) for item in value]
    return repr(value)


def _data(rank: int, n: int = 2) -> Any:
    return torch.arange(n, dtype=torch.float32) + 10 * rank


def _forms(pg: Any, rank: int, size: int) -> dict[str, Callable[[], tuple[Any, Any]]]:
    """Each form's call: returns its Work and its outputs."""
    import torch.distributed as dist

    def one() -> tuple[Any, Any]:
        outs = [[torch.zeros(2) for _ in range(size)]]
        return pg.allgather(outs, [_data(rank)]), outs

    def several() -> tuple[Any, Any]:
        outs = [[torch.zeros(2) for _ in range(size * 3)] for _ in range(3)]
        return pg.allgather(outs, [_data(rank) + 100 * i for i in range(3)]), outs

    def noncontiguous_inputs() -> tuple[Any, Any]:
        columns = torch.arange(12, dtype=torch.float32).reshape(4, 3) + 10 * rank
        outs = [[torch.zeros(4) for _ in range(size * 2)] for _ in range(2)]
        return pg.allgather(outs, [columns[:, 1], columns[:, 2]]), outs

    def noncontiguous_outputs() -> tuple[Any, Any]:
        outs = [[torch.zeros(4, 2)[:, 1] for _ in range(size)]]
        return pg.allgather(outs, [_data(rank, 4)]), outs

    def functional() -> tuple[Any, Any]:
        outs = [torch.zeros(2) for _ in range(size)]
        return dist.all_gather(outs, _data(rank), group=pg, async_op=True), outs

    def into_tensor() -> tuple[Any, Any]:
        out = torch.zeros(size * 2, 3)
        return dist.all_gather_into_tensor(out, _data(rank, 6).reshape(2, 3), group=pg, async_op=True), out

    def base() -> tuple[Any, Any]:
        out = torch.zeros(size * 2)
        return pg._allgather_base(out, _data(rank)), out

    def coalesced() -> tuple[Any, Any]:
        outs = [[torch.zeros(2), torch.zeros(3)] for _ in range(size)]
        return pg.allgather_coalesced(outs, [_data(rank), _data(rank, 3)]), outs

    def into_tensor_coalesced() -> tuple[Any, Any]:
        outs = [torch.zeros(size * 2), torch.zeros(size * 3)]
        return pg.allgather_into_tensor_coalesced(outs, [_data(rank), _data(rank, 3)]), outs

    return {f.__name__: f for f in (one, several, noncontiguous_inputs, noncontiguous_outputs,
                                    functional, into_tensor, base, coalesced, into_tensor_coalesced)}


def _run(pg: Any, form: Callable[[], tuple[Any, Any]]) -> dict[str, Any]:
    try:
        work, outs = form()
        work.wait()
        seen: dict[str, Any] = {"outputs": _record(outs), "future": _record(work.get_future().value())}
        try:
            seen["result"] = _record(work.result())
        except RuntimeError as exc:
            seen["result"] = f"RuntimeError: {exc}"[:60]
        return seen
    except Exception as exc:  # noqa: BLE001 (the error is the record)
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def _body() -> dict[str, dict[str, Any]]:
    import warnings

    import torch.distributed as dist

    import tensorcomm.torch  # noqa: F401 (registers the backend)

    warnings.simplefilter("ignore")  # torch's deprecation notes on result() and the *_into_tensor names
    dist.init_process_group(backend="tensorcomm", timeout=datetime.timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = {"tensorcomm": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    records: dict[str, dict[str, Any]] = {name: {} for name in groups}
    for name, pg in groups.items():
        for form_name, form in _forms(pg, rank, size).items():
            records[name][form_name] = _run(pg, form)
            with torch.inference_mode():
                records[name][f"{form_name} (inference mode)"] = _run(pg, form)
            dist.barrier()
    dist.destroy_process_group()
    return records


@pytest.mark.parametrize("world_size", [2, 3])
def test_allgather_forms_match_gloo(world_size: int) -> None:
    for rank, records in enumerate(run_ranks(_body, world_size, timeout=120, init=False)):
        for form, gloo in records["gloo"].items():
            assert "error" not in gloo, (rank, form, gloo)
            assert records["tensorcomm"][form] == gloo, (rank, form)
