"""MindSpore ``ops`` style operator objects: build once, call on arrays, get new arrays back.

    import numpy as np, tensorcomm as tc
    from tensorcomm.ops import AllReduce, AlltoAll
    tc.init()
    total = AllReduce("sum")(np.ones([2, 8], np.float32))        # a new array; input untouched
    y = AlltoAll(split_count=tc.get_world_size(), split_dim=0, concat_dim=1)(x)

The implementation lives in ``tensorcomm.frontends.operators`` and ``operators_uneven``.
"""

from .frontends.operators import AllGather, AllReduce, AlltoAll, Broadcast, Exscan, ReduceScatter, Scan
from .frontends.operators_uneven import AlltoAllV, NeighborExchange
from .types import ReduceOp

__all__ = ["AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AlltoAll", "AlltoAllV",
           "NeighborExchange", "Scan", "Exscan", "ReduceOp"]
