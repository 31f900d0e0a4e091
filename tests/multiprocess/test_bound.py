"""``core.bound``: a persistent call's bound round, made of its owners' steps, against the
ordinary path (``Group._run``, ``_execute``, the algorithm): a run of each leaves the same traces
in the engine, the recorder, the domain and the control area, members on either path meet, the
round checks what the algorithm checks, and ``start()`` posts this rank's part at once, its rest
run by ``wait()`` or by the group's next call."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.algorithms import select
from tensorcomm.core import collectives, engine
from tensorcomm.testing import run_ranks
from tensorcomm.trace import recorder

pytestmark = pytest.mark.multiprocess

COLLECTIVES = ["all_reduce", "all_gather", "broadcast", "broadcast_from_last", "reduce_scatter", "all_to_all"]


@pytest.mark.parametrize("collective", sorted({row.collective for row in select.ROWS if row.bind}))
def test_every_collective_that_binds_one_round_is_here(collective: str) -> None:
    """A row with a ``bind`` (``select.ROWS``) makes its collective's requests bound rounds: its
    collective needs a case in ``COLLECTIVES`` and ``_request``."""
    assert collective in COLLECTIVES, f"{collective} binds one round: add it to COLLECTIVES and _request"


def _request(name: str, x: np.ndarray, out: np.ndarray, block: np.ndarray) -> tc.Prequest:
    return {"all_reduce": lambda: tc.all_reduce_init(x),
            "all_gather": lambda: tc.all_gather_into_tensor_init(out, block),
            "broadcast": lambda: tc.broadcast_init(x, src=0),
            "broadcast_from_last": lambda: tc.broadcast_init(x, src=tc.get_world_size() - 1),
            "reduce_scatter": lambda: tc.reduce_scatter_tensor_init(block, x),
            "all_to_all": lambda: tc.all_to_all_single_init(out, x)}[name]()


def _traces(request: tc.Prequest) -> dict[str, Any]:
    """What the last run left behind, relative to its step where it names it."""
    group = tc.WORLD._target()
    engine, d = group._engine, group._member_team().shm
    slots = d.slots
    seq = engine._seq - 1
    entry = slots._my_entry[seq & 1]
    call = recorder.calls()[-1]
    last = call.to_json()
    raw = recorder._ring[call.index % len(recorder._ring)]  # the thread that ran it, for dumps
    return {"seq": seq, "round": d._round, "posts": slots.posts,
            "entry": [slots.words[entry] - seq, slots.words[entry + 1] ^ seq, slots.words[entry + 2]],
            "record": {k: last[k] for k in ("state", "collective", "call", "algorithm", "transport", "site")},
            "record_seq": last["seq"] - seq,
            "raw": (len(raw), raw[5] == threading.get_ident()), "inline": engine._inline,
            "last_call": tuple(group.last_call), "held": engine._running.locked()}


def body_traces(name: str) -> list[str]:
    """The request's runs rotate between the bound round in one frame (``run_round``), the
    ordinary path of a blocking call (``Group._run``) and the round in two halves (``start()``
    then ``wait()``); each run's traces must equal the one before's."""
    rank, size = tc.get_rank(), tc.get_world_size()
    x = np.full(4 * size, rank, np.float32)
    out, block = np.zeros(4 * size, np.float32), np.full(4, rank, np.float32)
    request = _request(name, x, out, block)
    assert request._bound.one is not None, name  # bound as one round
    request()
    runs = []
    for turn in range(6):
        posts = _traces(request)["posts"]
        if turn % 3 == 1:
            bound = request._bound
            fast, bound.one = bound.one, None
            request()
            bound.one = fast
        elif turn % 3 == 2 and name != "all_to_all":  # the round's two halves (``post``, then
            # ``finish`` at wait()); all_to_all's start() is queued, and recorded as queued calls are
            request.start()
            request.wait()
        else:
            assert request._bound.run_round(), name
        traces = _traces(request)
        traces["posts"] -= posts
        runs.append(traces)
    wrong = []
    for turn, (before, after) in enumerate(itertools.pairwise(runs), 1):
        if after["seq"] - before["seq"] != 1 or after["round"] - before["round"] != 1:
            wrong.append(f"{name} turn {turn}: step or round moved otherwise: {before} -> {after}")
        for key in ("posts", "entry", "record", "record_seq", "raw", "inline", "last_call", "held"):
            if after[key] != before[key]:
                wrong.append(f"{name} turn {turn}: {key} {before[key]} -> {after[key]}")
    request.free()
    return wrong


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", COLLECTIVES)
def test_a_run_of_the_bound_round_leaves_what_the_ordinary_path_leaves(name: str, ranks: int) -> None:
    for wrong in run_ranks(body_traces, ranks, name, timeout=60):
        assert wrong == []


def body_mixed(name: str) -> list[str]:
    """Even ranks run the request through the bound round, odd ranks through the ordinary path (or an
    ordinary call): every member must get what numpy says."""
    rank, size = tc.get_rank(), tc.get_world_size()
    x, out, block = np.zeros(4 * size, np.float32), np.zeros(4 * size, np.float32), np.zeros(4, np.float32)
    request = _request(name, x, out, block)
    wrong = []
    for turn in range(4):
        values = [np.arange(4 * size, dtype=np.float32) * (q + 1) + turn for q in range(size)]
        x[...] = values[rank]
        block[...] = values[rank][:4]
        if rank % 2 == 0:
            assert request._bound.run_round(), name
        elif turn % 2:
            {"all_reduce": lambda: tc.all_reduce(x),
             "all_gather": lambda: tc.all_gather_into_tensor(out, block),
             "broadcast": lambda: tc.broadcast(x, src=0),
             "broadcast_from_last": lambda: tc.broadcast(x, src=size - 1),
             "reduce_scatter": lambda: tc.reduce_scatter_tensor(block, x),
             "all_to_all": lambda: tc.all_to_all_single(out, x)}[name]()
        else:
            request.start()
            request.wait()
        expected, found = {
            "all_reduce": (sum(values), x), "all_gather": (np.concatenate([v[:4] for v in values]), out),
            "broadcast": (values[0], x), "broadcast_from_last": (values[-1], x),
            "reduce_scatter": (sum(values)[4 * rank:4 * rank + 4], block),
            "all_to_all": (np.concatenate([v[4 * rank:4 * rank + 4] for v in values]), out)}[name]
        if not np.array_equal(found, expected):
            wrong.append(f"{name} turn {turn}: {found} != {expected}")
    return wrong


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", COLLECTIVES)
def test_members_on_the_bound_round_and_on_the_ordinary_path_meet(name: str, ranks: int) -> None:
    for wrong in run_ranks(body_mixed, ranks, name, timeout=60):
        assert wrong == []


def body_sizes() -> str:
    """Rank 0 gathers blocks of 2 through the bound round; rank 1 calls the same total as blocks of 1
    and 3: the sizes the members announce differ, and both must say so."""
    rank = tc.get_rank()
    out = np.zeros(4, np.float32)
    request = tc.all_gather_into_tensor_init(out, np.ones(2, np.float32))
    if rank == 0:
        assert request._bound.one is not None
        with pytest.raises(tc.CollectiveMismatchError) as raised:
            request._bound.run_round()
        step = tc.WORLD._target()._engine._seq - 1
        assert f"at step {step}" in str(raised.value), (step, str(raised.value))
    else:
        group = tc.WORLD._target()
        with pytest.raises(tc.CollectiveMismatchError) as raised:
            collectives.all_gather(group, np.ones(3, np.float32), out, (1, 3), False)
    return str(raised.value)


def test_the_bound_round_checks_the_sizes_its_peers_announce() -> None:
    said = run_ranks(body_sizes, 2, timeout=60)
    assert "called it expecting 2 from rank 1" in said[0], said
    assert "called it expecting 1 from rank 0" in said[1], said


def body_sites() -> list[bool]:
    """With the recorder keeping callers' sites (or feeding a timeline), the bound round still
    runs, and its record names the caller's line, as the ordinary path's does."""
    x = np.ones(4, np.float32)
    request = tc.all_reduce_init(x)
    ran = [request._bound.run_round()]
    calls = recorder._size
    recorder.configure(calls, sites=True)  # every call records its caller
    ran.append(request._bound.run_round())
    ran.append(recorder.calls()[-1].to_json()["site"] is not None)
    request()
    ran.append(recorder.calls()[-1].to_json()["site"] is not None)
    recorder.configure(calls)
    ran.append(request._bound.run_round())
    return ran


def test_the_bound_round_records_sites_as_the_ordinary_path_does() -> None:
    for ran in run_ranks(body_sites, 2, timeout=60):
        assert ran == [True] * 5


def body_interrupted(interrupted: str) -> str:
    """Rank 0's run is interrupted (Ctrl-C) while it waits for rank 1; rank 1 comes late (once
    rank 0 has written the file ``interrupted``) and must fail at once, told of rank 0's failure,
    rather than finish the call rank 0 gave up."""
    rank = tc.get_rank()
    request = tc.all_reduce_init(np.ones(2, np.float32))
    request()
    if rank == 0:
        # Ctrl-C raises KeyboardInterrupt, as in a program started in the foreground (started in
        # the background by a shell without job control, the suite would inherit SIGINT ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            request()
        Path(interrupted).touch()
        with pytest.raises(tc.CommError) as raised:
            request()  # the group ended here too
        return str(raised.value)
    while not os.path.exists(interrupted):  # however late rank 0's timer fires
        time.sleep(0.01)
    started = time.monotonic()
    with pytest.raises(tc.CommError) as raised:
        request()
    assert time.monotonic() - started < 5, "told of the failure at its timeout only"
    return str(raised.value)


def test_a_run_interrupted_on_one_member_fails_on_the_others(tmp_path: Path) -> None:
    said = run_ranks(body_interrupted, 2, str(tmp_path / "interrupted"), timeout=60)
    assert "KeyboardInterrupt" in said[1] and "rank 0" in said[1], said


def _all_to_all_that_goes_on() -> tuple[Any, np.ndarray, np.ndarray]:
    """Rank 0's all_to_all fits one round, and is bound as one; rank 1 sends rank 2 a block larger
    than a slot, so rank 0 finds, after the first round, that the call takes more. Returns the
    persistent request, its output and the output every run must leave."""
    rank, b, big = tc.get_rank(), 4, 1 << 19
    sends = {0: [b, b, b], 1: [b, b, big], 2: [b, b, b]}
    gets = {0: [b, b, b], 1: [b, b, b], 2: [b, big, b]}
    x = np.concatenate([np.full(n, 10 * rank + j, np.float32) for j, n in enumerate(sends[rank])])
    out = np.zeros(sum(gets[rank]), np.float32)
    expected = np.concatenate([np.full(n, 10 * q + rank, np.float32) for q, n in enumerate(gets[rank])])
    return tc.all_to_all_single_init(out, x, gets[rank], sends[rank]), out, expected


def body_all_to_all_goes_on() -> list[bool]:
    """The bound round goes on round by round as the algorithm does, and every member gets its
    blocks (``_all_to_all_that_goes_on``)."""
    request, out, expected = _all_to_all_that_goes_on()
    assert (request._bound.one is not None) == (tc.get_rank() == 0)
    good = []
    for _ in range(3):
        out[...] = -1
        request()
        good.append(bool(np.array_equal(out, expected)))
    return good


def test_a_bound_all_to_all_goes_on_where_a_peer_needs_more_rounds() -> None:
    for good in run_ranks(body_all_to_all_goes_on, 3, timeout=60):
        assert good == [True] * 3


def body_all_to_all_started(came: str) -> list[bool]:
    """The same all_to_all run as ``start()``/``wait()``: rank 0's bound round is parked after
    its post, and its later rounds, which the others need, run on its group's worker while rank 0
    waits for rank 2 to have finished (a file) before its own ``wait()``: a thread that waits on
    something else first does not hang its peers."""
    request, out, expected = _all_to_all_that_goes_on()
    rank = tc.get_rank()
    good = []
    for run in range(3):
        out[...] = -1
        request.start()
        if rank == 0:
            while not os.path.exists(f"{came}{run}"):  # rank 2 needed the rounds after the post
                time.sleep(0.005)
            end = time.monotonic() + 10  # the worker ran them, and is finishing (or finished)
            while not request.is_completed() and time.monotonic() < end:
                time.sleep(0.001)
            good.append(request.is_completed())
        request.wait()
        if rank == 2:
            Path(f"{came}{run}").touch()
        good.append(bool(np.array_equal(out, expected)))
    return good


def test_a_started_all_to_all_that_goes_on_does_not_wait_for_its_issuer(tmp_path: Path) -> None:
    found = run_ranks(body_all_to_all_started, 3, str(tmp_path / "came"), timeout=60)
    assert found == [[True] * 6, [True] * 3, [True] * 3]


def body_all_to_all_polled() -> list[bool]:
    """While the worker runs a parked all_to_all's rest (rank 1 comes late, so its meet waits),
    ``is_completed()`` stays False: once it says True, the outputs are all there, before any
    ``wait()`` (the CI failure of fef87bd: ``parked`` was cleared as the rest began)."""
    request, out, expected = _all_to_all_that_goes_on()
    rank = tc.get_rank()
    good = []
    for _ in range(3):
        out[...] = -1
        if rank == 1:
            time.sleep(0.2)
        request.start()
        if rank == 0:
            time.sleep(0.05)  # past DEFER_SECONDS: the worker has taken the rest
            while not request.is_completed():
                time.sleep(0.0005)
            good.append(bool(np.array_equal(out, expected)))
        request.wait()
        good.append(bool(np.array_equal(out, expected)))
    return good


def test_a_started_all_to_all_is_completed_only_once_its_outputs_are_there() -> None:
    found = run_ranks(body_all_to_all_polled, 3, timeout=60)
    assert found == [[True] * 6, [True] * 3, [True] * 3]


def body_forked() -> int:
    """Rank 0 forks after a run: the child's run of the request must refuse at once (it would
    answer rank 1 in its parent's place), as the ordinary path refuses."""
    request = tc.all_reduce_init(np.ones(2, np.float32))
    request()
    code = 0
    if tc.get_rank() == 0:
        pid = os.fork()
        if pid == 0:
            try:
                request()
            except RuntimeError as exc:
                os._exit(0 if "forked" in str(exc) else 3)
            except BaseException:  # noqa: BLE001  # any other outcome is the failure
                os._exit(4)
            os._exit(5)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    request()  # the parent goes on
    return code


