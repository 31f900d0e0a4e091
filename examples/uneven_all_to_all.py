"""Uneven collectives: rank r sends j + 1 rows to rank j, and nobody tells the receivers the sizes.

    tensorcomm run -n 3 examples/uneven_all_to_all.py

``all_to_all_v`` exchanges the sizes itself and returns them with the data (as Horovod's
``alltoall``); ``all_gather_v`` joins arrays of different lengths without padding.
"""

import numpy as np

import tensorcomm as tc

tc.init()
rank, size = tc.get_rank(), tc.get_world_size()
send_splits = [j + 1 for j in range(size)]
rows = np.concatenate([np.full((j + 1, 2), 10 * rank + j) for j in range(size)])
received, received_splits = tc.all_to_all_v(rows, send_splits)
print("received splits:", received_splits, "first column:", received[:, 0].tolist())

joined, sizes = tc.all_gather_v(np.arange(rank + 1))
print("all_gather_v sizes:", sizes, "values:", joined.tolist())
tc.destroy()
