"""Object collectives: any picklable Python object, pickled on the wire.

    tensorcomm run -n 3 examples/object_collectives.py

These unpickle what peers send, so use them only within one trusted job.
"""

import tensorcomm as tc

tc.init()
rank, size = tc.get_rank(), tc.get_world_size()
everyone = [None] * size
tc.all_gather_object(everyone, {"rank": rank, "name": f"worker-{rank}"})
print("gathered:", [o["name"] for o in everyone])

config = [{"lr": 0.1, "layers": [64, 64]}] if rank == 0 else [None]
tc.broadcast_object_list(config, src=0)
print("config:", config[0])
tc.destroy()