def test_a_forked_child_cannot_run_its_parents_request() -> None:
    assert run_ranks(body_forked, 2, timeout=60, env={"TENSORCOMM_TIMEOUT": "5"}) == [0, 0]


def body_let_go() -> list[bool]:
    """The one-round path lets go of the group's shared memory with the group (and of the
    request with ``free()``), as the ordinary path's plans do."""
    group = tc.new_group([0, 1])
    kept = tc.all_reduce_init(np.ones(2, np.float32), group=group)
    freed = tc.all_reduce_init(np.ones(2, np.float32), group=group)
    kept()
    freed()
    freed.free()
    domain = group._member_team().shm
    found = [kept._bound.one is not None, freed._bound is None]
    group.destroy()
    found += [kept._bound.one is None, domain.arena.mm.closed]
    recorder.configure(0)  # the recorder off: runs go on, recorded nowhere
    world = tc.all_reduce_init(np.ones(2, np.float32))
    world()
    found += [world._bound.one is not None, recorder.calls() == []]
    return found


def test_the_path_lets_go_with_its_group_and_runs_with_the_recorder_off() -> None:
    for found in run_ranks(body_let_go, 2, timeout=60):
        assert found == [True] * 6


def body_dtypes_and_ops() -> list[str]:
    """The bound reductions (the bound round into the slot or ``load``, the ufunc or ``reduce_terms``)
    give the ordinary call's bits for every dtype and op kind: raw terms, float16 accumulated in
    float32, AVG's division, PREMUL_SUM's factor, MAX."""
    rank, size = tc.get_rank(), tc.get_world_size()
    wrong = []
    for dtype in (np.float16, np.float32, np.float64, np.int32):
        ops: list[Any] = [tc.ReduceOp.SUM, tc.ReduceOp.MAX]
        if np.dtype(dtype).kind == "f":
            ops += [tc.ReduceOp.AVG, tc.ReduceOp.premul_sum(0.3)]
        for op in ops:
            data = (np.arange(4 * size) * 1.7 + rank * 3.1).astype(dtype)
            for name in ("all_reduce", "reduce_scatter"):
                ordinary, bound = data.copy(), data.copy()
                got, want = np.zeros(4, dtype), np.zeros(4, dtype)
                if name == "all_reduce":
                    tc.all_reduce(ordinary, op=op)
                    request = tc.all_reduce_init(bound, op=op)
                else:
                    tc.reduce_scatter_tensor(want, ordinary, op=op)
                    request = tc.reduce_scatter_tensor_init(got, bound, op=op)
                # (a two-member reduce_scatter binds only its plain round: raw terms, no AVG)
                bound_here = request._bound.one is not None
                assert bound_here or (name == "reduce_scatter" and size == 2), (name, dtype, op)
                request()
                same = (bound.tobytes() == ordinary.tobytes()) if name == "all_reduce" else \
                    (got.tobytes() == want.tobytes())
                if not same:
                    wrong.append(f"{name} {np.dtype(dtype)} {op}")
                request.free()
    return wrong


