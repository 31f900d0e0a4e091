"""Persistent collectives (``all_reduce_init`` and its kin) on real rank processes: every form
gives what its ordinary call gives, run after run, with new values written into its arrays;
creation is a checked step; requests follow their group's life and their arrays."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import rank_data, run_ranks
from tensorcomm.trace import recorder

from helpers import COLLECTIVES

pytestmark = pytest.mark.multiprocess

TRANSPORTS = {"shm": {}, "tcp": {"TENSORCOMM_TRANSPORT": "tcp"}}
SUM = tc.ReduceOp.SUM

Arrays = dict[str, Any]


def _data(rank: int, count: int, turn: int, dtype: Any = np.float32) -> np.ndarray:
    return rank_data(rank, count, dtype, salt=turn)


def _fresh(name: str, rank: int, size: int, count: int, turn: int) -> Arrays:
    """The arrays of one call of ``name`` on ``rank``, with turn ``turn``'s values."""
    n, root = count, size - 1
    blocks = [_data(rank, n, turn + 10 * q) for q in range(size)]
    return {
        "all_reduce": lambda: {"x": _data(rank, n, turn)},
        "all_reduce_strided": lambda: {"x": _data(rank, 2 * n, turn).reshape(n, 2)[:, 0]},
        "scan": lambda: {"x": _data(rank, n, turn)},
        "exscan": lambda: {"x": _data(rank, n, turn)},
        "reduce": lambda: {"x": _data(rank, n, turn)},
        "broadcast": lambda: {"x": _data(rank, n, turn)},
        "all_gather": lambda: {"out": [np.zeros(n, np.float32) for _ in range(size)],
                               "x": _data(rank, n, turn)},
        "all_gather_into_tensor": lambda: {"out": np.zeros(size * n, np.float32), "x": _data(rank, n, turn)},
        "gather": lambda: {"x": _data(rank, n, turn),
                           "out": [np.zeros(n, np.float32) for _ in range(size)] if rank == root else None},
        "scatter": lambda: {"out": np.zeros(n, np.float32), "x": blocks if rank == root else None},
        "reduce_scatter": lambda: {"out": np.zeros(n, np.float32), "x": blocks},
        "reduce_scatter_uneven": lambda: {"out": np.zeros(n + rank, np.float32),
                                          "x": [_data(rank, n + q, turn + q) for q in range(size)]},
        "reduce_scatter_tensor": lambda: {"out": np.zeros(n, np.float32), "x": np.concatenate(blocks)},
        "all_to_all": lambda: {"out": [np.zeros(n, np.float32) for _ in range(size)], "x": blocks},
        "all_to_all_single": lambda: {"out": np.zeros(size * n, np.float32), "x": np.concatenate(blocks)},
        "barrier": dict,
    }[name]()


