"""The engine's threads: its worker is marked (transport waits on it give the GIL up at once), and
a waiter runs the queued calls the worker has not started."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tensorcomm.core.engine import Engine
from tensorcomm.errors import CommTimeoutError
from tensorcomm.transports.threads import on_worker


def test_async_calls_run_on_a_marked_worker_and_inline_calls_do_not() -> None:
    engine = Engine("threads")
    assert engine.submit("inline", lambda seq, _: on_worker(), async_op=False) is False
    work = engine.submit("queued", lambda seq, _: on_worker(), async_op=True)
    work.wait(10)
    assert work.result() is True
    assert on_worker() is False  # the caller's own thread stays unmarked
    engine.stop(RuntimeError("done"))


def test_a_waiter_runs_the_queued_calls_the_worker_has_not_started_in_order() -> None:
    engine = Engine("steal")
    engine._ensure_worker = lambda: None  # type: ignore[method-assign]  # no worker: only a waiter runs them
    ran: list[tuple[str, int, int]] = []

    def body(name: str) -> Any:
        return lambda seq, _: ran.append((name, seq, threading.get_ident())) or name

    first = engine.submit("first", body("first"), async_op=True)
    second = engine.submit("second", body("second"), async_op=True)
    third = engine.submit("third", body("third"), async_op=True)
    waiter = threading.Thread(target=second.wait, daemon=True)
    waiter.start()
    waiter.join(10)
    assert not waiter.is_alive()
    assert [(name, seq) for name, seq, _ in ran] == [("first", 0), ("second", 1)]
    assert {thread for _, _, thread in ran} == {waiter.ident}
    assert first.result() == "first" and second.result() == "second"
    assert not third.is_completed()  # not waited for: stays queued
    third.wait(None)
    assert ran[-1][:2] == ("third", 2)
    assert engine.submit("inline", lambda seq, _: seq, async_op=False) == 3
    engine.stop(RuntimeError("done"))


def test_a_waiter_with_a_time_limit_leaves_the_call_to_the_worker() -> None:
    engine = Engine("limit")
    engine._ensure_worker = lambda: None  # type: ignore[method-assign]
    work = engine.submit("queued", lambda seq, _: seq, async_op=True)
    with pytest.raises(CommTimeoutError):
        work.wait(0.05)
    engine.stop(RuntimeError("done"))