@pytest.mark.parametrize("ranks", [2, 3])
def test_bound_reductions_give_the_ordinary_calls_bits(ranks: int) -> None:
    for wrong in run_ranks(body_dtypes_and_ops, ranks, timeout=60):
        assert wrong == []


def body_start_posts() -> list[Any]:
    """``start()`` posts this rank's part at once and returns: the peers' parts arrive while it
    waits for nothing (``is_completed()`` finishes the run once they have), and no worker thread
    is involved; the values are the call's."""
    rank, size = tc.get_rank(), tc.get_world_size()
    x = np.full(2, rank + 1, np.float32)
    request = tc.all_reduce_init(x)
    group = tc.WORLD._target()
    slots = group._member_team().shm.slots
    posts = slots.posts
    request.start()
    # parked, unless every peer had posted first: then start() ran the rest (the next test)
    done_at_once = x.tolist() == [size * (size + 1) / 2] * 2
    found: list[Any] = [slots.posts - posts, request._bound.parked != done_at_once]
    deadline = time.monotonic() + 30
    while not request.is_completed() and time.monotonic() < deadline:
        time.sleep(0.001)
    request.wait()
    found += [x.tolist() == [size * (size + 1) / 2] * 2, group._engine._worker is None]
    return found


def test_start_posts_at_once_and_returns() -> None:
    for found in run_ranks(body_start_posts, 3, timeout=60):
        assert found == [1, True, True, True]


