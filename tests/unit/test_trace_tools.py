"""The flight recorder's ring, its dumps and signal handler, and the merge and analyze tools on
files made here (the multi-process jobs are in tests/fault/test_flight_recorder.py and
tests/multiprocess/test_trace.py)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tensorcomm.rendezvous.discovery import trace_settings
from tensorcomm.signature import signature
from tensorcomm.trace import recorder
from tensorcomm.trace.analyze import find
from tensorcomm.trace.merge import merge
from tensorcomm.transports.threads import mark_worker

TEAM = SimpleNamespace(shm=None, hier=None, transport=object(), group_name="world", group_id=0,
                       ranks=(0, 1), rank=0)
PLAN = SimpleNamespace(label="all_reduce on group 'world'", algorithm="ring",
                       signature=signature("all_reduce", np.dtype(np.float32), 4))


@pytest.fixture(autouse=True)
def fresh_recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(recorder, "_failure_dumped", -recorder.FAILURE_DUMP_INTERVAL)
    recorder.configure(8, str(tmp_path))
    recorder.joined(0, 2)
    yield
    recorder.configure(0)
    recorder.joined(None, None)


def test_the_ring_keeps_the_last_calls_and_ignores_stale_ones() -> None:
    recorder.configure(3, sites=True)
    first = recorder.issue(TEAM, PLAN, 0)
    indexes = [recorder.issue(TEAM, PLAN, seq) for seq in range(1, 5)]
    recorder.end(first)  # overwritten since: dropped
    for index in indexes:
        recorder.end(index)
    kept = recorder.calls()
    assert [c.seq for c in kept] == [2, 3, 4]
    assert all(c.state == "completed" for c in kept)
    assert kept[-1].to_json()["site"].split(" ")[0].endswith(f"test_trace_tools.py:{_line('indexes = [')}")
    recorder.configure(3)  # by default a call that starts at once records no site
    recorder.done(recorder.begin(TEAM, PLAN, 5))
    assert recorder.calls()[-1].to_json()["site"] is None
    assert recorder.calls()[-1].state == "completed" and recorder.calls()[-1].seq == 5
    recorder.configure(3, sites=True)
    recorder.done(recorder.begin(TEAM, PLAN, 6))  # with sites
    assert recorder.calls()[-1].to_json()["site"].split(" ")[0].endswith(
        f"test_trace_tools.py:{_line('recorder.done(recorder.begin(TEAM, PLAN, 6))  # with sites')}")


def _inside(monkeypatch: pytest.MonkeyPatch, *functions: Any) -> None:
    """Count ``functions`` as tensorcomm's own frames (they stand for the group's call)."""
    for function in functions:
        monkeypatch.setitem(recorder._internal, function.__code__, True)


def test_a_blocking_call_that_fails_is_recorded_with_its_callers_site(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def call() -> None:  # stands for core.group._call: the call fails with what it raises
        index = recorder.begin(TEAM, PLAN, 0)
        recorder.end(index, RuntimeError("the peer left"))

    recorder.configure(3, str(tmp_path))
    _inside(monkeypatch, call)
    call()  # the failing call's caller
    entry = json.loads((tmp_path / "rank0.json").read_text())["calls"][-1]
    assert entry["state"] == "failed" and entry["error"] == "RuntimeError: the peer left"
    assert entry["site"].split(" ")[0].endswith(f"test_trace_tools.py:{_line('call()  # the failing call')}")


def test_a_call_that_fails_on_an_engine_worker_has_no_site(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker runs queued calls: no caller of the call is on its stack (threading's are)."""
    def worker() -> None:
        mark_worker()
        recorder.end(recorder.begin(TEAM, PLAN, 0), RuntimeError("the peer left"))

    recorder.configure(3, str(tmp_path))
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    entry = json.loads((tmp_path / "rank0.json").read_text())["calls"][-1]
    assert entry["state"] == "failed" and entry["site"] is None


def test_a_queued_call_goes_from_issued_to_started() -> None:
    index = recorder.issue(TEAM, PLAN)
    assert recorder.calls()[-1].to_json()["state"] == "issued"
    assert recorder.calls()[-1].to_json()["started_ns"] is None
    recorder.started(index, 7, PLAN)
    entry = recorder.calls()[-1].to_json()
    assert entry["state"] == "started" and entry["seq"] == 7 and entry["ended_ns"] is None


def test_zero_calls_records_nothing(tmp_path: Path) -> None:
    recorder.configure(0, str(tmp_path))
    assert recorder.issue(TEAM, PLAN, 0) == -1
    recorder.end(-1, RuntimeError("x"))
    assert recorder.calls() == [] and recorder.dump("why") is None
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="calls must be an int >= 0, got -1"):
        recorder.configure(-1)


