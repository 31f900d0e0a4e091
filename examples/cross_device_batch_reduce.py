"""tf.distribute style: average a batch of gradients with a packing strategy. Any number of ranks:

    tensorcomm run -n 3 examples/cross_device_batch_reduce.py

Each process holds two local replicas of three gradients (replica k of rank r is filled with
``r + k``); ``batch_reduce("mean", ...)`` averages over every replica of every process, fused into
one pack per dtype. Every rank prints the means; rank 0 also prints a reduce-to-one sum.
"""

import numpy as np

import tensorcomm as tc
from tensorcomm import cross_device

tc.init()
rank, size = tc.get_rank(), tc.get_world_size()
shapes = [(3, 3), (4,), (2, 2, 2)]
replicas = [[np.full(shape, rank + k, np.float32) for k in range(2)] for shape in shapes]

strategy = cross_device.AllReduceCrossDeviceOps(num_packs=1)  # tf.distribute.NcclAllReduce(1)
means = strategy.batch_reduce("mean", [(value, None) for value in replicas])
print("means:", [float(m.flat[0]) for m in means], "shapes:", [m.shape for m in means])

total = strategy.reduce(cross_device.ReduceOp.SUM, replicas[1], destinations=0)  # falls back to reduce-to-one
if total is not None:  # None on ranks that are not a destination
    print("sum on rank 0:", total.tolist())
tc.destroy()
