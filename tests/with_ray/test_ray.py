"""tensorcomm groups of Ray actors on a local Ray cluster: collectives inside the actors against
numpy, the secret kept out of command lines and environments, a dead actor named on the others,
``ray.util.collective`` with the tensorcomm backend, and bad arguments."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'tensorcomm[ray]')")

import tensorcomm as tc  # noqa: E402
import tensorcomm.ray as tcray  # noqa: E402

pytestmark = pytest.mark.multiprocess

# The helpers below run inside the actors; this module is not importable there, so Ray must
# pickle them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@ray.remote
class Rank:
    """An actor that runs whatever function it is given (``run``), as a user's actor would."""

    def run(self, fn, *args):
        return fn(*args)

    def pid(self):
        return os.getpid()


def _collectives() -> dict:
    rank, size = tc.get_rank(), tc.get_world_size()
    x = np.arange(1000, dtype=np.float32) * (rank + 1)
    tc.all_reduce(x)
    assert (x == np.arange(1000) * sum(range(1, size + 1))).all()
    outs = [np.empty(3, np.int64) for _ in range(size)]
    tc.all_gather(outs, np.full(3, rank, np.int64))
    assert [int(o[0]) for o in outs] == list(range(size))
    y = np.full(5, rank, np.float64)
    tc.broadcast(y, src=size - 1)
    assert (y == size - 1).all()
    received = [np.empty(2, np.int32) for _ in range(size)]
    tc.all_to_all(received, [np.full(2, 10 * rank + j, np.int32) for j in range(size)])
    assert [int(r[0]) for r in received] == [10 * j + rank for j in range(size)]
    pair = tc.new_group([0, 1])
    if rank in (0, 1):
        z = np.ones(4)
        tc.all_reduce(z, group=pair)
        assert (z == 2).all()
    return {"rank": rank, "transport": tc.WORLD.transport_kind.name}


def _secret_and_traces() -> tuple[str, str, str]:
    world = tc.WORLD._world
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = f.read().decode(errors="replace")
    return world.rendezvous.secret.decode(), cmdline, repr(dict(os.environ))


def _all_reduce_until_failure() -> str:
    try:
        while True:
            tc.all_reduce(np.ones(100, np.float32))
    except tc.CommError as exc:
        return f"{type(exc).__name__}: {exc}"


def _collective_backend(rank: int, size: int) -> list:
    import ray.util.collective as col

    tcray.register_collective_backend()
    col.init_collective_group(size, rank, backend="tensorcomm", group_name="tc-test")
    x = np.full(4, rank + 1, np.float32)
    col.allreduce(x, group_name="tc-test")
    y = np.full(2, rank, np.int64)
    col.broadcast(y, src_rank=1, group_name="tc-test")
    gathered = [np.empty(1, np.float64) for _ in range(size)]
    col.allgather(gathered, np.array([rank * 1.5]), group_name="tc-test")
    col.barrier(group_name="tc-test")
    col.destroy_collective_group("tc-test")
    return [float(x[0]), int(y[0]), [float(g[0]) for g in gathered]]


@contextlib.contextmanager
def _group(count: int, env: dict[str, str] | None = None) -> Iterator[list[Any]]:
    """``count`` actors made a tensorcomm group; destroyed and killed afterwards."""
    actors = [Rank.options(runtime_env={"env_vars": env or {}}).remote() for _ in range(count)]
    try:
        tcray.init_group(actors, timeout=60)
        yield actors
        tcray.destroy_group(actors)
    finally:
        for actor in actors:
            ray.kill(actor)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_actors_form_a_group(cluster, transport):
    env = {"TENSORCOMM_TRANSPORT": "tcp"} if transport == "tcp" else {}
    with _group(3, env) as actors:
        results = ray.get([a.run.remote(_collectives) for a in actors])
        assert results == [{"rank": r, "transport": transport.upper()} for r in range(3)]


@pytest.mark.timeout(300)
def test_secret_stays_out_of_command_lines_and_environments(cluster):
    with _group(2) as actors:
        for secret, cmdline, environ in ray.get([a.run.remote(_secret_and_traces) for a in actors]):
            digits = secret.removeprefix("generated:")  # a generated secret: 64 hex digits
            assert len(bytes.fromhex(digits)) == 32
            assert digits not in cmdline and digits not in environ


@pytest.mark.timeout(300)
def test_dead_actor_is_a_peer_lost_error_naming_it(cluster):
    actors = [Rank.remote() for _ in range(3)]
    tcray.init_group(actors, timeout=60)
    loops = [a.run.remote(_all_reduce_until_failure) for a in actors]
    time.sleep(1.0)
    ray.kill(actors[2])
    for message in ray.get(loops[:2], timeout=120):
        assert message.startswith("PeerLostError: peer rank 2 was lost"), message
    for actor in actors[:2]:
        ray.kill(actor)


@pytest.mark.timeout(300)
def test_ray_util_collective_backend(cluster):
    tcray.register_collective_backend()
    tcray.register_collective_backend()  # twice is a no-op
    actors = [Rank.remote() for _ in range(2)]
    results = ray.get([a.run.remote(_collective_backend, rank, 2) for rank, a in enumerate(actors)])
    assert results == [[3.0, 1, [0.0, 1.5]]] * 2
    for actor in actors:
        ray.kill(actor)


@pytest.mark.timeout(300)
def test_bad_arguments_and_a_failed_join(cluster):
    with pytest.raises(TypeError, match=r"actors\[1\]: expected a Ray actor handle, got int"):
        tcray.init_group([Rank.remote(), 3])
    with pytest.raises(TypeError, match="non-empty list"):
        tcray.init_group([])
    actor = Rank.remote()
    with pytest.raises(ValueError, match="actor 0 appears more than once"):
        tcray.init_group([actor, actor])
    other = Rank.remote()
    tcray.init_group([actor], timeout=30)  # a world of one
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="already initialized"):
        tcray.init_group([actor, other], timeout=60)
    assert time.monotonic() - started < 50  # the other actor was not left waiting for its timeout
    tcray.destroy_group([actor, other])
    for a in (actor, other):
        ray.kill(a)


@pytest.mark.timeout(120)
def test_ray_store_behaves_as_a_store(cluster):
    store = tcray.RayStore.create(timeout=5)
    store.set("a", b"1")
    store.set("a", "two")
    assert store.get("a") == b"two" and store.check(["a"]) and not store.check(["a", "b"])
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5 and store.get("n") == b"5"
    with pytest.raises(ValueError, match="not a counter"):
        store.add("a", 1)
    with pytest.raises(tc.CommTimeoutError, match="'missing'"):
        store.get("missing", timeout=0.2)
    with pytest.raises(tc.CommTimeoutError, match="'b'") as caught:
        store.wait(["a", "b"], timeout=0.2)
    assert "'a'" not in str(caught.value)
    with pytest.raises(TypeError):
        store.set("c", 3)
    assert store.delete("a") and not store.delete("a")
    assert len(bytes.fromhex(store.secret().removeprefix("generated:"))) == 32
    store.stop()
    with pytest.raises(tc.RendezvousError, match="gone or not answering"):
        store.get("n")
