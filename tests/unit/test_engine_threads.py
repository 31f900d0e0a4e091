"""The engine marks its worker thread, so transport waits on it give the GIL up at once."""

from __future__ import annotations

from tensorcomm.core.engine import Engine
from tensorcomm.transports.threads import on_worker


def test_async_calls_run_on_a_marked_worker_and_inline_calls_do_not() -> None:
    engine = Engine("threads")
    assert engine.submit("inline", lambda seq: on_worker(), async_op=False) is False
    work = engine.submit("queued", lambda seq: on_worker(), async_op=True)
    work.wait(10)
    assert work.result() is True
    assert on_worker() is False  # the caller's own thread stays unmarked
    engine.stop(RuntimeError("done"))
