#!/usr/bin/env bash
# all_gather, broadcast, reduce_scatter, all_to_all, 2 ranks, float32, 1 KiB to 32 MiB (x8),
# against every peer installed, 2 interleaved rounds. ~5 minutes on 2 cores.
set -euo pipefail
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
tensorcomm bench all_gather broadcast reduce_scatter all_to_all -n 2 -b 1K -e 32M -f 8 \
    -d float32 --compare gloo,mpi,mindspore --rounds 2 --csv "$out/collectives.csv" \
    --json "$out/collectives.json" --plot "$out/collectives.png" | tee "$out/collectives.txt"