def _until_every_peer_posted() -> None:
    """Return once every peer of the world group has posted past this rank's posts (its part of
    the run this rank is about to start is there), or after 30 s."""
    slots = tc.WORLD._target()._member_team().shm.slots
    deadline = time.monotonic() + 30
    while (any(slots.words[w] <= slots.posts for w in slots._peer_counters)
           and time.monotonic() < deadline):
        time.sleep(0.001)


def body_last_start_finishes() -> list[Any]:
    """The member that starts a run after every peer has posted its part finishes it in
    ``start()``: nothing is parked, the values are there before ``wait()``; the others park."""
    rank, size = tc.get_rank(), tc.get_world_size()
    x = np.full(2, rank + 1, np.float32)
    want = [size * (size + 1) / 2] * 2
    request = tc.all_reduce_init(x)
    if rank == 0:
        _until_every_peer_posted()
    request.start()
    found: list[Any] = [request._bound.parked, x.tolist() == want]
    request.wait()
    return [*found, x.tolist() == want]


def test_the_last_member_to_start_finishes_the_run_in_start() -> None:
    found = run_ranks(body_last_start_finishes, 3, timeout=60)
    assert found[0] == [False, True, True]
    assert found[1:] == [[True, False, True]] * 2


def body_last_start_meets_a_mismatch() -> list[Any]:
    """A ``start()`` that finishes the run itself and finds a peer in another call returns; its
    ``wait()`` raises the mismatch, as the peer's call does."""
    rank = tc.get_rank()
    x = np.full(2, rank + 1, np.float32)
    request = tc.all_reduce_init(x)
    if rank == 1:
        with pytest.raises(tc.CollectiveMismatchError) as raised:
            tc.broadcast(np.zeros(5, np.float64), src=0)
        return ["raised", "all_reduce" in str(raised.value)]
    _until_every_peer_posted()
    request.start()  # the peer's post is there: the run finishes here, and fails
    found: list[Any] = [request._bound.parked]
    with pytest.raises(tc.CollectiveMismatchError) as raised:
        request.wait()
    return [*found, "broadcast" in str(raised.value)]


