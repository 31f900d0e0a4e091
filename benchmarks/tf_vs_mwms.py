"""tensorcomm.cross_device beside TensorFlow's MultiWorkerMirroredStrategy (RING) in the same ranks.

    python benchmarks/tf_vs_mwms.py          # needs tensorflow-cpu (tested 2.21); 2 processes

20 gradients (10 MiB of float32 in all), tf.Tensors, summed across 2 processes by MWMS's RING
all-reduce (``ReplicaContext.all_reduce`` inside ``strategy.run``) and by
``cross_device.AllReduceCrossDeviceOps(num_packs=1).batch_reduce`` with ``tf.distribute.ReduceOp``
on the same tensors, in the same processes, order flipped every round. Prints whether the
results are bit-identical, the median time per batch of each, the ratio and the load. A
benchmark, not a test: it asserts nothing about time.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def main() -> None:
    from tensorcomm.testing import free_port

    ports = ",".join(str(free_port()) for _ in range(2))
    store = str(free_port())
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    ranks = [subprocess.Popen([sys.executable, __file__, str(r), ports, store], env=env,
                              stderr=subprocess.DEVNULL) for r in range(2)]
    sys.exit(max(p.wait(timeout=600) for p in ranks))


def rank_main(rank: int, ports: list[str], store: str) -> None:
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                          "task": {"type": "worker", "index": rank}})
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=store)
    import numpy as np
    import tensorflow as tf

    import tensorcomm as tc
    from tensorcomm import cross_device

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    tc.init()
    rng = np.random.default_rng(rank)
    grads = [tf.constant(rng.standard_normal(131072).astype(np.float32)) for _ in range(20)]

    @tf.function
    def step():
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)

    def theirs():
        return [strategy.experimental_local_results(o)[0] for o in strategy.run(step)]

    ops = cross_device.AllReduceCrossDeviceOps(num_packs=1)

    def ours():
        return ops.batch_reduce(tf.distribute.ReduceOp.SUM, [(g, None) for g in grads])

    same = all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(theirs(), ours(), strict=True))
    times: dict[str, list[float]] = {"mwms": [], "tensorcomm": []}
    for round_ in range(6):
        pair = (("mwms", theirs), ("tensorcomm", ours))
        for name, fn in pair if round_ % 2 == 0 else pair[::-1]:
            tc.barrier()
            start = time.perf_counter()
            for _ in range(5):
                [x.numpy() for x in fn()]
            times[name].append((time.perf_counter() - start) / 5)
    if rank == 0:
        med = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
        print(f"bit-identical: {same}; median ms per batch: MWMS RING {med['mwms']:.2f}, tensorcomm "
              f"{med['tensorcomm']:.2f}, ratio {med['tensorcomm'] / med['mwms']:.2f}; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
    tc.destroy()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rank", nargs="*", help=argparse.SUPPRESS)  # RANK PORTS STORE: main()'s processes
    rank = parser.parse_args().rank
    if rank:
        rank_main(int(rank[0]), rank[1].split(","), rank[2])
    else:
        main()
