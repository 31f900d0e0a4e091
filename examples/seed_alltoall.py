"""Seed 002 (``mindspore.ops.AlltoAll``) as its docs write it, modulo imports. Eight ranks:

    tensorcomm run -n 8 examples/seed_alltoall.py

Every rank prints ``[[[[0. 1. 2. 3. 4. 5. 6. 7.]]]]``.
"""

import numpy as np

import tensorcomm as tc
import tensorcomm.ops as ops


class Net:
    """MindSpore's ``nn.Cell`` wrapper, reduced to what the example needs: a callable."""

    def __init__(self):
        self.alltoall = ops.AlltoAll(split_count=8, split_dim=-2, concat_dim=-1)

    def construct(self, x):
        out = self.alltoall(x)
        return out

    __call__ = construct


tc.init()
net = Net()
rank_id = tc.get_rank()  # MindSpore reads RANK_ID; tensorcomm run sets RANK, as torchrun does
input_x = (np.ones([1, 1, 8, 1]) * rank_id).astype(np.float32)
output = net(input_x)
print(output)
tc.destroy()
