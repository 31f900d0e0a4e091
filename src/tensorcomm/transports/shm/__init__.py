"""Shared-memory transport: one memfd segment per group of ranks on one host (see docs/transports.md)."""