def _forms(size: int) -> dict[str, tuple[Callable[[Arrays], Any], Callable[[Arrays], tc.Prequest]]]:
    """Per case: the ordinary call and the persistent request, on the same arrays."""
    root = size - 1
    return {
        "all_reduce": (lambda a: tc.all_reduce(a["x"]), lambda a: tc.all_reduce_init(a["x"])),
        "all_reduce_strided": (lambda a: tc.all_reduce(a["x"], op="max"),
                               lambda a: tc.all_reduce_init(a["x"], op="max")),
        "scan": (lambda a: tc.scan(a["x"]), lambda a: tc.scan_init(a["x"])),
        "exscan": (lambda a: tc.exscan(a["x"], op="prod"), lambda a: tc.exscan_init(a["x"], op="prod")),
        "reduce": (lambda a: tc.reduce(a["x"], dst=root), lambda a: tc.reduce_init(a["x"], dst=root)),
        "broadcast": (lambda a: tc.broadcast(a["x"], src=root),
                      lambda a: tc.broadcast_init(a["x"], src=root)),
        "all_gather": (lambda a: tc.all_gather(a["out"], a["x"]),
                       lambda a: tc.all_gather_init(a["out"], a["x"])),
        "all_gather_into_tensor": (lambda a: tc.all_gather_into_tensor(a["out"], a["x"]),
                                   lambda a: tc.all_gather_into_tensor_init(a["out"], a["x"])),
        "gather": (lambda a: tc.gather(a["x"], a["out"], dst=root),
                   lambda a: tc.gather_init(a["x"], a["out"], dst=root)),
        "scatter": (lambda a: tc.scatter(a["out"], a["x"], src=root),
                    lambda a: tc.scatter_init(a["out"], a["x"], src=root)),
        "reduce_scatter": (lambda a: tc.reduce_scatter(a["out"], a["x"]),
                           lambda a: tc.reduce_scatter_init(a["out"], a["x"])),
        "reduce_scatter_uneven": (lambda a: tc.reduce_scatter(a["out"], a["x"]),
                                  lambda a: tc.reduce_scatter_init(a["out"], a["x"])),
        "reduce_scatter_tensor": (lambda a: tc.reduce_scatter_tensor(a["out"], a["x"]),
                                  lambda a: tc.reduce_scatter_tensor_init(a["out"], a["x"])),
        "all_to_all": (lambda a: tc.all_to_all(a["out"], a["x"]),
                       lambda a: tc.all_to_all_init(a["out"], a["x"])),
        "all_to_all_single": (lambda a: tc.all_to_all_single(a["out"], a["x"]),
                              lambda a: tc.all_to_all_single_init(a["out"], a["x"])),
        "barrier": (lambda a: tc.barrier(), lambda a: tc.barrier_init()),
    }


CASES = list(_forms(2))


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_collective_has_a_persistent_case(collective):
    """A collective of ``signature.COLLECTIVES`` needs a case of its own name in ``_forms``."""
    assert collective in CASES, f"no persistent case for {collective}: add one to _forms and _fresh"


def _write(into: Any, values: Any) -> None:
    """Write ``values`` into the arrays ``into`` (the request's), in place."""
    if isinstance(into, dict):
        for key in into:
            _write(into[key], values[key])
    elif isinstance(into, list):
        for target, value in zip(into, values, strict=True):
            _write(target, value)
    elif into is not None:
        into[...] = values


def _same(found: Any, expected: Any) -> bool:
    if isinstance(found, list):
        return all(_same(f, e) for f, e in zip(found, expected, strict=True))
    return found is None or found.tobytes() == expected.tobytes()


def body_like_the_ordinary_call(count: int) -> list[str]:
    """Each case three times: the request runs on values written into its arrays (by ``request()``
    and by ``start()``/``wait()`` in turn) and must give what the ordinary call gives."""
    rank, size = tc.get_rank(), tc.get_world_size()
    wrong = []
    for name, (ordinary, init) in _forms(size).items():
        bound = _fresh(name, rank, size, count, 0)
        request = init(bound)
        assert isinstance(request, tc.Prequest) and request.is_completed()
        for turn in range(1, 4):
            expected = _fresh(name, rank, size, count, turn)
            _write(bound, expected)
            ordinary(expected)
            if turn % 2:
                request()
            else:
                request.start()
                assert request.wait() is True and request.is_completed()
            if not all(_same(bound[key], expected[key]) for key in bound):
                wrong.append(f"{name} turn {turn}")
        assert request.algorithm == tc.WORLD.last_call.algorithm or name == "reduce_scatter_uneven", name
        request.free()
    return wrong


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("ranks", [2, 3])
def test_every_persistent_collective_gives_what_its_ordinary_call_gives(transport: str, ranks: int) -> None:
    for wrong in run_ranks(body_like_the_ordinary_call, ranks, 5, timeout=120, env=TRANSPORTS[transport]):
        assert wrong == []


def test_large_persistent_calls_span_several_slots() -> None:
    """300k float32 per block: several shared-memory slots per call (and direct reads)."""
    for wrong in run_ranks(body_like_the_ordinary_call, 2, 300_000, timeout=180):
        assert wrong == []


