"""Bad arguments raise TypeError/ValueError at once, naming the argument: checked in the test
process, on a world of one met on an in-memory store, one case per test.

What needs several ranks (a local error leaves every rank able to go on together) is in
tests/multiprocess/test_errors.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

import tensorcomm as tc
from tensorcomm.ops import Exscan, Scan

from helpers import COLLECTIVES, world_of_one


@pytest.fixture
def world() -> Iterator[None]:
    """A world of one in this process, destroyed after the test."""
    with world_of_one():
        yield


def _x() -> np.ndarray:
    return np.ones(4, np.float32)


def _readonly() -> np.ndarray:
    array = np.ones(3)
    array.flags.writeable = False
    return array


def _gather_list_of_another_shape() -> list[np.ndarray]:
    return [np.ones(5, np.float32)]


def _outputs_of_another_dtype() -> list[np.ndarray]:
    return [np.ones(4, np.float64)]


# (id, exception, message pattern, the call); the world has one rank, so lists of 3 or 2 arrays
# are the wrong length.
CASES: list[tuple[str, type[Exception], str, Callable[[], object]]] = [
    ("all_reduce-list", TypeError, "tensor: expected an array", lambda: tc.all_reduce([1.0, 2.0])),
    ("all_reduce-int-op", TypeError, "op: expected a tensorcomm.ReduceOp",
     lambda: tc.all_reduce(_x(), op=3)),
    ("all_reduce-unknown-op", ValueError, "op: unknown reduction 'mean'",
     lambda: tc.all_reduce(_x(), op="mean")),
    ("all_reduce-max-complex", ValueError, "not defined for complex",
     lambda: tc.all_reduce(np.ones(2, np.complex64), op="max")),
    ("all_reduce-band-float", ValueError, "BAND is not defined for float32",
     lambda: tc.all_reduce(_x(), op=tc.ReduceOp.BAND)),
    ("all_reduce-async-op-int", TypeError, "async_op must be a bool",
     lambda: tc.all_reduce(_x(), async_op=1)),
    ("all_reduce-group-float", TypeError, "group must be", lambda: tc.all_reduce(_x(), group=3.5)),
    ("all_reduce-unknown-group-name", ValueError, "no group is named 'nope'",
     lambda: tc.all_reduce(_x(), group="nope")),
    ("all_reduce-object-dtype", TypeError, "dtype object is not supported",
     lambda: tc.all_reduce(np.array([None, 1]))),
    ("all_reduce-read-only", ValueError, r"read-only \(as are arrays that Ray .*arr\.copy\(\)",
     lambda: tc.all_reduce(_readonly())),
    ("reduce-dst-str", TypeError, "dst must be an int", lambda: tc.reduce(_x(), dst="0")),
    ("reduce-dst-bool", TypeError, "dst must be an int", lambda: tc.reduce(_x(), dst=True)),
    ("reduce-dst-out-of-range", ValueError, "dst=99 is out of range",
     lambda: tc.reduce(_x(), dst=99)),
    ("broadcast-src-negative", ValueError, "src=-1 is out of range",
     lambda: tc.broadcast(_x(), src=-1)),
    # the small-call paths of broadcast and the tensor variants check as the general path does
    ("broadcast-src-bool", TypeError, "src must be an int", lambda: tc.broadcast(_x(), src=True)),
    ("broadcast-src-float", TypeError, "src must be an int", lambda: tc.broadcast(_x(), src=0.0)),
    ("broadcast-async-op-int", TypeError, "async_op must be a bool",
     lambda: tc.broadcast(_x(), async_op=1)),
    ("broadcast-group-float", TypeError, "group must be", lambda: tc.broadcast(_x(), group=3.5)),
    ("all_gather_into_tensor-dtype", ValueError, "dtypes must match",
     lambda: tc.all_gather_into_tensor(np.ones(2, np.float64), np.ones(2, np.float32))),
    ("all_gather_into_tensor-read-only", ValueError, "read-only",
     lambda: tc.all_gather_into_tensor(_readonly(), _x())),
    ("reduce_scatter_tensor-size", ValueError, "must hold group size",
     lambda: tc.reduce_scatter_tensor(np.ones(2), np.ones(3))),
    ("reduce_scatter_tensor-dtype", ValueError, "dtypes must match",
     lambda: tc.reduce_scatter_tensor(np.ones(2, np.float32), np.ones(2, np.float64))),
    ("reduce_scatter_tensor-async-op-none", TypeError, "async_op must be a bool",
     lambda: tc.reduce_scatter_tensor(_x(), _x(), async_op=None)),
    ("all_to_all_single-dtype", ValueError, "dtypes must match",
     lambda: tc.all_to_all_single(np.ones(2, np.float32), np.ones(2, np.float64))),
    ("all_to_all_single-scalar", ValueError, "at least one dimension",
     lambda: tc.all_to_all_single(np.ones(2), np.ones(()))),
    ("all_to_all_single-rows", ValueError, "must agree beyond dim 0",
     lambda: tc.all_to_all_single(np.ones((2, 3)), np.ones((2, 2)))),
    ("all_to_all_single-own-block", ValueError, "must be equal",
     lambda: tc.all_to_all_single(np.ones(3), np.ones(2))),
    ("all_gather-list-length", tc.ArgumentMismatchError, "must hold 1 arrays",
     lambda: tc.all_gather([_x()] * 3, _x())),
    ("all_gather-not-a-list", TypeError, "tensor_list must be a list",
     lambda: tc.all_gather(_x(), _x())),
    ("gather-list-length", TypeError, "gather_list must hold",
     lambda: tc.gather(_x(), [_x()] * 2, dst=0)),
    ("gather-list-shape", TypeError,
     r"gather_list\[0\] is float32\[5\] but the tensor is float32\[4\]: shapes",
     lambda: tc.gather(_x(), _gather_list_of_another_shape(), dst=0)),
    ("gather-list-dtype", ValueError, "dtypes must match",
     lambda: tc.gather(_x(), [np.ones(4, np.float64)], dst=0)),
    ("gather-list-missing", ValueError, "gather_list is required",
     lambda: tc.gather(_x(), None, dst=0)),
    ("all_gather_into_tensor-size", ValueError, "must hold group size",
     lambda: tc.all_gather_into_tensor(np.ones(3), np.ones(2))),
    ("isend-negative-tag", ValueError, "tag must be in", lambda: tc.isend(_x(), 0, tag=-1)),
    ("all_to_all-output-dtype", ValueError, r"output_tensor_list\[0\] is float64\[4\]",
     lambda: tc.all_to_all(_outputs_of_another_dtype(), [_x()])),
    ("new_group-repeated-rank", ValueError, "ranks must be unique", lambda: tc.new_group([0, 0])),
    ("new_group-str-rank", TypeError, r"ranks\[0\] must be an int", lambda: tc.new_group(["a"])),
    ("all_to_all_single-splits", ValueError, "input_split_sizes must be non-negative and sum",
     lambda: tc.all_to_all_single(np.ones((1, 2)), np.ones((1, 2)), None, [2])),
    ("zeros-negative", ValueError, "zeros: shape must not be negative", lambda: tc.zeros((2, -1))),
    ("zeros-float-shape", TypeError, r"zeros: shape\[0\] must be an int", lambda: tc.zeros([2.0])),
    ("empty-str-shape", TypeError, "empty: shape must be an int", lambda: tc.empty("4")),
    ("empty-object-dtype", ValueError, "dtype object holds Python objects", lambda: tc.empty(3, object)),
    ("zeros-bad-dtype", TypeError, "zeros: dtype must be a numpy dtype", lambda: tc.zeros(3, "float33")),
    ("zeros-group-float", TypeError, "group must be", lambda: tc.zeros(3, group=3.5)),
    ("scan-list", TypeError, "scan: tensor", lambda: tc.scan([1, 2])),
    ("exscan-unknown-op", ValueError, "exscan: op", lambda: tc.exscan(np.ones(2), op="bogus")),
    ("scan-bxor-float", ValueError, "scan: op", lambda: tc.scan(np.ones(2), op="bxor")),
    ("scan-band-float", ValueError, "scan: op", lambda: tc.scan(np.ones(2, np.float32), op="band")),
    ("scan-async-op-int", TypeError, "scan: async_op", lambda: tc.scan(np.ones(2), async_op=1)),
    ("exscan-float-group", TypeError, "exscan: group", lambda: tc.exscan(np.ones(2), group=2.0)),
    ("split-str-color", TypeError, "split: color", lambda: tc.WORLD.split("red")),
    ("split-bool-color", TypeError, "split: color", lambda: tc.WORLD.split(False)),
    ("split-str-key", TypeError, "split: key", lambda: tc.WORLD.split(0, key="1")),
    ("split-huge-color", ValueError, "split: color", lambda: tc.WORLD.split(-(1 << 64))),
    ("subgroups-int", TypeError, "ranks_per_subgroup_list", lambda: tc.new_subgroups_by_enumeration(5)),
    ("subgroups-repeated-rank", ValueError, "rank 0 is in",
     lambda: tc.new_subgroups_by_enumeration([[0], [0]])),
    ("subgroups-empty", ValueError, "must not be empty", lambda: tc.new_subgroups_by_enumeration([[]])),
    ("subgroups-str", TypeError, "ranks_per_subgroup_list", lambda: tc.new_subgroups_by_enumeration("01")),
    ("subgroups-no-list", ValueError, "ranks_per_subgroup_list", lambda: tc.new_subgroups_by_enumeration([])),
    ("subgroups-none-entry", TypeError, r"ranks_per_subgroup_list\[1\]",
     lambda: tc.new_subgroups_by_enumeration([[0], None])),
    ("scan-read-only", ValueError, "scan: tensor", lambda: tc.scan(_readonly())),
    ("Scan-float-op", TypeError, "Scan: op", lambda: Scan(op=3.0)),
    ("Exscan-int-group", TypeError, "Exscan: group", lambda: Exscan(group=7)),
    ("scatter-list-length", tc.ArgumentMismatchError, "scatter_list must hold 1 arrays",
     lambda: tc.scatter(_x(), [_x(), _x()], src=0)),
    ("scatter-list-missing", ValueError, "scatter_list is required on the source",
     lambda: tc.scatter(_x(), None, src=0)),
    ("reduce_scatter-list-length", tc.ArgumentMismatchError, "input_list must hold 1 arrays",
     lambda: tc.reduce_scatter(_x(), [_x(), _x(), _x()])),
    ("barrier-async-op-int", TypeError, "barrier: async_op must be a bool", lambda: tc.barrier(async_op=1)),
]


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_collective_has_a_case(collective: str) -> None:
    """A collective of ``signature.COLLECTIVES`` needs a case of its public function's own name."""
    assert collective in {case[0].split("-")[0] for case in CASES}, f"no CASES entry for {collective}"