def test_a_start_that_finishes_a_mismatched_run_raises_it_from_wait() -> None:
    found = run_ranks(body_last_start_meets_a_mismatch, 2, timeout=60)
    assert found == [[False, True], ["raised", True]]


def body_all_to_all_last_start() -> list[bool]:
    """An all_to_all started after its peers posted finishes in ``start()`` too."""
    rank, size = tc.get_rank(), tc.get_world_size()
    send = np.arange(size * 2, dtype=np.int64) + 100 * rank
    out = np.zeros_like(send)
    request = tc.all_to_all_single_init(out, send)
    if rank == 0:
        _until_every_peer_posted()
    request.start()
    found = [request._bound.parked]
    request.wait()
    want = np.concatenate([np.arange(rank * 2, rank * 2 + 2) + 100 * q for q in range(size)])
    return [*found, out.tolist() == want.tolist()]


def test_an_all_to_all_started_last_finishes_in_start() -> None:
    found = run_ranks(body_all_to_all_last_start, 3, timeout=60)
    assert found[0] == [False, True]
    assert found[1:] == [[True, True]] * 2


def body_all_to_all_that_goes_on_started_last() -> list[bool]:
    """An all_to_all started after its peers posted, whose first round was not the whole call
    (``_all_to_all_that_goes_on``), is parked: its later rounds wait for the peers, and ``start()``
    waits for nobody; ``wait()`` runs them and every member gets its blocks."""
    request, out, expected = _all_to_all_that_goes_on()
    if tc.get_rank() == 0:
        _until_every_peer_posted()
    out[...] = -1
    with mock.patch.object(engine, "DEFER_SECONDS", 30):  # the worker leaves the parked run to wait()
        request.start()
        found = [request._bound.parked] if tc.get_rank() == 0 else []
        request.wait()
    return [*found, bool(np.array_equal(out, expected))]


