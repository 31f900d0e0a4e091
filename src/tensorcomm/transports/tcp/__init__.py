"""TCP transport: one authenticated connection per pair of ranks."""
