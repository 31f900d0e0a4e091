"""``destroy()`` then ``init()`` again in one job: every world meets on its own generation of
store keys, under the launcher's store and when rank 0 hosts the store itself."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import free_port, run_ranks

pytestmark = pytest.mark.fault

TRANSPORTS = {"tcp": {"TENSORCOMM_TRANSPORT": "tcp"}, "shm": {}}
WORLDS = 4


def body_worlds(port: int | None, timeout: float) -> list[float]:
    """Init, use the world and a subgroup, destroy; ``WORLDS`` times in a row."""
    if port is not None:  # rank 0 hosts the store: no launcher in between
        os.environ["TENSORCOMM_STORE_HOSTED"] = "0"
        os.environ["MASTER_PORT"] = str(port)
    sums = []
    for generation in range(WORLDS):
        tc.init(timeout=timeout)
        n = tc.get_world_size()
        x = np.full(4, tc.get_rank() + generation, np.float32)
        tc.all_reduce(x)
        pair = tc.new_group([0, 1])
        if tc.get_rank() in (0, 1):
            tc.all_reduce(x, group=pair)
        tc.barrier()
        sums.append(float(x[0]))
        assert float(x[0]) == (sum(range(n)) + n * generation) * (2 if tc.get_rank() < 2 else 1)
        tc.destroy()
    return sums


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("store", ["launcher", "rank0"])
def test_init_after_destroy_meets_a_new_world(store, transport):
    port = free_port() if store == "rank0" else None
    results = run_ranks(body_worlds, 3, port, 20.0, init=False, timeout=90, env=TRANSPORTS[transport])
    assert len({tuple(r) for r in results[:2]}) == 1


def body_explicit_store(port: int, secret_dir: str) -> list[float]:
    """``init(store=...)`` on a store the caller holds, no TENSORCOMM_SECRET: twice in a row."""
    from tensorcomm.rendezvous import TCPStore

    del os.environ["TENSORCOMM_SECRET"]
    os.environ.update(TENSORCOMM_SECRET_DIR=secret_dir, TENSORCOMM_STORE_HOSTED="0")
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = TCPStore("127.0.0.1", port, b"the store's own key", timeout=20)
    sums = []
    for _ in range(2):
        tc.init(store=store, rank=rank, world_size=size, timeout=20)
        x = np.ones(4, np.float32)
        tc.all_reduce(x)
        sums.append(float(x[0]))
        tc.destroy()
    store.close()
    return sums


def test_init_on_a_store_the_caller_holds(tmp_path):
    from tensorcomm.rendezvous import TCPStoreServer

    secret_dir = tmp_path / "secrets"
    secret_dir.mkdir(mode=0o700)
    with TCPStoreServer("127.0.0.1", 0, b"the store's own key") as server:
        results = run_ranks(body_explicit_store, 3, server.port, str(secret_dir), init=False, timeout=60)
    assert results == [[3.0, 3.0]] * 3
