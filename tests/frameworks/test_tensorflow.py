"""TensorFlow's own objects in tensorcomm.cross_device, on real ranks with TensorFlow imported.

Runs where TensorFlow is installed (``tensorflow-cpu``; tested with 2.21), e.g.
``PYTHONPATH=src /work/venvs/tf/bin/python -m pytest -m "" tests/frameworks/test_tensorflow.py``;
skips elsewhere. The values a tf.distribute program hands its cross-device ops:
``tf.distribute.ReduceOp``, ``tf.Tensor``, ``tf.Variable`` and ``tf.IndexedSlices``, checked
against numpy, with TensorFlow's types coming back.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tensorcomm.testing import run_ranks

pytestmark = pytest.mark.multiprocess
tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install tensorflow-cpu)")

SHAPE = (6, 3)


def _slices(rank: int, replica: int) -> object:
    rows = [(rank + 2 * replica + j) % SHAPE[0] for j in range(3)] + [rank]  # a row repeated
    return tf.IndexedSlices(tf.fill((4, SHAPE[1]), 10.0 * rank + replica), tf.constant(rows),
                            tf.constant(SHAPE))


def body_tf_values() -> None:
    import tensorcomm as tc
    from tensorcomm import cross_device as cd

    rank, size = tc.get_rank(), tc.get_world_size()
    for strategy in (cd.ReductionToOneDevice(), cd.AllReduceCrossDeviceOps(num_packs=1),
                     cd.CollectiveAllReduce(bytes_per_pack=0)):
        for op, mean in ((tf.distribute.ReduceOp.SUM, False), (tf.distribute.ReduceOp.MEAN, True)):
            # a tf.Tensor per replica (two on odd ranks), a tf.Variable, a bfloat16 tensor
            replicas = [tf.constant(np.full((2, 3), rank + k + 1.0, np.float32)) for k in range(rank % 2 + 1)]
            variable = tf.Variable(tf.range(4, dtype=tf.float64) * (rank + 1))
            half = tf.constant([rank + 1.0, 2.0], dtype=tf.bfloat16)
            got = strategy.batch_reduce(op, [(replicas, None), (variable, None), (half, size - 1)])
            count = sum(rank_ % 2 + 1 for rank_ in range(size))
            total = sum(r + k + 1.0 for r in range(size) for k in range(r % 2 + 1))
            assert type(got[0]) is type(replicas[0]) and got[0].dtype == tf.float32
            np.testing.assert_allclose(got[0].numpy(), np.full((2, 3), total / (count if mean else 1)))
            weights = sum(r + 1.0 for r in range(size))
            np.testing.assert_allclose(got[1].numpy(), np.arange(4) * weights / (size if mean else 1))
            assert got[1].dtype == tf.float64 and isinstance(got[1], tf.Tensor)
            if rank == size - 1:
                assert got[2].dtype == tf.bfloat16
                np.testing.assert_allclose(got[2].numpy().astype(np.float32),
                                           np.array([weights, 2.0 * size]) / (size if mean else 1), rtol=1e-2)
            else:
                assert got[2] is None
            # tf.IndexedSlices in, coalesced tf.IndexedSlices out
            mine = [_slices(rank, k) for k in range(rank % 2 + 1)]
            result = strategy.reduce(op, mine)
            assert isinstance(result, tf.IndexedSlices)
            dense, present = np.zeros(SHAPE), np.zeros(SHAPE[0], bool)
            for r in range(size):
                for s in (_slices(r, k) for k in range(r % 2 + 1)):
                    np.add.at(dense, s.indices.numpy(), s.values.numpy())
                    present[s.indices.numpy()] = True
            rows = np.flatnonzero(present)
            np.testing.assert_array_equal(result.indices.numpy(), rows)
            np.testing.assert_allclose(result.values.numpy(), dense[rows] / (count if mean else 1))
            assert result.values.dtype == tf.float32 and result.dense_shape.numpy().tolist() == list(SHAPE)
        copied = strategy.broadcast(tf.constant([rank, rank]), src=size - 1)
        assert isinstance(copied, tf.Tensor) and copied.numpy().tolist() == [size - 1] * 2
    with pytest.raises(TypeError, match="without values"):
        tf.function(lambda x: cd.ReductionToOneDevice().reduce("sum", x))(tf.ones(2))
    with pytest.raises(ValueError, match="dense_shape is None"):
        cd.ReductionToOneDevice().reduce("sum", tf.IndexedSlices(tf.ones((1, 2)), tf.constant([0])))


@pytest.mark.parametrize("world_size", [2, 3])
def test_tensorflow_values(world_size: int) -> None:
    run_ranks(body_tf_values, world_size, timeout=180, env={"TF_CPP_MIN_LOG_LEVEL": "3"})


def test_importing_tensorcomm_never_imports_tensorflow() -> None:
    code = ("import sys, numpy as np, tensorcomm as tc; from tensorcomm import cross_device as cd; "
            "cd.ReduceOp.parse('sum'); assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
