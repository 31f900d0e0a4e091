"""The engine in one process: issue order, sequence numbers, the inline path, the queue, errors,
stop, and calls from two threads at once. Every call is ``call(seq, *args)``."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tensorcomm.core.engine import Engine
from tensorcomm.core.work import Work
from tensorcomm.errors import ConcurrentUseError, GroupAbortedError


def _record(log: list[tuple[str, int]]) -> Any:
    def call(seq: int, name: str) -> str:
        log.append((name, seq))
        return name
    return call


def test_blocking_calls_run_inline_with_consecutive_sequence_numbers() -> None:
    engine = Engine("inline")
    log: list[tuple[str, int]] = []
    me = threading.get_ident()
    assert engine.submit("a", _record(log), False, "a") == "a"
    assert engine.submit("b", lambda seq, _: (seq, threading.get_ident()), False) == (1, me)
    assert engine.submit("c", _record(log), False, "c") == "c"
    assert log == [("a", 0), ("c", 2)]
    assert engine._worker is None  # nothing queued: no thread was started
    engine.stop(RuntimeError("done"))


def test_a_blocking_call_after_queued_ones_runs_once_in_order_with_the_next_number() -> None:
    engine = Engine("queued")
    engine._ensure_worker = lambda: None  # type: ignore[method-assign]  # no worker: the waiter runs them
    log: list[tuple[str, int]] = []
    runs: list[int] = []

    def counted(seq: int, _: object) -> int:
        runs.append(seq)
        return seq

    first = engine.submit("first", _record(log), True, "first")
    second = engine.submit("second", _record(log), True, "second")
    assert isinstance(first, Work) and not first.is_completed()
    assert engine.submit("blocking", counted, False) == 2  # queued behind both, run here
    assert runs == [2]  # once
    assert log == [("first", 0), ("second", 1)]
    assert first.result() == "first" and second.result() == "second"
    assert engine.submit("inline", lambda seq, _: seq, False) == 3
    engine.stop(RuntimeError("done"))


def test_async_calls_complete_their_work_in_order_on_the_worker() -> None:
    engine = Engine("async")
    log: list[tuple[str, int]] = []
    works = [engine.submit(str(i), _record(log), True, str(i)) for i in range(5)]
    for work in works:
        assert work.wait(10)
    assert [w.result() for w in works] == [str(i) for i in range(5)]
    assert log == [(str(i), i) for i in range(5)]
    engine.stop(RuntimeError("done"))


def test_a_failing_call_raises_to_its_caller_and_the_engine_goes_on() -> None:
    engine = Engine("errors")

    def fail(seq: int, _: object) -> None:
        raise ValueError(f"call {seq} failed")

    with pytest.raises(ValueError, match="call 0 failed"):
        engine.submit("inline", fail, False)
    work = engine.submit("queued", fail, True)
    with pytest.raises(ValueError, match="call 1 failed"):
        work.wait(10)
    assert isinstance(work.exception(), ValueError)
    assert engine.submit("next", lambda seq, _: seq, False) == 2
    engine.stop(RuntimeError("done"))


def test_stop_fails_queued_calls_and_refuses_new_ones() -> None:
    engine = Engine("stop")
    engine._ensure_worker = lambda: None  # type: ignore[method-assign]
    queued = engine.submit("queued", lambda seq, _: seq, True)
    error = GroupAbortedError("stopped on purpose")
    engine.stop(error)
    assert queued.is_completed() and queued.exception() is error
    for async_op in (False, True):
        with pytest.raises(GroupAbortedError, match="stopped on purpose"):
            engine.submit("later", lambda seq, _: seq, async_op)


def test_a_call_from_another_thread_while_calls_are_in_flight_is_refused() -> None:
    engine = Engine("threads")
    engine._ensure_worker = lambda: None  # type: ignore[method-assign]  # the async call stays queued
    engine.submit("queued", lambda seq, _: seq, True)
    caught: list[BaseException] = []

    def other() -> None:
        try:
            engine.submit("other", lambda seq, _: seq, False)
        except BaseException as exc:  # noqa: BLE001 - checked below
            caught.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert len(caught) == 1 and isinstance(caught[0], ConcurrentUseError)
    engine.stop(RuntimeError("done"))


class _Parked:
    """A call parked half way (``Engine.park``): its rest appends to ``log``."""

    def __init__(self, log: list[tuple[str, int]], seq: int) -> None:
        self.log, self.seq = log, seq

    def finish(self) -> None:
        self.log.append(("rest", self.seq))


def test_a_parked_call_is_finished_first_by_whoever_runs_next() -> None:
    """A call parked after its post is finished before the next call, blocking or queued, and
    the next call gets the next number; ``settle`` finishes it once, and not after it was."""
    engine = Engine("parked")
    log: list[tuple[str, int]] = []
    for kind in ("blocking", "async", "settle"):
        seq = engine.enter()
        parked = _Parked(log, seq)
        engine.park(parked)
        assert engine.enter() == -1  # the parked call goes first
        if kind == "blocking":
            engine.submit("next", _record(log), False, "next")
        elif kind == "async":
            engine.submit("next", _record(log), True, "next").wait()
        else:
            assert engine.settle(parked)
        assert engine.settle(parked)  # finished already: nothing more
        assert log.count(("rest", seq)) == 1
    assert log == [("rest", 0), ("next", 1), ("rest", 2), ("next", 3), ("rest", 4)]
    engine.stop(RuntimeError("done"))


def test_another_threads_call_while_one_is_parked_is_refused() -> None:
    engine = Engine("parked-threads")
    log: list[tuple[str, int]] = []
    engine.park(_Parked(log, engine.enter()))
    refused: list[BaseException] = []

    def other() -> None:
        try:
            engine.submit("other", _record(log), False, "other")
        except ConcurrentUseError as exc:
            refused.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert len(refused) == 1 and log == []
    engine.stop(RuntimeError("done"))


def test_stop_drops_a_parked_call_unfinished() -> None:
    engine = Engine("parked-stop")
    log: list[tuple[str, int]] = []
    parked = _Parked(log, engine.enter())
    engine.park(parked)
    engine.stop(GroupAbortedError("stopped"))
    assert engine.settle(parked) and log == []  # its owner finds it unfinished
