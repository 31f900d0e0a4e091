#!/usr/bin/env bash
# 8-byte all_reduce latency with more ranks than cores (4 and 8 ranks), against Gloo and MPI:
# issue 3's "never a scheduler time slice per call". ~2 minutes on 2 cores.
set -euo pipefail
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
for n in 4 8; do
    tensorcomm bench all_reduce -n "$n" -b 8 -e 8 -d float32 --compare gloo,mpi --rounds 3 \
        --time-budget 1 --csv "$out/latency_${n}ranks.csv" | tee "$out/latency_${n}ranks.txt"
done
