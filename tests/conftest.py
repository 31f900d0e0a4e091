"""Shared pytest setup: every test has a hard timeout (pytest-timeout, set in pyproject.toml)."""