@pytest.mark.parametrize(("exception", "match", "call"), [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_bad_argument_raises_naming_it(world: None, exception: type[Exception], match: str,
                                       call: Callable[[], object]) -> None:
    with pytest.raises(exception, match=match):
        call()


def test_broadcast_root_may_pass_a_read_only_array(world: None) -> None:
    x = _readonly()
    tc.broadcast(x, src=np.int64(0))  # a numpy integer names the root too
    tc.broadcast(x, group_src=0)


def test_a_world_of_one_scans_splits_and_enumerates(world: None) -> None:
    x = np.arange(6, dtype=np.float16).reshape(2, 3)
    tc.scan(x, op="avg")
    np.testing.assert_array_equal(x, np.arange(6).reshape(2, 3))
    y = np.full(3, 5, np.int64)
    assert tc.exscan(y, op="prod", async_op=True).wait(timeout=10) is True
    assert (y == 5).all()  # rank 0's exclusive prefix is empty: left as it was
    assert (Scan("max")(np.ones(2)) == 1).all() and Exscan("sum")(np.ones(2)) is None
    alone = tc.WORLD.split(3, key=-1)
    assert alone is not None and alone.ranks == (0,)
    z = np.ones(2, np.float32)
    tc.scan(z, group=alone)
    assert tc.WORLD.split(None) is None and tc.WORLD.split(-1) is None
    mine, subgroups = tc.new_subgroups_by_enumeration([[0]])
    assert mine is subgroups[0] and mine.ranks == (0,)


def test_calls_go_on_after_every_bad_argument(world: None) -> None:
    for _, exception, _, call in CASES:
        with pytest.raises(exception):
            call()
    x = _x()
    tc.all_reduce(x)  # nothing was half-issued
    assert (x == 1).all()


def test_calls_before_init_say_so() -> None:
    with pytest.raises(RuntimeError, match="not initialized"):
        tc.all_reduce(np.ones(2))
    assert not tc.is_initialized()
