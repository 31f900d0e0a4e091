"""Seed 003 (``mindspore.mint.distributed.gather``) as its docs write it, modulo imports. Two ranks:

    tensorcomm run -n 2 examples/seed_gather.py

Rank 0 prints two copies of ``arange(4).reshape(2, 2)``; rank 1's list of zeros is left untouched.
"""

import numpy as np

from tensorcomm import destroy_process_group, gather, init_process_group

init_process_group()
input = np.arange(4).reshape([2, 2]).astype(np.float32)  # noqa: A001 - the seed's name
outputs = [np.zeros([2, 2]).astype(np.float32), np.zeros([2, 2]).astype(np.float32)]
gather(input, outputs, dst=0)
print(outputs)
destroy_process_group()
