"""Seed 000 (``mindspore.ops.AllReduce``) as its docs write it, modulo imports. Two ranks:

    tensorcomm run -n 2 examples/seed_allreduce.py

Every rank prints a 2 x 8 array of 2.0.
"""

import numpy as np

import tensorcomm as tc
import tensorcomm.ops as ops
from tensorcomm.ops import ReduceOp

tc.init()


class Net:
    """MindSpore's ``nn.Cell`` wrapper, reduced to what the example needs: a callable."""

    def __init__(self):
        self.allreduce_sum = ops.AllReduce(ReduceOp.SUM)

    def construct(self, x):
        return self.allreduce_sum(x)

    __call__ = construct


input_ = np.ones([2, 8]).astype(np.float32)
net = Net()
output = net(input_)
print(output)
tc.destroy()
