"""tf.distribute ``CrossDeviceOps`` style reduction strategies.

    import numpy as np, tensorcomm as tc
    from tensorcomm import cross_device
    tc.init()
    strategy = cross_device.AllReduceCrossDeviceOps(num_packs=1)   # tf.distribute.NcclAllReduce(1)
    grads = strategy.batch_reduce("mean", [(g, None) for g in local_gradients])

Destinations: ``None``/``"all"`` = every process, an int global rank or a list of them = only
those (the others get ``None``). The implementation lives in ``tensorcomm.frontends.cross_device``
(the strategies) and ``tensorcomm.frontends.packing`` (the pack layouts).
"""

from .frontends.cross_device import (
    AllReduceCrossDeviceOps,
    CollectiveAllReduce,
    CrossDeviceOps,
    IndexedSlices,
    ReduceOp,
    ReductionToOneDevice,
)

__all__ = ["CrossDeviceOps", "ReductionToOneDevice", "AllReduceCrossDeviceOps",
           "CollectiveAllReduce", "ReduceOp", "IndexedSlices"]
