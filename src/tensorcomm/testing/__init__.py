"""Public test helpers: run a function on N real rank processes with a hard timeout
(``run_ranks``, ``spawn_ranks``), or on N threads of this process over an in-memory transport
(``run_threads``); a free port; reference data and results."""

from ..transports.loopback import run_threads
from .ranks import RankOutcome, RanksFailed, free_port, run_ranks, spawn_ranks
from .reference import rank_data, reduce_reference, reduces

__all__ = ["RankOutcome", "RanksFailed", "free_port", "rank_data", "reduce_reference", "reduces", "run_ranks",
           "run_threads", "spawn_ranks"]
