"""The copy bound printed under the bench's table (``tensorcomm.bench.bound``)."""

from __future__ import annotations

import mmap
import multiprocessing
import os

import numpy as np
import pytest

from tensorcomm import cli
from tensorcomm.bench import bound, options, runner
from tensorcomm.bench.peers.base import Task
from tensorcomm.bench.results import Row
from tensorcomm.transports.shm import cma


def _row(collective: str, size: int, library: str = "tensorcomm", time_us: float = 100.0) -> Row:
    return Row(collective, library, 2, size, size // 4, "float32", "sum", time_us, time_us, time_us,
               1.0, 1.0, 0, 10)


def test_the_bound_is_the_cheapest_design_timed():
    timed = {"slots": 30.0, "cma": 20.0, "shared": 5.0}
    assert bound.bound_us(timed) == 20.0
    assert bound.bound_us({"slots": 30.0}) == 30.0  # no direct reads on this host
    assert bound.bound_us(timed, shared=True) == 5.0
    assert bound.bound_us({"slots": 30.0}, shared=True) is None
    assert bound.bound_us({}) is None


def test_summary_prints_time_over_bound_for_tensorcomm_rows_only(monkeypatch):
    asked = []

    def measure(collectives, sizes, ranks, shared):
        asked.append((list(collectives), list(sizes), ranks, shared))
        return {("broadcast", 1000): {"slots": 4.0, "cma": 1.0}}

    monkeypatch.setattr(bound, "measure", measure)
    rows = [_row("broadcast", 1000, time_us=2.0), _row("broadcast", 1000, "mpi"), _row("reduce", 1000)]
    lines = bound.summary(rows, 2)
    assert asked == [(["broadcast"], [1000], 2, False)]
    assert len(lines) == 4 and lines[-1].split()[:4] == ["broadcast", "1000", "4.0", "1.0"]
    assert lines[-1].endswith("2.00x")  # 2 us over the cheaper design's 1 us
    assert bound.summary([_row("reduce", 1000)], 2) == []


def test_a_bound_timed_beside_the_rows_is_the_median_of_its_rounds(monkeypatch):
    timings = iter([{"slots": 10.0, "cma": 50.0}, {"slots": 30.0, "cma": 20.0}, {"slots": 20.0, "cma": 40.0}])
    asked = []

    def measure(collectives, sizes, ranks, shared):
        asked.append((list(collectives), list(sizes), ranks, shared))
        return {(collectives[0], sizes[0]): next(timings)}

    monkeypatch.setattr(bound, "measure", measure)
    beside = bound.Beside(2)
    for _ in range(3):
        beside(Task("broadcast", 250, "float32", "sum"))
    assert asked == [(["broadcast"], [1000], 2, False)] * 3
    assert beside.found() == {("broadcast", 1000): {"slots": 20.0, "cma": 40.0}}
    monkeypatch.setattr(bound, "measure", lambda *a: pytest.fail("timed again after the sweep"))
    lines = bound.summary([_row("broadcast", 1000, time_us=30.0)], 2, found=beside.found())
    assert "median over the rounds" in lines[1] and lines[-1].endswith("1.50x")  # 30 over 20


def test_a_bound_worker_that_fails_stops_the_timing_not_the_sweep(monkeypatch):
    calls = []

    def measure(collectives, sizes, ranks, shared):
        calls.append(sizes[0])
        if len(calls) == 2:
            raise OSError(12, "Cannot allocate memory")
        return {(collectives[0], sizes[0]): {"slots": 10.0}}

    monkeypatch.setattr(bound, "measure", measure)
    beside = bound.Beside(2)
    for count in (256, 512, 1024):
        beside(Task("all_gather", count, "float32", "sum"))
    assert calls == [1024, 2048] and beside.found() == {("all_gather", 1024): {"slots": 10.0}}
    assert beside.error is not None and "all_gather 2048 B" in beside.error and "allocate" in beside.error