def test_a_failed_call_dumps_the_ring(tmp_path: Path) -> None:
    recorder.end(recorder.issue(TEAM, PLAN, 0))
    recorder.end(recorder.issue(TEAM, PLAN, 1), TimeoutError("peer 1 did not answer"))
    record = json.loads((tmp_path / "rank0.json").read_text())
    assert record["rank"] == 0 and record["world_size"] == 2
    assert [c["state"] for c in record["calls"]] == ["completed", "failed"]
    assert record["calls"][1]["error"] == "TimeoutError: peer 1 did not answer"
    assert record["calls"][1]["call"] == "all_reduce(float32[4])"
    assert "failed" in record["dumps"][-1]["reason"]
    # a cascade of failures right after it does not rewrite the file
    recorder.end(recorder.issue(TEAM, PLAN, 2), TimeoutError("again"))
    assert len(json.loads((tmp_path / "rank0.json").read_text())["calls"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json"]  # no temporary file left


def test_sigusr1_dumps_unless_the_application_handles_it(tmp_path: Path) -> None:
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        assert recorder.install_signal_handler() is False
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        assert recorder.install_signal_handler() is True
        recorder.end(recorder.issue(TEAM, PLAN, 0))
        os.kill(os.getpid(), signal.SIGUSR1)
        record = json.loads((tmp_path / "rank0.json").read_text())
        assert record["dumps"][-1]["reason"] == "signal SIGUSR1" and len(record["calls"]) == 1
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_trace_settings() -> None:
    assert trace_settings({}) == (None, 2000, None)
    assert trace_settings({"TENSORCOMM_TRACE": "/t", "TENSORCOMM_FLIGHT_CALLS": "0",
                           "TENSORCOMM_FLIGHT_DIR": "/f"}) == ("/t", 0, "/f")
    with pytest.raises(ValueError, match="TENSORCOMM_FLIGHT_CALLS='-3'"):
        trace_settings({"TENSORCOMM_FLIGHT_CALLS": "-3"})


def _timeline(rank: int, stamps: list[int], events: list[dict[str, Any]], cut: bool) -> str:
    head = json.dumps({"format": "tensorcomm-trace-1", "rank": rank, "clock_sync_ns": stamps})
    body = "".join(json.dumps(e) + ",\n" for e in events)
    end = "" if cut else '{"ph": "i", "ts": 1}\n]}\n'
    return '{"tensorcomm": ' + head + ',\n"traceEvents": [\n' + body + end


def test_merge_lines_the_clocks_up_and_reads_a_file_cut_short(tmp_path: Path) -> None:
    span = {"name": "all_reduce", "ph": "X", "pid": 0, "tid": 0, "ts": 2000.0, "dur": 5.0}
    (tmp_path / "rank0.trace.json").write_text(_timeline(0, [1_000_000, 2_000_000], [span], cut=False))
    # rank 1's clock is 3 ms ahead; its file ends mid-way (the rank died)
    (tmp_path / "rank1.trace.json").write_text(
        _timeline(1, [4_000_000, 5_000_000], [{**span, "pid": 1, "ts": 5000.0}], cut=True) + '{"na')
    path, offsets = merge(tmp_path)
    assert offsets == {0: 0.0, 1: 3000.0}
    spans = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e["ph"] == "X"]
    assert [(e["pid"], e["ts"]) for e in spans] == [(0, 1000.0), (1, 1000.0)]


def _call(seq: int, call: str, line: int, state: str = "completed", ended: int = 0) -> dict[str, Any]:
    return {"seq": seq, "group": "world", "ranks": [0, 1], "call": call, "collective": call.split("(")[0],
            "site": f"/job/train.py:{line} (step)", "state": state, "started_ns": ended - 1,
            "ended_ns": ended, "error": "CollectiveMismatchError: ..." if state == "failed" else None}


def test_analyze_finds_which_of_two_ranks_broke_its_pattern() -> None:
    pattern = [_call(0, "a()", 10), _call(1, "b()", 11), _call(2, "a()", 10)]
    records = {0: {"world_size": 2, "calls": [*pattern, _call(3, "b()", 11, "failed", 5)]},
               1: {"world_size": 2, "calls": [*pattern, _call(3, "a()", 10, "failed", 6)]}}
    findings = find(records)
    assert findings.diverged == [1]
    assert "rank 1 called a() at train.py:10, where rank 0 called b() at train.py:11" in findings.paragraph()
    assert "The first call to fail was rank 0's b() at step 3" in findings.paragraph()


def test_analyze_says_when_nothing_went_wrong() -> None:
    calls = [_call(0, "a()", 10)]
    text = find({0: {"world_size": 2, "calls": calls}, 1: {"world_size": 2, "calls": calls}}).paragraph()
    assert text == ("2 of 2 ranks left a flight record (ranks 0 and 1). No call failed and every "
                    "rank reached the same step on every group.")


def _line(start: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip().startswith(start))


def test_a_sigusr1_dump_gives_the_call_in_flight_its_callers_site(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the interrupted thread's call gets the site: another thread's call in flight keeps
    none (its caller is not on this stack)."""
    def call() -> None:  # stands for core.group._call
        recorder.begin(TEAM, PLAN, 1)
        algorithm()

    def algorithm() -> None:  # interrupted by SIGUSR1
        recorder._on_signal(signal.SIGUSR1, sys._getframe())

    elsewhere = threading.Thread(target=recorder.begin, args=(TEAM, PLAN, 0))
    elsewhere.start()
    elsewhere.join()
    _inside(monkeypatch, call, algorithm)
    call()  # the caller
    record = json.loads((tmp_path / "rank0.json").read_text())
    assert [c["state"] for c in record["calls"]] == ["started", "started"]
    assert record["calls"][0]["site"] is None
    site = record["calls"][1]["site"]
    assert site.endswith("(test_a_sigusr1_dump_gives_the_call_in_flight_its_callers_site)"), site
    assert site.split(" ")[0].endswith(f"test_trace_tools.py:{_line('call()  # the caller')}"), site
