"""A script as a user writes it: a plain ``tc.init()``, no backend, nothing exported.

Run as ``mpiexec -n N python plain_init.py`` (the ranks meet through MPI) or as
``python plain_init.py`` (a world of one). Each rank prints one JSON line: rank, size, the sum of
an all_reduce of rank + 1 and the world's transport kinds.
"""

from __future__ import annotations

import json

import numpy as np

import tensorcomm as tc

tc.init(timeout=60)
rank, size = tc.get_rank(), tc.get_world_size()
x = np.full(4, rank + 1.0, np.float32)
tc.all_reduce(x)
print(json.dumps({"rank": rank, "size": size, "sum": float(x[0])}), flush=True)
tc.destroy()
