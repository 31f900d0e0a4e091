"""Pack layouts (frontends/packing.py): TF's num_packs and bytes_per_pack rules, round trips."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorcomm.frontends import packing

DTYPES = [np.float32, np.float16, np.int64, ml_dtypes.bfloat16]


def _arrays(sizes, dtypes=(np.float32,)):
    return [np.arange(n, dtype=np.float64).astype(dtypes[i % len(dtypes)]).reshape(n, 1) + i
            for i, n in enumerate(sizes)]


def _pack_sizes(layout: packing.Layout) -> list[int]:
    return np.diff(layout.bounds).tolist()


def test_num_packs_tf_rule():
    arrays = _arrays([3, 4, 3])  # 10 elements
    (layout,) = packing.by_num_packs(arrays, 3)
    assert _pack_sizes(layout) == [3, 3, 4]  # total // k each, the last takes the remainder
    assert layout.indices == (0, 1, 2) and layout.offsets == (0, 3, 7, 10)
    (one,) = packing.by_num_packs(arrays, 1)
    assert _pack_sizes(one) == [10]


def test_num_packs_zero_is_one_pack_per_value_and_empty_packs_are_dropped():
    arrays = _arrays([3, 0, 4])
    (layout,) = packing.by_num_packs(arrays, 0)
    assert _pack_sizes(layout) == [3, 4]
    (many,) = packing.by_num_packs(_arrays([2, 1]), 5)  # 3 elements in 5 packs: 0,0,0,0,3
    assert _pack_sizes(many) == [3]
    (empty,) = packing.by_num_packs(_arrays([0, 0]), 2)
    assert _pack_sizes(empty) == [] and empty.packs(empty.pack(_arrays([0, 0]))) == []


def test_packs_are_per_dtype_in_first_appearance_order():
    arrays = _arrays([2, 3, 4, 5], dtypes=(np.float32, np.int64))
    layouts = packing.by_num_packs(arrays, 2)
    assert [layout.dtype for layout in layouts] == [np.dtype(np.float32), np.dtype(np.int64)]
    assert [layout.indices for layout in layouts] == [(0, 2), (1, 3)]
    assert [_pack_sizes(layout) for layout in layouts] == [[3, 3], [4, 4]]


def test_bytes_per_pack_greedy_in_reverse_order():
    arrays = _arrays([10, 10, 10, 10, 10])  # 40 bytes each in float32
    (layout,) = packing.by_bytes_per_pack(arrays, 50)
    assert layout.indices == (4, 3, 2, 1, 0)
    # a pack closes once it holds *more* than 50 bytes: 80, 80, 40
    assert _pack_sizes(layout) == [20, 20, 10]
    (exact,) = packing.by_bytes_per_pack(arrays, 40)  # 40 is not more than 40: two values a pack
    assert _pack_sizes(exact) == [20, 20, 10]
    (small,) = packing.by_bytes_per_pack(arrays, 1)
    assert _pack_sizes(small) == [10] * 5
    (whole,) = packing.by_bytes_per_pack(arrays, 0)  # TF: 0 packs everything together
    assert _pack_sizes(whole) == [50]


@pytest.mark.parametrize("rule", [packing.by_num_packs, packing.by_bytes_per_pack])
def test_bad_arguments(rule):
    with pytest.raises(ValueError, match="must be a non-negative integer, got -1"):
        rule([], -1)
    with pytest.raises(TypeError, match="must be an int"):
        rule([], 1.5)
    with pytest.raises(TypeError, match="must be an int"):
        rule([], True)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 50), min_size=0, max_size=12),
       dtype_count=st.integers(1, len(DTYPES)), num_packs=st.integers(0, 7),
       bytes_per_pack=st.integers(0, 300))
def test_round_trip_and_coverage(sizes, dtype_count, num_packs, bytes_per_pack):
    arrays = _arrays(sizes, DTYPES[:dtype_count])
    shapes = [a.shape for a in arrays]
    for layouts in (packing.by_num_packs(arrays, num_packs),
                    packing.by_bytes_per_pack(arrays, bytes_per_pack)):
        assert sorted(i for layout in layouts for i in layout.indices) == list(range(len(arrays)))
        restored = {}
        for layout in layouts:
            buffer = layout.pack(arrays)
            assert buffer.dtype == layout.dtype and buffer.size == layout.offsets[-1]
            packs = layout.packs(buffer)
            assert all(p.size > 0 and p.base is buffer for p in packs)
            assert sum(p.size for p in packs) == buffer.size
            for p in packs:  # reducing a pack in place must land in the values
                p *= 2
            restored.update(layout.unpack(buffer, shapes))
        for i, a in enumerate(arrays):
            assert restored[i].shape == a.shape and restored[i].dtype == a.dtype
            np.testing.assert_array_equal(restored[i], a * 2)
    if num_packs and arrays:
        for layout in packing.by_num_packs(arrays, num_packs):
            total = layout.offsets[-1]
            expected = [total // num_packs] * (num_packs - 1) + [total - total // num_packs * (num_packs - 1)]
            assert _pack_sizes(layout) == [s for s in expected if s]
