#!/bin/sh
# Issue 24, TCP vs Gloo at 2 and 4 ranks: this tree against main, back to back, load beside each.
# Usage (from the worktree root): sh benchmarks/results/tcp4/run.sh MAIN_TREE OUT_DIR
# MAIN_TREE: a checkout of the base commit (07f46d3), e.g. /work/main.
set -u
MAIN=${1:-/work/main}
OUT=${2:-benchmarks/results/tcp4}
export PATH=/work/venv-dev/bin:$PATH TENSORCOMM_TRANSPORT=tcp
for tree in "$PWD" "$MAIN"; do
  name=$(basename "$tree")
  for n in 4 2; do
    echo "== $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/') tree $tree ($(git -C "$tree" rev-parse --short HEAD)), $n ranks"
    PYTHONPATH=$tree/src timeout 900 python -m tensorcomm bench all_reduce -n $n -b 256K -e 64M -f 4 \
      --compare gloo --rounds 2 > "$OUT/bench_${name}_n$n.txt" 2>&1
    tail -7 "$OUT/bench_${name}_n$n.txt"
  done
done
for tree in "$PWD" "$MAIN"; do
  name=$(basename "$tree")
  echo "== $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/') tree $tree: CPU per call, 4 ranks"
  PYTHONPATH=$tree/src timeout 900 python "$PWD/benchmarks/tcp_cpu_vs_gloo.py" --ranks 4 --sizes 1M,4M,16M,64M \
    --rounds 3 > "$OUT/cpu_${name}_n4.txt" 2>&1
  cat "$OUT/cpu_${name}_n4.txt"
done
