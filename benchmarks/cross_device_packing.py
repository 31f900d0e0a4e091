"""Packed vs unpacked ``batch_reduce`` of 200 small gradients with a ResNet-like size mix.

    python benchmarks/cross_device_packing.py --ranks 2 4 --iterations 20

The gradients are those of a CIFAR-style ResNet (3x3 convolutions of 16/32/64 channels, a
batch-norm gamma and beta after each, a small classifier): 200 float32 tensors, 1.01 M elements
(4.0 MB), most of them tiny batch-norm vectors. Each rank runs every strategy on the same batch;
the table gives the time per ``batch_reduce`` (the slowest rank's mean over the timed calls) and
the number of all-reduce messages per call. Times are for this machine and run only: compare rows,
not absolute numbers.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import tensorcomm as tc
from tensorcomm import cross_device as cd
from tensorcomm.frontends import packing
from tensorcomm.testing import run_ranks

GRADIENTS = 200


def resnet_gradients(count: int = GRADIENTS) -> list[np.ndarray]:
    """``count`` float32 gradients shaped like a CIFAR ResNet's, stem first, classifier last."""
    shapes: list[tuple[int, ...]] = [(3, 3, 3, 16), (16,), (16,)]
    channels = 16
    while len(shapes) < count - 2:
        stage = min((len(shapes) - 3) // 66, 2)  # three stages of 11 blocks x 6 tensors
        wide = 16 << stage
        shapes += [(3, 3, channels, wide), (wide,), (wide,), (3, 3, wide, wide), (wide,), (wide,)]
        channels = wide
    shapes = [*shapes[:count - 2], (channels, 10), (10,)]
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _strategies() -> dict[str, tuple[cd.CrossDeviceOps, str]]:
    return {
        "no packing (num_packs=0)": (cd.AllReduceCrossDeviceOps(num_packs=0), "sum"),
        "num_packs=1": (cd.AllReduceCrossDeviceOps(num_packs=1), "sum"),
        "num_packs=4": (cd.AllReduceCrossDeviceOps(num_packs=4), "sum"),
        "bytes_per_pack=256 KiB": (cd.CollectiveAllReduce(bytes_per_pack=256 << 10), "sum"),
        "bytes_per_pack=0 (one pack)": (cd.CollectiveAllReduce(bytes_per_pack=0), "sum"),
        "num_packs=1, MEAN": (cd.AllReduceCrossDeviceOps(num_packs=1), "mean"),
    }


def _messages(name: str, strategy: cd.CrossDeviceOps, grads: list[np.ndarray]) -> int:
    if isinstance(strategy, cd.CollectiveAllReduce):
        layouts = packing.by_bytes_per_pack(grads, strategy.bytes_per_pack)
    else:
        layouts = packing.by_num_packs(grads, getattr(strategy, "num_packs", 0))
    return sum(len(layout.bounds) - 1 for layout in layouts) + (1 if "MEAN" in name else 0)


def body(iterations: int) -> dict[str, float]:
    """On every rank: seconds per batch_reduce for each strategy, and the functional baseline."""
    grads = resnet_gradients()
    pairs = [(g, None) for g in grads]
    results: dict[str, float] = {}
    for name, (strategy, op) in _strategies().items():
        for _ in range(3):  # warm-up: connections, allocator, algorithm selection
            strategy.batch_reduce(op, pairs)
        tc.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            strategy.batch_reduce(op, pairs)
        results[name] = (time.perf_counter() - start) / iterations
    copies = [g.copy() for g in grads]
    tc.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        for g in copies:
            tc.all_reduce(g)
    results["functional all_reduce x200 (in place)"] = (time.perf_counter() - start) / iterations
    return results


def main() -> None:
    """Run the benchmark on each world size and print one table per size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    grads = resnet_gradients()
    total = sum(g.size for g in grads)
    print(f"{len(grads)} float32 gradients, {total:,} elements ({total * 4 / 1e6:.1f} MB), "
          f"sizes {min(g.size for g in grads)}..{max(g.size for g in grads)}")
    for ranks in args.ranks:
        per_rank = run_ranks(body, ranks, args.iterations, timeout=600)
        slowest = {name: max(r[name] for r in per_rank) for name in per_rank[0]}
        baseline = slowest["no packing (num_packs=0)"]
        print(f"\n{ranks} ranks, {args.iterations} timed calls each")
        print(f"{'strategy':40} {'messages':>9} {'ms/batch_reduce':>16} {'vs no packing':>14}")
        strategies = _strategies()
        for name, seconds in slowest.items():
            messages = _messages(name, strategies[name][0], grads) if name in strategies else len(grads)
            print(f"{name:40} {messages:>9} {seconds * 1e3:>16.2f} {baseline / seconds:>13.1f}x")


if __name__ == "__main__":
    main()
