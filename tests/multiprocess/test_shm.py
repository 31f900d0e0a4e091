"""The shared-memory path on real rank processes: when it is chosen, groups side by side, lost
peers, aborts, and that nothing (no /dev/shm name, no descriptor) outlives a job."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.algorithms.shm_allreduce import KEEP_GOING_RING_BYTES
from tensorcomm.testing import reduce_reference, run_ranks, spawn_ranks
from tensorcomm.transports.shm import slots

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(not slots.SUPPORTED, reason="shared memory needs x86-64")]

SHM, TCP = tc.TransportKind.SHM, tc.TransportKind.TCP


def _init_as_host(hosts: str) -> None:
    """``tc.init()`` with this rank's host identity taken from the comma-separated ``hosts``."""
    os.environ["TENSORCOMM_HOST_ID"] = hosts.split(",")[int(os.environ["RANK"])]
    tc.init(timeout=60)


def body_transport_kinds(hosts: str) -> dict:
    _init_as_host(hosts)
    rank, size = tc.get_rank(), tc.get_world_size()
    kinds = {"world": tc.WORLD.transport_kind}
    for ranks in ([0, 1], [2, 3], [1, 2]):
        group = tc.new_group(ranks)
        if rank in ranks:
            kinds[str(ranks)] = group.transport_kind
            x = np.full(5, rank, np.int64)
            tc.all_reduce(x, group=group)
            assert (x == sum(ranks)).all()
    x = np.ones(3, np.float32)
    tc.all_reduce(x)
    assert (x == size).all()
    tc.destroy()
    return kinds


def test_groups_on_one_host_use_shared_memory_and_the_others_tcp():
    kinds = run_ranks(body_transport_kinds, 4, "a,a,b,b", timeout=90, init=False)
    assert all(k["world"] == TCP for k in kinds)  # two hosts
    assert kinds[0]["[0, 1]"] == kinds[1]["[0, 1]"] == SHM
    assert kinds[2]["[2, 3]"] == kinds[3]["[2, 3]"] == SHM
    assert kinds[1]["[1, 2]"] == kinds[2]["[1, 2]"] == TCP


def body_kind() -> str:
    return tc.WORLD.transport_kind.value


def test_one_host_uses_shared_memory_unless_tcp_is_forced():
    assert run_ranks(body_kind, 3, timeout=60) == ["shm"] * 3
    assert run_ranks(body_kind, 3, timeout=60, env={"TENSORCOMM_TRANSPORT": "tcp"}) == ["tcp"] * 3
    assert run_ranks(body_kind, 1, timeout=60) == ["tcp"]  # nothing to share with


