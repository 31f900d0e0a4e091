"""The functional frontend's small-call path: which arrays skip staging, and an input that may
share memory with its output is still copied first (in-process, no ranks; tests/fault/
test_aliasing.py runs the collectives on such arrays)."""

from __future__ import annotations

import numpy as np

from tensorcomm.frontends.functional import _plain, _unaliased


def test_only_contiguous_aligned_writable_arrays_of_a_supported_dtype_skip_staging() -> None:
    assert _plain(np.ones(4, np.float32))
    assert _plain(np.ones((2, 3), np.int64))
    frozen = np.ones(4, np.float32)
    frozen.flags.writeable = False
    unaligned = np.frombuffer(bytearray(17), np.float32, 4, 1)
    assert not unaligned.flags.aligned
    for other in (frozen, unaligned, np.ones((3, 4), np.float32).T, np.ones(8, np.float32)[::2],
                  np.array(1.0, np.float32), np.ones(4, np.dtype("datetime64[s]")),
                  np.ones(4, np.float32).view(np.recarray), [1.0, 2.0]):
        assert not _plain(other), other


def test_an_input_that_may_share_its_outputs_memory_is_copied() -> None:
    a, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    assert _unaliased(a, b) is a  # two arrays that own their memory: nothing to copy
    same = _unaliased(a, a)
    assert same is not a and np.array_equal(same, a)
    out = np.zeros(8, np.float32)
    inside = _unaliased(out[4:], out)  # a view of the output: a copy
    assert inside.base is None and not np.shares_memory(inside, out)
