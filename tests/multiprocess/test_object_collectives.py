"""Object collectives on 1-5 real ranks, including objects moved in many chunks."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.frontends import object_collectives
from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.multiprocess


def _obj(rank: int):
    """Objects of very different pickled sizes per rank (a few bytes to ~10 kB)."""
    return {"rank": rank, "blob": b"x" * (rank * 2500), "array": np.arange(rank, dtype=np.int16)} \
        if rank % 2 else ("tuple", rank, None)


def _same(got, expected) -> bool:
    if isinstance(expected, dict):
        return got.keys() == expected.keys() and got["blob"] == expected["blob"] and \
            np.array_equal(got["array"], expected["array"])
    return got == expected


def body_objects(chunk_bytes: int) -> None:
    object_collectives.CHUNK_BYTES = chunk_bytes  # small chunks: many rounds, uneven per rank
    rank, size = tc.get_rank(), tc.get_world_size()

    gathered = [None] * size
    tc.all_gather_object(gathered, _obj(rank))
    assert all(_same(gathered[r], _obj(r)) for r in range(size))

    for root in range(size):
        items = [_obj(root), "hello", [1, 2, 3]] if rank == root else [None, None, None]
        tc.broadcast_object_list(items, src=root)
        assert _same(items[0], _obj(root)) and items[1:] == ["hello", [1, 2, 3]]

        target = [f"untouched-{i}" for i in range(size)]
        tc.gather_object(_obj(rank), target if rank == root else None, dst=root)
        if rank == root:
            assert all(_same(target[r], _obj(r)) for r in range(size))
        tc.gather_object(rank, target, dst=root)  # non-roots may pass a list: left untouched
        if rank != root:
            assert target == [f"untouched-{i}" for i in range(size)]

        out = [None]
        inputs = [_obj(r + root) for r in range(size)] if rank == root else None
        tc.scatter_object_list(out, inputs, src=root)
        assert _same(out[0], _obj(rank + root))


def body_errors() -> None:
    rank, size = tc.get_rank(), tc.get_world_size()
    with pytest.raises(TypeError, match="object_list must be a list"):
        tc.all_gather_object((None,) * size, 1)
    with pytest.raises(ValueError, match=f"object_list must hold {size} items"):
        tc.all_gather_object([None], 1)
    with pytest.raises(TypeError, match="obj cannot be pickled"):
        tc.all_gather_object([None] * size, lambda: None)
    with pytest.raises(ValueError, match="must hold at least one item"):
        tc.scatter_object_list([], None)
    with pytest.raises(ValueError, match="src=7 is out of range"):
        tc.broadcast_object_list([1], src=7)
    with pytest.raises(TypeError, match="dst must be an int"):
        tc.gather_object(1, None, dst="0")
    # a length mismatch is reported after the transfer, so nobody is left waiting
    items = [1, 2] if rank == 0 else [None]
    if rank == 0:
        tc.broadcast_object_list(items, src=0)
    else:
        with pytest.raises(ValueError, match="holds 1 items but src 0 sent 2"):
            tc.broadcast_object_list(items, src=0)
    gathered = [None] * size
    tc.all_gather_object(gathered, rank)
    assert gathered == list(range(size))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_object_collectives(world_size):
    run_ranks(body_objects, world_size, 1000, timeout=60)


def test_one_round_and_errors():
    run_ranks(body_objects, 2, 1 << 30, timeout=60)
    run_ranks(body_errors, 3, timeout=60)
