#!/usr/bin/env bash
# The MPI backend (issue 14): all_reduce and all_to_all, float32, 8 B to 64 MiB (x2), 2 and 4 ranks,
# one interleaved run per rank count with 2 rounds:
#   - with TENSORCOMM_TRANSPORT=tcp (no shared memory): "tensorcomm" is tensorcomm's own TCP,
#     "tc-mpi" is tensorcomm with MPI carrying every message (init(backend="mpi")), "mpi" is
#     mpi4py called directly;
#   - without it: "tensorcomm" and "tc-mpi" both use shared memory within the host (a backend only
#     carries what crosses hosts), against mpi4py.
# ~10 minutes on 2 cores.
set -euo pipefail
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
for ranks in 2 4; do
    TENSORCOMM_TRANSPORT=tcp tensorcomm bench all_reduce all_to_all -n "$ranks" -b 8 -e 64M -f 2 \
        -d float32 --compare mpi,tc-mpi --rounds 2 --csv "$out/mpi_backend_tcp_$ranks.csv" \
        --json "$out/mpi_backend_tcp_$ranks.json" | tee "$out/mpi_backend_tcp_$ranks.txt"
    tensorcomm bench all_reduce all_to_all -n "$ranks" -b 8 -e 64M -f 2 -d float32 \
        --compare mpi,tc-mpi --rounds 2 --csv "$out/mpi_backend_shm_$ranks.csv" \
        --json "$out/mpi_backend_shm_$ranks.json" | tee "$out/mpi_backend_shm_$ranks.txt"
done