def test_an_all_to_all_started_last_that_goes_on_is_parked() -> None:
    found = run_ranks(body_all_to_all_that_goes_on_started_last, 3, timeout=60)
    assert found == [[True, True], [True], [True]]


def body_next_call_finishes() -> list[bool]:
    """A started run's rest runs first thing in the group's next call, which then runs too."""
    rank, size = tc.get_rank(), tc.get_world_size()
    x, y = np.full(2, rank + 1, np.float32), np.ones(3, np.float32)
    request = tc.all_reduce_init(x)
    request.start()
    tc.all_reduce(y)
    done = request.is_completed()
    request.wait()
    request.start()
    request.wait()
    return [done, x.tolist() == [size * (size + 1) / 2 * size] * 2, y.tolist() == [size] * 3]


def test_the_next_call_on_the_group_finishes_a_started_run() -> None:
    for found in run_ranks(body_next_call_finishes, 2, timeout=60):
        assert found == [True, True, True]


def body_wait_timeout(came: str) -> list[Any]:
    """Rank 0's ``wait(timeout)`` before rank 1 has come raises CommTimeoutError and leaves the
    run started; once rank 1 has come, ``wait()`` finishes it."""
    rank = tc.get_rank()
    x = np.full(2, rank + 1, np.float32)
    request = tc.all_reduce_init(x)
    if rank == 1:
        while not os.path.exists(came):
            time.sleep(0.01)
        request()
        return [x.tolist()]
    request.start()
    with pytest.raises(tc.CommTimeoutError):
        request.wait(timeout=0.05)
    still = [request.is_completed(), request._bound.parked]
    Path(came).touch()
    request.wait(timeout=30)
    return [*still, x.tolist()]


def test_a_wait_that_times_out_leaves_the_run_started(tmp_path: Path) -> None:
    found = run_ranks(body_wait_timeout, 2, str(tmp_path / "came"), timeout=60)
    assert found == [[False, True, [3.0, 3.0]], [[3.0, 3.0]]]


def body_destroyed_while_started() -> str:
    """A run started on a group destroyed before its wait: the wait raises the group's error."""
    group = tc.new_group([0, 1])
    request = tc.all_reduce_init(np.ones(2, np.float32), group=group)
    request()
    tc.barrier()
    if tc.get_rank() == 1:
        return "peer"
    request.start()
    group.destroy()
    with pytest.raises(tc.CommError) as raised:
        request.wait()
    return str(raised.value)


def test_a_run_started_on_a_destroyed_group_fails_its_wait() -> None:
    said = run_ranks(body_destroyed_while_started, 2, timeout=60)
    assert "destroyed" in said[0], said
