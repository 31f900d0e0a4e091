"""Inputs that share memory with outputs: every collective reads its inputs as they were before
any output is written, on shared memory and TCP alike; outputs that share memory with each other
are a ValueError on the calling rank."""

from __future__ import annotations

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.fault

TRANSPORTS = {"tcp": {"TENSORCOMM_TRANSPORT": "tcp"}, "shm": {}}
# 8 elements fit one shared-memory slot; 400 000 float32 (1.6 MB) take several rounds.
COUNTS = [8, 400_000]


def _data(rank: int, count: int) -> np.ndarray:
    return np.arange(count, dtype=np.float32) % 1000 + 1000 * rank


def body_in_place(count: int) -> dict[str, bool]:
    """Each in-place convention, checked against what the same call gives on separate arrays."""
    n, r = tc.get_world_size(), tc.get_rank()
    block = count // n
    results = {}

    x = _data(r, block * n)  # reduce_scatter_tensor: the output is this rank's block of the input
    expected = sum(_data(q, block * n) for q in range(n)).reshape(n, -1)[r]
    tc.reduce_scatter_tensor(x.reshape(n, -1)[r], x)
    results["reduce_scatter_tensor"] = np.array_equal(x.reshape(n, -1)[r], expected)

    parts = [_data(r, block) + q for q in range(n)]  # reduce_scatter: the output is input_list[r]
    expected = sum(_data(q, block) + r for q in range(n))
    tc.reduce_scatter(parts[r], parts)
    results["reduce_scatter"] = np.array_equal(parts[r], expected)

    out = np.zeros(block * n, np.float32)  # all_gather_into_tensor: the input is its own block
    out.reshape(n, -1)[r] = _data(r, block)
    tc.all_gather_into_tensor(out, out.reshape(n, -1)[r])
    results["all_gather_into_tensor"] = np.array_equal(out,
                                                       np.concatenate([_data(q, block) for q in range(n)]))

    outs = [np.zeros(block, np.float32) for _ in range(n)]  # all_gather: the input is another slot
    source = outs[(r + 1) % n]
    source[...] = _data(r, block)
    tc.all_gather(outs, source)
    results["all_gather"] = all(np.array_equal(outs[q], _data(q, block)) for q in range(n))

    x = _data(r, block * n)  # all_to_all_single(x, x)
    expected = np.concatenate([_data(q, block * n).reshape(n, -1)[r] for q in range(n)])
    tc.all_to_all_single(x, x)
    results["all_to_all_single"] = np.array_equal(x, expected)

    blocks = [_data(r, block) + q for q in range(n)]  # all_to_all(lst, lst)
    tc.all_to_all(blocks, blocks)
    results["all_to_all"] = all(np.array_equal(blocks[q], _data(q, block) + r) for q in range(n))

    gathered = [np.zeros(block, np.float32) for _ in range(n)]  # gather: the input is its own slot
    gathered[r][...] = _data(r, block)
    tc.gather(gathered[r], gathered if r == 0 else None, dst=0)
    results["gather"] = r != 0 or all(np.array_equal(gathered[q], _data(q, block)) for q in range(n))

    pieces = [_data(0, block) + q for q in range(n)]  # scatter: the output is scatter_list[root]
    target = pieces[0] if r == 0 else np.zeros(block, np.float32)
    tc.scatter(target, pieces if r == 0 else None, src=0)
    results["scatter"] = np.array_equal(target, _data(0, block) + r)
    return results


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_inputs_sharing_memory_with_outputs_are_read_first(world_size, count, transport):
    for rank, results in enumerate(run_ranks(body_in_place, world_size, count, timeout=90,
                                             env=TRANSPORTS[transport])):
        assert all(results.values()), (rank, results)


def body_shared_outputs() -> list[str]:
    n = tc.get_world_size()
    x = np.zeros(4, np.float32)
    big = np.zeros(4 * n + 2, np.float32)
    overlapping = [big[2 * q:2 * q + 4] for q in range(n)]  # each overlaps its neighbours
    messages = []
    for call in (lambda: tc.all_gather([x] * n, x.copy()),
                 lambda: tc.all_gather(overlapping, x.copy()),
                 lambda: tc.all_to_all([x] * n, [x.copy() for _ in range(n)]),
                 lambda: tc.gather(x.copy(), [x] * n, dst=tc.get_rank())):
        with pytest.raises(ValueError, match="share memory") as info:
            call()
        messages.append(str(info.value))
    tc.barrier()  # the group is still usable: nothing was sent
    return messages


def test_outputs_sharing_memory_are_refused_before_anything_is_sent():
    for messages in run_ranks(body_shared_outputs, 2, timeout=60):
        assert messages[0].startswith("all_gather: tensor_list[0] and tensor_list[1] share memory")
        assert "gather_list" in messages[3]