def body_two_groups_in_flight() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    everyone = tc.new_group(list(range(size)))
    low = tc.new_group([0, 1])
    assert everyone.transport_kind == SHM
    if rank < 2:
        assert low.transport_kind == SHM
    else:
        with pytest.raises(ValueError, match="not a member"):
            _ = low.transport_kind  # the property raises on a non-member
    big = 3 << 20  # float32: several pipelined chunks, on both groups at once
    for i in range(3):
        a = np.full(big, rank + i, np.float32)
        work = tc.all_reduce(a, group=everyone, async_op=True)
        b = np.full(1000, rank * i, np.float64)
        c = np.full(big // 2, rank, np.float32)
        if rank < 2:
            tc.all_reduce(b, group=low)
            assert (b == i).all()
            tc.broadcast(c, src=1, group=low)
            assert (c == 1).all()
        tc.all_reduce(b)  # the world group, while `everyone` may still be busy
        work.wait()
        assert (a == sum(range(size)) + size * i).all()


def test_groups_side_by_side_do_not_interfere():
    run_ranks(body_two_groups_in_flight, 3, timeout=120)


def body_abort_from_another_thread() -> str:
    x = np.ones(10, np.float32)
    tc.all_reduce(x)
    group = tc.WORLD._target()
    if tc.get_rank() == 0:
        # Rank 1 is late for the second call; meanwhile another thread of rank 0 aborts the group.
        threading.Timer(0.5, group._shm.abort, args=(tc.GroupAbortedError("aborted by test"),)).start()
    else:
        time.sleep(1.5)  # arrives after the abort: its call fails at once
    started = time.monotonic()
    try:
        tc.all_reduce(x)
    except tc.GroupAbortedError as exc:
        assert time.monotonic() - started < 5
        return str(exc)
    raise AssertionError("no GroupAbortedError")


def test_abort_from_another_thread_fails_pending_calls_everywhere():
    messages = run_ranks(body_abort_from_another_thread, 2, timeout=60)
    assert "aborted by test" in messages[0]
    assert "rank 0 aborted group 'world'" in messages[1]


def _memfd_and_pidfd_descriptors() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "memfd" in target or "pidfd" in target:
            found.append(target)
    return found


def body_descriptors_are_released() -> list[str]:
    before = _memfd_and_pidfd_descriptors()
    tc.init(timeout=60)
    sub = tc.new_group([0, 1])
    x = np.ones(1 << 20, np.float32)
    tc.all_reduce(x)
    if tc.get_rank() < 2:
        tc.all_reduce(x, group=sub)
    during = _memfd_and_pidfd_descriptors()
    assert any("memfd:tensorcomm" in d for d in during)
    tc.destroy()
    import gc

    gc.collect()
    after = _memfd_and_pidfd_descriptors()
    assert after == before, (before, after)
    with open("/proc/self/maps") as maps:
        assert "tensorcomm-shm" not in maps.read()
    return after


def test_destroy_releases_every_descriptor_and_mapping():
    run_ranks(body_descriptors_are_released, 3, timeout=60, init=False)


def _dev_shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


KEEP_GOING = {"TENSORCOMM_KEEP_GOING": "1"}  # failed calls keep arrays untouched or complete


def _through_the_ring() -> bool:
    """Whether the latest call went through the OUT regions used as rings (``_through_out``)."""
    state = tc.WORLD._target()._last_plan.state
    return bool(state.in_out and state.ring)


def body_kill_mid_pipeline(victim: int) -> dict:
    rank = tc.get_rank()
    x = np.arange(8 << 20, dtype=np.float32) + rank  # 32 MiB: beyond one slot
    original = x.copy()
    tc.all_reduce(x)
    ring = _through_the_ring()
    tc.all_reduce(np.ones(4, np.float32))
    if rank == victim:
        threading.Timer(0.02, os.kill, args=(os.getpid(), signal.SIGKILL)).start()
    started = time.monotonic()
    try:
        for _ in range(100):
            x[...] = original
            tc.all_reduce(x)
    except tc.PeerLostError as exc:
        elapsed = time.monotonic() - started
        complete = np.array_equal(x, sum(np.arange(8 << 20, dtype=np.float32) + r
                                         for r in range(tc.get_world_size())))
        return {"rank": exc.rank, "elapsed": elapsed, "ring": ring,
                "untouched_or_complete": bool(np.array_equal(x, original) or complete)}
    raise AssertionError("no PeerLostError")


# 3 ranks: streamed through the slots; 2 ranks: through the OUT regions (``_through_out``) used
# as rings, under a journal where failed calls keep arrays untouched or complete
@pytest.mark.parametrize("mode", ["keep_going", "default"])
@pytest.mark.parametrize("world_size", [3, 2])
def test_sigkill_mid_pipeline_is_noticed_and_leaves_arrays_and_dev_shm_clean(world_size, mode):
    before = _dev_shm()
    keep = mode == "keep_going"
    outcomes = spawn_ranks(body_kill_mid_pipeline, world_size, 1, timeout=90, comm_timeout=60,
                           env={**(KEEP_GOING if keep else {}), "TENSORCOMM_CMA": "off"})
    assert outcomes[1].exitcode == -signal.SIGKILL
    for outcome in outcomes[:1] + outcomes[2:]:
        assert outcome.ok, outcome.output
        assert outcome.result["rank"] == 1
        assert outcome.result["elapsed"] < 5, outcome.result
        assert outcome.result["ring"] == (world_size == 2), outcome.result
        assert outcome.result["untouched_or_complete"] or not keep, outcome.result
    assert _dev_shm() == before


def body_ring_all_reduce() -> None:
    """Two members, raw terms, arrays of several ring chunks: all_reduce and reduce to each root
    through the OUT regions, in the caller's dtype, odd lengths."""
    rank, size = tc.get_rank(), tc.get_world_size()
    keep = os.environ.get("TENSORCOMM_KEEP_GOING") == "1"
    cases = ((np.float32, tc.ReduceOp.SUM, 1_000_003), (np.int32, tc.ReduceOp.MAX, 777_777),
             (np.float64, tc.ReduceOp.PROD, 500_001), (np.uint8, tc.ReduceOp.BXOR, 5_000_011),
             (np.float32, tc.ReduceOp.SUM, 4_500_007))  # 17 MiB: rings in both modes
    for dtype, op, count in cases:
        inputs = [((np.arange(count) * (r + 3)) % 5 + 1).astype(dtype) for r in range(size)]
        expected = reduce_reference(op, inputs)
        x = inputs[rank].copy()
        tc.all_reduce(x, op=op)
        assert _through_the_ring() == (not keep or x.nbytes >= KEEP_GOING_RING_BYTES)
        np.testing.assert_array_equal(x, expected, err_msg=f"{np.dtype(dtype)} {op}")
        for root in range(size):
            y = inputs[rank].copy()
            tc.reduce(y, dst=root, op=op)
            np.testing.assert_array_equal(y, expected if rank == root else inputs[rank])


@pytest.mark.parametrize("mode", ["keep_going", "default"])
def test_two_members_reduce_through_out_region_rings(mode):
    run_ranks(body_ring_all_reduce, 2, timeout=120,
              env={"TENSORCOMM_ALGORITHMS": "all_reduce=shm_pipelined,reduce=shm_pipelined",
                   **(KEEP_GOING if mode == "keep_going" else {})})


def body_kill_broadcast_root(count: int) -> dict:
    rank = tc.get_rank()
    x = np.full(count, 7.0 if rank == 0 else -1.0, np.float32)
    tc.all_reduce(np.ones(4, np.float32))
    if rank == 0:
        threading.Timer(0.05, os.kill, args=(os.getpid(), signal.SIGKILL)).start()
    try:
        for _ in range(100_000):
            if rank != 0:
                x[...] = -1.0
            tc.broadcast(x, src=0)
    except tc.PeerLostError:
        values = np.unique(x).tolist()
        return {"untouched_or_complete": values in ([-1.0], [7.0]), "values": values[:4]}
    raise AssertionError("no PeerLostError")


@pytest.mark.parametrize("count", [1 << 18, 3 << 20])  # 1 MiB: one slot; 12 MiB: through OUT
def test_sigkill_of_a_broadcast_root_leaves_the_receivers_arrays_untouched_or_complete(count):
    outcomes = spawn_ranks(body_kill_broadcast_root, 3, count, timeout=90, comm_timeout=60,
                           env={**KEEP_GOING, "TENSORCOMM_CMA": "off"})
    assert outcomes[0].exitcode == -signal.SIGKILL
    for outcome in outcomes[1:]:
        assert outcome.ok, outcome.output
        assert outcome.result["untouched_or_complete"], outcome.result


def body_everyone_killed(path: str) -> None:
    with open(os.path.join(path, f"ready{tc.get_rank()}"), "w") as f:
        f.write("1")
    x = np.ones(1 << 18, np.float32)
    while True:
        tc.all_reduce(x)


def test_sigkill_of_every_rank_leaves_nothing_in_dev_shm(tmp_path):
    before = _dev_shm()
    outcomes = spawn_ranks(body_everyone_killed, 3, str(tmp_path), timeout=8)  # killed at the timeout
    assert all(o.exitcode is None for o in outcomes)  # SIGKILLed by the helper
    assert _dev_shm() == before


def body_every_collective_beyond_one_slot() -> None:
    """Arrays larger than a slot (1 MiB) take the pipelined and multi-round paths."""
    rank, size = tc.get_rank(), tc.get_world_size()
    n = 600_000  # float32: 2.4 MB per rank
    base = np.arange(n, dtype=np.float32) % 1000
    x = base + rank
    tc.all_reduce(x)
    np.testing.assert_array_equal(x, size * base + sum(range(size)))
    h = (np.arange(n) % 7).astype(np.float16) + rank  # accumulated in float32: 4.8 MB of terms
    tc.all_reduce(h, op=tc.ReduceOp.AVG)
    np.testing.assert_allclose(h.astype(np.float64), (np.arange(n) % 7) + (size - 1) / 2, rtol=1e-3)
    y = base + rank
    tc.reduce(y, dst=size - 1, op="max")
    np.testing.assert_array_equal(y, base + (size - 1 if rank == size - 1 else rank))
    b = np.full(n, rank, np.float64)
    tc.broadcast(b, src=1)
    assert (b == 1).all()
    big = np.full(4 * n, rank, np.float32)  # 9.6 MB: through the root's OUT region
    tc.broadcast(big, src=1)
    assert (big == 1).all()
    out = np.zeros(n * size, np.float32)
    tc.all_gather_into_tensor(out, base + rank)
    np.testing.assert_array_equal(out.reshape(size, n), np.stack([base + r for r in range(size)]))
    rs = np.zeros(n, np.float32)
    tc.reduce_scatter_tensor(rs, np.tile(base, size) + rank)
    np.testing.assert_array_equal(rs, size * base + sum(range(size)))
    a2a_in = np.repeat(np.arange(size, dtype=np.int64) + 10 * rank, n // 2)
    a2a_out = np.zeros_like(a2a_in)
    tc.all_to_all_single(a2a_out, a2a_in)
    np.testing.assert_array_equal(a2a_out, np.repeat(10 * np.arange(size, dtype=np.int64) + rank, n // 2))
    pieces = [np.full(n, r, np.float32) for r in range(size)] if rank == 0 else None
    got = np.zeros(n, np.float32)
    tc.scatter(got, pieces, src=0)
    assert (got == rank).all()
    gathered = [np.zeros(n, np.float32) for _ in range(size)] if rank == 0 else None
    tc.gather(np.full(n, rank, np.float32), gathered, dst=0)
    if rank == 0:
        assert all((gathered[r] == r).all() for r in range(size))


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_collective_beyond_one_slot(world_size):
    run_ranks(body_every_collective_beyond_one_slot, world_size, timeout=120)


def body_calls_beyond_a_small_out_region(total: int) -> dict:
    """Every OUT region a share of ``total`` bytes (``domain.OUT_TOTAL_BYTES``, as past 8
    members): an all-reduce whose parts outgrow it and a broadcast beyond it and a slot take
    their algorithms' other ways, with numpy's results."""
    from tensorcomm.transports.shm import domain

    domain.OUT_TOTAL_BYTES = total
    tc.init(timeout=60)
    rank, size = tc.get_rank(), tc.get_world_size()
    base = np.arange(2 << 20, dtype=np.float32) % 1000  # 8 MiB: reduced parts 2 MiB a member
    x = base + rank
    tc.all_reduce(x)
    np.testing.assert_array_equal(x, size * base + sum(range(size)))
    state = tc.WORLD._target()._last_plan.state
    out_bytes, staged = {state.d.out_bytes}, {state.staged}
    b = base[:1 << 20] + rank  # 4 MiB: beyond a slot and the region
    tc.broadcast(b, src=size - 1)
    np.testing.assert_array_equal(b, base[:1 << 20] + size - 1)
    staged.add(tc.WORLD._target()._last_plan.state.staged)
    tc.destroy()
    return {"out_bytes": out_bytes, "staged": staged}


def test_calls_beyond_a_small_out_region_give_numpys_results():
    results = run_ranks(body_calls_beyond_a_small_out_region, 4, 4 << 20, timeout=120, init=False)
    assert all(r == {"out_bytes": {1 << 20}, "staged": {False}} for r in results), results

