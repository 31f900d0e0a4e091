"""Object point-to-point (mpi4py's comm.send/recv/isend/irecv) on real ranks, both transports."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.frontends import object_collectives
from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.multiprocess

TRANSPORTS = {"shm": {}, "tcp": {"TENSORCOMM_TRANSPORT": "tcp"}}


def _obj(rank: int, i: int) -> dict:
    return {"from": rank, "i": i, "blob": b"y" * (1000 * i), "array": np.arange(i, dtype=np.float32)}


def _check(got: dict, rank: int, i: int) -> None:
    want = _obj(rank, i)
    assert got["from"] == rank and got["i"] == i and got["blob"] == want["blob"], (got["from"], got["i"])
    np.testing.assert_array_equal(got["array"], want["array"])


def body_ring() -> None:
    """Every rank sends objects to the next and receives from the previous, in several forms."""
    object_collectives.CHUNK_BYTES = 700  # objects of several pieces, a different count each
    rank, size = tc.get_rank(), tc.get_world_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    # mpi4py's pattern: isend first, then a blocking recv
    sent = tc.isend_object(_obj(rank, 3), dst=right, tag=7)
    _check(tc.recv_object(src=left, tag=7), left, 3)
    sent.wait()
    assert sent.is_completed()
    # several objects in flight between one pair with one tag, received and waited out of order
    sends = [tc.isend_object(_obj(rank, i), dst=right, tag=1) for i in range(4)]
    receives = [tc.irecv_object(src=left, tag=1) for _ in range(4)]
    for i in (3, 1, 0, 2):
        _check(receives[i].result(), left, i)
        assert receives[i].source == left
    for work in sends:
        work.wait()
    # an array and an object sent with the same tag: each receive takes its own kind
    # (sends that do not block: a ring of blocking sends may wait for each other, as in MPI)
    array, obj = (lambda: tc.isend(np.full(3, rank), dst=right, tag=5)), \
        (lambda: tc.isend_object("object", dst=right, tag=5))
    sends = [obj(), array()] if rank % 2 else [array(), obj()]
    into = np.zeros(3, dtype=np.int64)
    tc.recv(into, src=left, tag=5)
    assert tc.recv_object(src=left, tag=5) == "object" and (into == left).all()
    for work in sends:
        work.wait()
    # from any rank: Work.source names the sender; is_completed polls without waiting
    if rank == 0:
        got = {}
        for _ in range(size - 1):
            work = tc.irecv_object(tag=9)
            while not work.is_completed():
                pass
            got[work.source] = work.result()
        assert got == {r: ("hello", r) for r in range(1, size)}
    else:
        tc.send_object(("hello", rank), dst=0, tag=9)
    tc.barrier()


def body_errors() -> None:
    rank = tc.get_rank()
    with pytest.raises(TypeError, match="isend_object: obj cannot be pickled"):
        tc.isend_object(lambda: None, dst=1 - rank)
    with pytest.raises(ValueError, match="dst=5 is out of range"):
        tc.send_object(1, dst=5)
    with pytest.raises(ValueError, match=r"tag must be in 0 \.\. 2\*\*31-1"):
        tc.irecv_object(src=0, tag=-1)
    with pytest.raises(TypeError, match="src must be an int"):
        tc.recv_object(src="0")
    # a receive that nobody answers times out, and is still pending: a later send completes it
    work = tc.irecv_object(src=1 - rank, tag=3)
    with pytest.raises(tc.CommTimeoutError):
        work.wait(0.05)
    tc.barrier()
    tc.send_object(rank, dst=1 - rank, tag=3)
    assert work.result() == 1 - rank


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_object_p2p(world_size: int, transport: str) -> None:
    run_ranks(body_ring, world_size, timeout=60, env=TRANSPORTS[transport])


def test_object_p2p_errors() -> None:
    run_ranks(body_errors, 2, timeout=60)
