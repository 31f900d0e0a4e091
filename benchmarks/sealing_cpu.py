"""The CPU cost of TCP link protection alone: seal and open one frame per level and size.

Usage: python benchmarks/sealing_cpu.py [--sizes 64K,16M,256M] [--repeats 5]

One process, no sockets: per ``TENSORCOMM_LINK_PROTECTION`` level (``sealing.LEVELS``) and
payload size, the time to seal one data frame and open it again (header and payload), the best of
``--repeats`` (so less swayed by other work on the machine than an all_reduce), and the rate it
implies. Copying the sealed bytes into the receive buffer (the socket's work) is not timed.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tensorcomm.bench.options import parse_size
from tensorcomm.transports.tcp import framing, sealing


def seal_and_open(level: int, payload: np.ndarray) -> float:
    """Seconds to seal ``payload`` as one frame at ``level`` and open it."""
    out = sealing.Sealer(1, level, b"a" * 32, b"b" * 32)
    back = sealing.Sealer(0, level, b"b" * 32, b"a" * 32)
    header = framing.pack_header(framing.KIND_DATA, 1, payload.nbytes)
    start = time.perf_counter()
    parts = out.seal(header, memoryview(payload), True)
    sealed = time.perf_counter()
    target = memoryview(bytearray(parts[1]))  # what the socket would fill: not timed
    opening = time.perf_counter()
    *_, (opened, number, tag) = back.open_header(bytes(parts[0]))
    back.open_payload(opened, number, tag, target, True)
    return sealed - start + time.perf_counter() - opening


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64K,16M,256M")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"{'size(B)':>10} {'level':>8} {'seal+open(us)':>14} {'GB/s':>7}")
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        payload = np.ones(nbytes, np.uint8)
        for level, name in enumerate(sealing.LEVELS):
            best = min(seal_and_open(level, payload) for _ in range(args.repeats))
            print(f"{nbytes:>10} {name:>8} {best * 1e6:>14.1f} {nbytes / best / 1e9:>7.2f}")


if __name__ == "__main__":
    main()
