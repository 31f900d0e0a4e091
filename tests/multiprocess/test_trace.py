"""Seeing what ran (issue 25): ``Work.algorithm``/``transport`` and ``Group.last_call`` name the
row that ran a call; ``TENSORCOMM_TRACE`` writes each rank's timeline and ``tensorcomm trace
merge`` joins them; the flight recorder holds each call's state and caller."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm import trace
from tensorcomm.algorithms import select
from tensorcomm.cli import main as cli_main
from tensorcomm.testing import run_ranks
from tensorcomm.trace import chrome, recorder

pytestmark = pytest.mark.spawns

TRANSPORTS = {"tcp": {"TENSORCOMM_TRANSPORT": "tcp"}, "shm": {}}


def body_what_ran() -> dict[str, Any]:
    x = np.ones(4, np.float32)
    tc.all_reduce(x)
    blocking = tc.WORLD.last_call
    work = tc.all_reduce(np.ones(1 << 18, np.float32), async_op=True)
    queued = [c.state for c in recorder.calls()][-1]  # may have started already on the worker
    work.wait()
    tc.broadcast(x, 0)
    last = tc.WORLD.last_call
    return {"blocking": tuple(blocking), "work": (work.algorithm, work.transport), "last": tuple(last),
            "queued": queued, "states": [c.state for c in recorder.calls()],
            "sites": [c.to_json()["site"] for c in recorder.calls()]}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("ranks", [2, 3])
def test_work_and_last_call_name_the_algorithm_and_transport(transport: str, ranks: int) -> None:
    results = run_ranks(body_what_ran, ranks, timeout=60, env=TRANSPORTS[transport])
    for result in results:
        for collective, key in [("all_reduce", "blocking"), ("broadcast", "last")]:
            name, algorithm, carrier, settled = result[key]
            assert name == collective and algorithm in select.names(collective), result
            assert settled == algorithm, result  # 16 B calls do not learn
            assert carrier == transport, result
        algorithm, carrier = result["work"]
        assert algorithm in select.names("all_reduce") and carrier == transport, result
        assert result["queued"] in ("issued", "started", "completed"), result
        assert result["states"][-3:] == ["completed"] * 3, result
        blocking_site, queued_site, last_site = result["sites"][-3:]
        assert blocking_site is None and last_site is None, result  # recorded only if they fail
        assert queued_site.split(" ")[0].endswith(".py:" + queued_site.split(":")[1].split(" ")[0]) \
            and "test_trace.py" in queued_site, result


def body_traced() -> list[str]:
    x = np.ones(4, np.float32)
    names = []
    for _ in range(3):
        tc.all_reduce(x)
        names.append(tc.WORLD.last_call.algorithm)
        tc.broadcast(x, 0)
        names.append(tc.WORLD.last_call.algorithm)
    return names


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("ranks", [2, 3])
def test_trace_env_writes_timelines_that_merge(tmp_path: Path, transport: str, ranks: int) -> None:
    env = {**TRANSPORTS[transport], "TENSORCOMM_TRACE": str(tmp_path)}
    algorithms = run_ranks(body_traced, ranks, timeout=60, env=env)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"rank{r}.trace.json" for r in range(ranks)]
    for rank in range(ranks):
        data = json.loads((tmp_path / f"rank{rank}.trace.json").read_text())  # closed by destroy()
        calls = [e for e in data["traceEvents"] if e.get("ph") == "X"]
        # the clock-sync barriers come first: they are calls like any other
        mine = [e for e in calls if e["name"] != "barrier"]
        assert [e["name"] for e in mine] == ["all_reduce", "broadcast"] * 3
        assert [e["args"]["algorithm"] for e in mine] == algorithms[rank]
        first = mine[0]["args"]
        assert first["bytes"] == 16 and first["dtype"] == "float32" and first["group"] == "world"
        assert first["transport"] == transport and first["state"] == "completed"
        seqs = [e["args"]["seq"] for e in calls]
        assert seqs == list(range(chrome.SYNC_ROUNDS, chrome.SYNC_ROUNDS + 6))
    assert cli_main(["trace", "merge", str(tmp_path)]) == 0
    merged = json.loads((tmp_path / "merged.trace.json").read_text())
    offsets = merged["otherData"]["clock_offsets_us"]
    assert sorted(offsets) == [str(r) for r in range(ranks)] and offsets["0"] == 0
    spans = [e for e in merged["traceEvents"] if e.get("ph") == "X"]
    assert {e["pid"] for e in spans} == set(range(ranks))
    assert len(spans) == ranks * len(calls)


def body_start_stop(directory: str) -> int:
    x = np.ones(2, np.float32)
    tc.all_reduce(x)  # before: not in the timeline
    trace.start(directory)
    tc.all_reduce(x)
    trace.stop()
    tc.all_reduce(x)  # after: not in it either
    return tc.get_rank()


def test_trace_start_and_stop(tmp_path: Path) -> None:
    run_ranks(body_start_stop, 2, str(tmp_path), timeout=60)
    for rank in range(2):
        data = json.loads((tmp_path / f"rank{rank}.trace.json").read_text())
        names = [e["name"] for e in data["traceEvents"] if e.get("ph") == "X"]
        assert names == ["all_reduce"]
        assert len(data["tensorcomm"]["clock_sync_ns"]) >= 3


def body_torch_site() -> list[str]:
    import torch
    import torch.distributed as dist

    import tensorcomm.torch  # noqa: F401 - registers the backend

    dist.init_process_group(backend="tensorcomm")
    recorder.configure(8, sites=True)
    dist.all_reduce(torch.ones(3))
    dist.barrier()
    sites = [c.to_json()["site"] for c in recorder.calls()[-2:]]
    dist.destroy_process_group()
    return sites


def test_the_recorded_site_of_a_torch_call_is_the_callers() -> None:
    pytest.importorskip("torch")
    for sites in run_ranks(body_torch_site, 2, timeout=90, init=False):
        lines = [int(site.split(" ")[0].rsplit(":", 1)[1]) for site in sites]
        assert all("test_trace.py" in site and "(body_torch_site)" in site for site in sites), sites
        assert lines[1] == lines[0] + 1, sites


def body_pair_row() -> tuple[str, str, int]:
    from tensorcomm.algorithms import allreduce

    ran = [0]
    exchange = allreduce._exchange  # a round of recursive doubling, which pair_in_place does not call

    def counted(*args: Any, **kwargs: Any) -> None:
        ran[0] += 1
        exchange(*args, **kwargs)

    allreduce._exchange = counted  # type: ignore[assignment]
    x = np.full(4, tc.get_rank() + 1.0, np.float32)
    work = tc.all_reduce(x, async_op=True)
    work.wait()
    assert (x == 3).all(), x
    return work.algorithm, tc.WORLD.last_call.algorithm, ran[0]


@pytest.mark.parametrize("override, expected, rounds", [
    ("", "pair_in_place", 0),
    ("all_reduce=recursive_doubling", "recursive_doubling", 1),
])
def test_the_algorithm_named_is_the_one_that_ran(override: str, expected: str, rounds: int) -> None:
    """Two members over TCP: ``pair_in_place`` is a row of its own, so what ``Work.algorithm`` and
    ``last_call`` name ran, and recursive doubling, when asked for, runs as itself."""
    env = {"TENSORCOMM_TRANSPORT": "tcp", **({"TENSORCOMM_ALGORITHMS": override} if override else {})}
    for result in run_ranks(body_pair_row, 2, timeout=60, env=env):
        assert result == (expected, expected, rounds), result
