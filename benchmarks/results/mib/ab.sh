#!/bin/sh
# Interleaved A/B: `tensorcomm bench` on main (07f46d3, /work/main) then on this branch, back to
# back, per collective, 2 ranks, 256 KiB up to $MAXBYTES (16M), beside MPICH, 3 rounds.
# Usage: sh ab.sh OUTFILE collective...   (appends to OUTFILE; prints the load before each run)
out=$1; shift
for c in "$@"; do
  for tree in main mib; do
    src=/work/main/src; [ $tree = mib ] && src=/work/wt/mib/src
    echo "== $tree $c $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" | tee -a "$out"
    PYTHONPATH=$src timeout 600 python -m tensorcomm bench "$c" -n 2 -b 256K -e "${MAXBYTES:-16M}" -f 4 \
      --compare mpi --rounds 3 2>&1 | tee -a "$out" | grep -v "^$"
  done
done
