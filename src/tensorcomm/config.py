"""Tunables and the names of every environment variable tensorcomm reads or writes.

Environment variables are *read* only in ``rendezvous/discovery.py`` and *written* only by the
launcher (for its children); other modules import the names from here.
"""

from __future__ import annotations

# --- variables the launcher writes for its ranks (torchrun-compatible names first) ---
VERSION = "0.1.0"  # tensorcomm.__version__ (pyproject.toml's), here for the layers below the API

ENV_RANK = "RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_SECRET = "TENSORCOMM_SECRET"  # the job secret (at least 16 bytes); its scrypt stretch is the HMAC key
ENV_SECRET_DIR = "TENSORCOMM_SECRET_DIR"  # private directory for generated secrets (docs/security.md)
ENV_STORE_HOSTED = "TENSORCOMM_STORE_HOSTED"  # "1": the launcher already serves the store
ENV_HOST_ID = "TENSORCOMM_HOST_ID"  # overrides which ranks count as sharing a host
ENV_TIMEOUT = "TENSORCOMM_TIMEOUT"  # seconds, default for init(timeout=None)
ENV_JOIN_TIMEOUT = "TENSORCOMM_JOIN_TIMEOUT"  # seconds init() waits for every rank to join
ENV_TRANSPORT = "TENSORCOMM_TRANSPORT"  # "tcp" forces sockets even on one host
ENV_BACKEND = "TENSORCOMM_BACKEND"  # what carries messages between ranks: a name in BACKENDS
ENV_WIRE_DTYPE = "TENSORCOMM_WIRE_DTYPE"  # "bfloat16"/"float16": float32 sums travel compressed
ENV_HIERARCHY = "TENSORCOMM_HIERARCHY"  # "off": groups that span hosts run flat (no host sub-teams)
ENV_ALGORITHMS = "TENSORCOMM_ALGORITHMS"  # "all_reduce=ring,barrier=dissemination": force rows
ENV_LINK_PROTECTION = "TENSORCOMM_LINK_PROTECTION"  # how much of each TCP frame is sealed: LINK_PROTECTIONS
ENV_TUNING_FILE = "TENSORCOMM_TUNING_FILE"  # the tuning file's path, or "off" (algorithms/tuning.py)
ENV_TRACE = "TENSORCOMM_TRACE"  # a directory: every rank writes a timeline of its calls there
ENV_FLIGHT_CALLS = "TENSORCOMM_FLIGHT_CALLS"  # calls the flight recorder keeps; 0: off
ENV_FLIGHT_DIR = "TENSORCOMM_FLIGHT_DIR"  # where the flight recorder dumps
ENV_KEEP_GOING = "TENSORCOMM_KEEP_GOING"  # "1": failed calls leave in-place arrays untouched or complete
ENV_CMA = "TENSORCOMM_CMA"  # "off": ranks on one host never read each other's memory directly
ENV_LEARN = "TENSORCOMM_LEARN"  # "off": selection does not learn from the job's calls (learning.py)

# Every TENSORCOMM_* variable tensorcomm reads or writes, the launcher's and the benchmark's too;
# docs/env.md documents the same names (a test checks). Any other is taken for a misspelling and
# warned about once, naming the closest of these (rendezvous.discovery).
KNOWN_ENV_VARS = (
    ENV_SECRET, ENV_SECRET_DIR, ENV_STORE_HOSTED, ENV_HOST_ID, ENV_TIMEOUT, ENV_JOIN_TIMEOUT, ENV_TRANSPORT,
    ENV_BACKEND, ENV_WIRE_DTYPE, ENV_HIERARCHY, ENV_ALGORITHMS, ENV_TUNING_FILE, ENV_TRACE,
    ENV_FLIGHT_CALLS, ENV_FLIGHT_DIR, ENV_KEEP_GOING, ENV_CMA, ENV_LEARN,
    "TENSORCOMM_LINK_PROTECTION",  # transports/tcp: what a link's frames are sealed with
    "TENSORCOMM_NPROCS", "TENSORCOMM_NNODES", "TENSORCOMM_NODE_RANK", "TENSORCOMM_MASTER",
    "TENSORCOMM_JOB_TIMEOUT",  # read by the launcher only (launch/env.py)
    "TENSORCOMM_BENCH_TOKEN",  # written by `tensorcomm bench` for its workers (bench/control.py)
)

# init(backend=...): "tensorcomm" is its own TCP mesh (plus shared memory within a host); "mpi"
# is MPI point-to-point through mpi4py (plus the same shared memory), for a cluster's fabric.
BACKENDS = ("tensorcomm", "mpi")

FLIGHT_CALLS = 2000  # calls each rank's flight recorder keeps by default (docs/tracing.md)
DEFAULT_TIMEOUT = 300.0  # seconds; bounds every blocking call unless init(timeout=...) says otherwise
# Seconds init() waits for the job to assemble (store, every rank's join, the links made at init)
# unless TENSORCOMM_JOIN_TIMEOUT says otherwise, or the collective timeout if that is longer:
# the ranks of a large job on a busy host may start minutes apart (128 ranks on a loaded 2-core
# VM: imports spread over about 2 minutes), and a collective timeout is sized for calls.
DEFAULT_JOIN_TIMEOUT = 900.0
CONNECT_RETRY_INTERVAL = 0.05  # seconds between attempts to reach the store or a peer
SOCKET_BUFFER_BYTES = 4 << 20
# Large messages of the transport algorithms travel in chunks of this many bytes, each combined
# or passed on as it arrives (algorithms/wire.py): smaller chunks cost per-message overhead,
# larger ones lose the overlap of transfer and arithmetic. On 2 cores, 2 hosts x 2 ranks at
# 10 Gbit/s (benchmarks/multihost_allreduce.py), 256 KiB chunks ran 0.53-0.65x Gloo at 16-256 MiB;
# 1, 4 and 16 MiB were within that loaded machine's noise of each other (0.7-1.06x).
TCP_CHUNK_BYTES = 1 << 20
# Largest scratch buffer a group keeps for its algorithms' next call (algorithms.base.Scratch).
SCRATCH_KEEP_BYTES = 512 << 20
WIRE_DTYPES = ("bfloat16", "float16")  # what ENV_WIRE_DTYPE accepts
LINK_PROTECTIONS = ("headers", "mac", "encrypt")  # what ENV_LINK_PROTECTION accepts, weakest first
# Longest timeout accepted anywhere (about 31 years): longer ones overflow the platform's timers.
MAX_TIMEOUT = 1e9

# --- listeners (store server, TCP mesh, shared-memory descriptor server) ---
HANDSHAKE_TIMEOUT = 5.0  # seconds an accepted connection has to pass the job-secret challenge
MAX_PENDING_HANDSHAKES = 64  # connections one listener authenticates at once; the oldest yields
MAX_SILENT_CONNECTIONS = 256  # accepted connections not yet spoken, per listener; the oldest yields
MAX_STORE_CLIENTS = 4096  # connections a store server holds at once (pending ones included)
