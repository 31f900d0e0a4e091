#!/usr/bin/env bash
# What TCP link protection costs (issue 21): all_reduce, float32, 2 ranks over TCP
# (TENSORCOMM_TRANSPORT=tcp), 64 KiB to 256 MiB (x16), 2 rounds, each TENSORCOMM_LINK_PROTECTION
# level interleaved with Gloo (which protects nothing) as the yardstick on a loaded machine.
# BASE=<a checkout of c156846> adds the unprotected baseline: the same transport before sealing.
# With BASE, 64 KiB (the noisiest size) is then timed again, none and headers alternated 3 times
# (ab_64k.txt). The load average is written beside the figures (load.txt). PARTS picks parts
# (default "levels ab cpu"). ~8 minutes on 2 busy cores.
set -euo pipefail
out="${OUT:-benchmarks/results/link_protection}"
parts="${PARTS:-levels ab cpu}"
mkdir -p "$out"
run() {  # name, then environment assignments
    local name="$1"
    shift
    echo "== $name: $(uptime)" | tee -a "$out/load.txt"
    env "$@" TENSORCOMM_TRANSPORT=tcp python -m tensorcomm bench all_reduce -n 2 -b 64K -e 256M -f 16 \
        -d float32 --compare gloo --rounds 2 --csv "$out/$name.csv" --json "$out/$name.json" \
        | tee "$out/$name.txt"
}
if [[ " $parts " == *" levels "* ]]; then
    : > "$out/load.txt"
    if [ -n "${BASE:-}" ]; then
        run none PYTHONPATH="$BASE/src"
    fi
    for level in headers mac encrypt; do
        run "$level" TENSORCOMM_LINK_PROTECTION="$level"
    done
fi
if [[ " $parts " == *" ab "* && -n "${BASE:-}" ]]; then
    : > "$out/ab_64k.txt"
    for round in 1 2 3; do
        for name in none headers; do
            echo "== $name, round $round: $(uptime)" | tee -a "$out/load.txt" "$out/ab_64k.txt"
            if [ "$name" = none ]; then where="$BASE/src"; else where="$PYTHONPATH"; fi
            PYTHONPATH="$where" TENSORCOMM_TRANSPORT=tcp python -m tensorcomm bench all_reduce -n 2 \
                -b 64K -e 64K -d float32 --compare gloo --rounds 2 | grep -E "^ +65536 .* (tensorcomm|gloo) " \
                | tee -a "$out/ab_64k.txt"
        done
    done
fi
if [[ " $parts " != *" cpu "* ]]; then
    exit 0
fi
# The CPU cost of sealing alone (one process, no sockets): seal + open one frame per level and
# size, best of 5 (so less sensitive to the load than the all_reduce runs above).
echo "== sealing cpu: $(uptime)" | tee -a "$out/load.txt"
python - <<'PY' | tee "$out/sealing_cpu.txt"
import time
import numpy as np
from tensorcomm.transports.tcp import framing, sealing
print(f"{'size(B)':>10} {'level':>8} {'seal+open(us)':>14} {'GB/s':>7}")
for nbytes in (64 << 10, 16 << 20, 256 << 20):
    payload = np.ones(nbytes, np.uint8)
    for level, name in enumerate(sealing.LEVELS):
        out = sealing.Sealer(1, level, b"a" * 32, b"b" * 32)
        back = sealing.Sealer(0, level, b"b" * 32, b"a" * 32)
        header = framing.pack_header(framing.KIND_DATA, 1, nbytes)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            parts = out.seal(header, memoryview(payload), True)
            sealed = time.perf_counter()
            target = memoryview(bytearray(parts[1]))  # what the socket would fill: not timed
            opening = time.perf_counter()
            opened, number, tag = back.open_header(bytes(parts[0]))
            back.open_payload(opened, number, tag, target, True)
            best = min(best, sealed - start + time.perf_counter() - opening)
        print(f"{nbytes:>10} {name:>8} {best * 1e6:>14.1f} {nbytes / best / 1e9:>7.2f}")
PY
echo "== done: $(uptime)" | tee -a "$out/load.txt"