def body_create_mismatch(other: str) -> str:
    x = np.ones(4, np.float32)
    try:
        if tc.get_rank() == 0:
            tc.all_reduce_init(x)
        elif other == "ordinary":
            tc.all_reduce(x)
        else:
            tc.broadcast_init(x, src=0)
    except tc.CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("other", ["ordinary", "another request"])
def test_creating_a_request_is_a_checked_step(transport: str, other: str) -> None:
    """Every member must create the request: a member that makes another call at that step
    gets the mismatch error, on every rank."""
    for text in run_ranks(body_create_mismatch, 2, other, timeout=60, env=TRANSPORTS[transport]):
        assert "all_reduce_init(float32[4], op=sum)" in text, text


def body_run_mismatch() -> str:
    x = np.ones(4, np.float32)
    request = tc.all_reduce_init(x)
    request()
    try:
        if tc.get_rank() == 0:
            request()
        else:
            tc.broadcast(x, src=0)
    except tc.CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_run_is_checked_against_the_peers_call(transport: str) -> None:
    for text in run_ranks(body_run_mismatch, 2, timeout=60, env=TRANSPORTS[transport]):
        assert "all_reduce(float32[4], op=sum)" in text and "broadcast(float32[4], root=0)" in text, text


def body_misuse() -> list[str]:
    said = []
    x = np.ones(4, np.float32)
    request = tc.all_reduce_init(x)
    assert request.wait() is True  # not started: nothing to wait for, as MPI_Wait on an inactive request
    request.start()
    for again in (request.start, request, request.free):
        with pytest.raises(ValueError, match="not waited for") as raised:
            again()
        said.append(str(raised.value))
    request.wait()
    assert (x == tc.get_world_size()).all()
    x.resize(8, refcheck=False)  # the array the request holds is another now
    with pytest.raises(ValueError, match="not the one it was made with") as raised:
        request()
    said.append(str(raised.value))
    y = np.ones(4, np.float32)
    other = tc.all_reduce_init(y)
    y.dtype = np.int32  # reinterpreted in place
    with pytest.raises(ValueError, match=r"it was float32\[4\], it is int32\[4\]"):
        other.start()
    other.free()
    with pytest.raises(ValueError, match="freed"):
        other()
    return said


def test_misuse_is_a_clear_error() -> None:
    for said in run_ranks(body_misuse, 2, timeout=60):
        assert all(text.startswith(("all_reduce on group 'world'", "all_reduce_init")) for text in said), said


def body_group_ends(how: str) -> str:
    rank = tc.get_rank()
    group = tc.new_group([0, 1])
    x = np.ones(4, np.float32)
    request = tc.all_reduce_init(x, group=group)
    request()
    if how == "destroy":
        group.destroy()
    elif how == "abort":
        if rank == 0:
            group.abort("on purpose")
        tc.barrier()
    else:  # shrink: the same members in a new group; the request stays with the old one
        new = group.shrink()
        assert new.ranks == group.ranks
        group.destroy()
    try:
        request()
    except tc.CommError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


@pytest.mark.parametrize("how", ["destroy", "abort", "shrink"])
def test_a_request_ends_with_its_group(how: str) -> None:
    for text in run_ranks(body_group_ends, 2, how, timeout=60):
        assert text.startswith("GroupAbortedError"), text
        assert "destroyed" in text or "aborted" in text, text


def body_started_progresses() -> bool:
    """Rank 0 starts the request and then waits for a message rank 1 sends only after the
    request ran: the start must go ahead on its own (the group's worker), as it would in MPI."""
    rank = tc.get_rank()
    x = np.ones(4, np.float32)
    request = tc.all_reduce_init(x)
    flag = np.zeros(1, np.int32)
    p2p = tc.new_group([0, 1])
    if rank == 0:
        request.start()
        tc.recv(flag, src=1, group=p2p)
        request.wait()
    else:
        request()
        flag[0] = 7
        tc.send(flag, dst=0, group=p2p)
    return bool((x == 2).all()) and (rank == 1 or flag[0] == 7)