def test_the_sweep_times_the_bound_after_the_libraries_in_every_round():
    order = []

    def run(name):
        def one(task):
            order.append((name, task.count))
            return {"done": {"batch_times": [1e-5], "wrong": 0, "iters": 1}}
        return one

    opts = options.from_args(cli.build_parser().parse_args(
        ["bench", "broadcast", "-b", "1K", "-e", "2K", "-f", "2", "--rounds", "2"]))
    runner.sweep(opts, 2, {"tensorcomm": run("tensorcomm"), "mpi": run("mpi")}, print,
                 lambda step: None, lambda rows: None, lambda task: order.append(("bound", task.count)))
    assert order == [("tensorcomm", 256), ("mpi", 256), ("bound", 256), ("mpi", 256), ("tensorcomm", 256),
                     ("bound", 256), ("tensorcomm", 512), ("mpi", 512), ("bound", 512), ("mpi", 512),
                     ("tensorcomm", 512), ("bound", 512)]


def _designs_of(collective: str, ranks: int, shared: bool, cma_ok: bool) -> dict[str, list]:
    size = 1 << 12
    region = mmap.mmap(-1, ranks * size * (4 if shared else 2))
    book = np.zeros(3 * ranks, np.int64)
    k = bound._Rank(0, ranks, size, region, book, shared)
    a = np.zeros(size, np.uint8)
    return bound._designs(k, collective, (a, np.zeros(size, np.uint8)), cma_ok)


@pytest.mark.parametrize("collective", bound.COLLECTIVES)
def test_every_collective_has_each_design_where_the_host_allows_it(collective):
    assert sorted(_designs_of(collective, 2, shared=True, cma_ok=True)) == ["cma", "shared", "slots"]
    assert sorted(_designs_of(collective, 3, shared=False, cma_ok=False)) == ["slots"]


def test_phases_follow_the_waits_of_each_design():
    # through the slots a reduction publishes, reduces, and (all_reduce) copies the parts out
    assert len(_designs_of("all_reduce", 2, False, True)["slots"]) == 3
    assert len(_designs_of("all_reduce", 2, False, True)["cma"]) == 2
    assert len(_designs_of("reduce_scatter", 2, False, True)["slots"]) == 2
    assert len(_designs_of("reduce_scatter", 2, False, True)["cma"]) == 1
    assert len(_designs_of("broadcast", 2, True, True)["slots"]) == 1  # root and receivers at once


@pytest.mark.spawns
@pytest.mark.parametrize("shared", [False, True])
def test_measure_times_every_design_in_every_process_at_once(shared):
    found = bound.measure(["all_gather", "all_reduce", "reduce"], [1 << 12, 3 << 12], 2, shared)
    assert sorted(found) == [("all_gather", 1 << 12), ("all_gather", 3 << 12),
                             ("all_reduce", 1 << 12), ("all_reduce", 3 << 12)]
    expected = {"slots"} | ({"cma"} if cma.available() else set()) | ({"shared"} if shared else set())
    for times in found.values():
        assert set(times) <= expected and "slots" in times and (shared <= ("shared" in times))
        assert all(us > 0 for us in times.values())


@pytest.mark.spawns
def test_sizes_below_a_cache_line_per_process_get_no_bound():
    # 8 B and 100 B cannot be cut into blocks of whole cache lines: no design is timed for them
    found = bound.measure(["all_gather", "all_to_all"], [8, 100, 1 << 12], 2)
    assert sorted(found) == [("all_gather", 1 << 12), ("all_to_all", 1 << 12)]


@pytest.mark.spawns
def test_a_worker_that_dies_is_an_error_not_a_hang():
    context = multiprocessing.get_context("fork")
    worker = context.Process(target=os._exit, args=(3,))
    worker.start()
    worker.join()
    with pytest.raises(RuntimeError, match="exit code 3"):
        bound._result(context.Queue(), [worker])


def test_the_sweep_times_no_bound_for_a_call_tensorcomm_did_not_run():
    timed = []
    opts = options.from_args(cli.build_parser().parse_args(["bench", "broadcast", "-b", "1K", "-e", "1K"]))
    unsupported = {"tensorcomm": lambda task: {"unsupported": "not here"}}
    runner.sweep(opts, 2, unsupported, print, lambda step: None, lambda rows: None, timed.append)
    assert timed == []
