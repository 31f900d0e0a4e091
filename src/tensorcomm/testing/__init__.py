"""Public test helpers: run a function on N real rank processes with a hard timeout."""

from .ranks import RankOutcome, RanksFailed, run_ranks, spawn_ranks
from .reference import rank_data, reduce_reference

__all__ = ["RankOutcome", "RanksFailed", "rank_data", "reduce_reference", "run_ranks", "spawn_ranks"]