def test_a_started_request_goes_ahead_without_a_wait() -> None:
    assert run_ranks(body_started_progresses, 2, timeout=60) == [True, True]


def body_threads() -> str:
    x = np.ones(4, np.float32)
    request = tc.all_reduce_init(x)
    thread = threading.Thread(target=request)  # another thread, one at a time: fine
    thread.start()
    thread.join()
    assert (x == 2).all()
    request.start()
    waiter = threading.Thread(target=request.wait)  # started here, waited for there
    waiter.start()
    waiter.join()
    assert request.is_completed() and (x == 4).all()
    return "ok"


def test_a_request_may_be_used_from_other_threads_in_turn() -> None:
    assert run_ranks(body_threads, 2, timeout=60) == ["ok", "ok"]


def body_recorded() -> list[tuple[str, str]]:
    recorder.configure(16)
    x = np.ones(4, np.float32)
    request = tc.all_reduce_init(x)
    request()
    request.start()
    request.wait()
    return [(c.to_json()["collective"], c.to_json()["call"]) for c in recorder.calls()]


def test_creation_and_runs_are_in_the_flight_record() -> None:
    for calls in run_ranks(body_recorded, 2, timeout=60):
        assert calls == [("all_reduce_init", "all_reduce_init(float32[4], op=sum)"),
                         ("all_reduce", "all_reduce(float32[4], op=sum)"),
                         ("all_reduce", "all_reduce(float32[4], op=sum)")], calls


def body_shared(count: int) -> tuple[str, bool]:
    rank, size = tc.get_rank(), tc.get_world_size()
    x = tc.zeros(count, np.float32)
    out = tc.zeros(size * count, np.float32)
    request = tc.all_gather_into_tensor_init(out, x)
    reduce = tc.all_reduce_init(x)
    good = True
    for turn in range(3):
        x[...] = rank + turn
        request()
        good &= bool((out.reshape(size, count) == (np.arange(size) + turn)[:, None]).all())
        reduce()
        good &= bool((x == sum(range(size)) + size * turn).all())
    return request.algorithm, good


def test_requests_on_shared_arrays() -> None:
    """Shared arrays (``tensorcomm.zeros``) are read in place by their peers: a request runs on
    them as on any array, below and above the direct-read size."""
    for algorithm, good in run_ranks(body_shared, 2, 4, timeout=60):
        assert good and algorithm == "shm_rounds"
    results = run_ranks(body_shared, 2, 1 << 20, timeout=120)
    assert all(good for _, good in results), results


def body_torch() -> list[str]:
    import torch

    rank = tc.get_rank()
    t = torch.full((2, 3), float(rank + 1))
    request = tc.all_reduce_init(t)
    request()
    said = [str(t.sum().item())]
    t.copy_(torch.full((2, 3), float(rank)))  # new values in the same tensor
    request()
    said.append(str(t.sum().item()))
    t.set_(torch.zeros(6))  # other storage: not the tensor the request was made with
    with pytest.raises(ValueError, match="not the one it was made with"):
        request()
    return said


def test_requests_on_torch_tensors() -> None:
    pytest.importorskip("torch")
    for said in run_ranks(body_torch, 2, timeout=90):
        assert said == ["18.0", "6.0"], said


def body_timeout_wait() -> bool:
    x = np.ones(4, np.float32)
    request = tc.all_reduce_init(x)
    if tc.get_rank() == 1:
        time.sleep(0.5)  # late: rank 0's wait with a timeout gives up first, the run stays started
    request.start()
    if tc.get_rank() == 0:
        with pytest.raises(tc.CommTimeoutError):
            request.wait(timeout=0.1)
        assert not request.is_completed()
    request.wait(timeout=30)
    return bool((x == 2).all())


def test_wait_with_a_timeout_leaves_the_run_started() -> None:
    assert run_ranks(body_timeout_wait, 2, timeout=60) == [True, True]
