"""Public test helpers: run a function on N real rank processes with a hard timeout; a free port."""

from .ranks import RankOutcome, RanksFailed, free_port, run_ranks, spawn_ranks
from .reference import rank_data, reduce_reference, reduces

__all__ = ["RankOutcome", "RanksFailed", "free_port", "rank_data", "reduce_reference", "reduces", "run_ranks",
           "spawn_ranks"]
