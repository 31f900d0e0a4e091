#!/usr/bin/env bash
# all_reduce, 2 ranks, float32, 8 B to 256 MiB, against every peer installed, 2 interleaved rounds.
# The table of issue 3 (shared-memory fast path) is measured with this. ~5 minutes on 2 cores.
set -euo pipefail
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
tensorcomm bench all_reduce -n 2 -b 8 -e 256M -f 2 -d float32 --compare gloo,mpi,mindspore \
    --rounds 2 --csv "$out/allreduce.csv" --json "$out/allreduce.json" \
    --plot "$out/allreduce.png" | tee "$out/allreduce.txt"
