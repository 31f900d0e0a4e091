"""Shared pytest setup: the test tiers and the hard timeout every test has.

Tests that start processes, or talk over sockets between processes, carry the ``spawns`` marker:
everything under the directories in ``SPAWNING_DIRS``, every test marked ``multiprocess``,
``fault`` or ``multihost``, and the tests of ``tests/unit`` marked ``spawns`` by hand. The default
``python -m pytest`` deselects them and the ``slow`` tests (``addopts`` in pyproject.toml) and
runs in seconds;
``python -m pytest -m ""`` runs the full suite. Markers are strict: a marker must be registered in
pyproject.toml. The per-test timeout (pytest-timeout) is set there too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SPAWNING_DIRS = ("multiprocess", "fault", "frameworks", "mpi", "with_ray", "elastic", "multihost")
SPAWNING_MARKERS = ("multiprocess", "fault", "multihost")
DEFAULT_MARKEXPR = "not spawns and not slow"  # addopts in pyproject.toml
_HERE = Path(__file__).parent

# Results must not depend on a tuning file `tensorcomm tune` left on the host (docs/tuning.md):
# the suite and every process it starts use the built-in thresholds unless a test says otherwise.
os.environ["TENSORCOMM_TUNING_FILE"] = "off"
# Nor on a transport, backend or algorithm the caller's shell forces: tests that want one say so
# (their "shm" cases inherit the environment, and would silently run over TCP).
for _forced in ("TENSORCOMM_TRANSPORT", "TENSORCOMM_BACKEND", "TENSORCOMM_ALGORITHMS"):
    os.environ.pop(_forced, None)


def _spawns(item: pytest.Item) -> bool:
    parts = item.path.relative_to(_HERE).parts if item.path.is_relative_to(_HERE) else ()
    if parts and parts[0] in SPAWNING_DIRS:
        return True
    return any(item.get_closest_marker(name) is not None for name in SPAWNING_MARKERS)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """In the default run, do not even import the modules under ``SPAWNING_DIRS``."""
    if (config.option.markexpr == DEFAULT_MARKEXPR and collection_path.parent == _HERE
            and collection_path.name in SPAWNING_DIRS):
        return True
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook applies -m
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("spawns") is None and _spawns(item):
            item.add_marker(pytest.mark.spawns)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    if config.option.markexpr == DEFAULT_MARKEXPR and terminalreporter.stats.get("deselected"):
        terminalreporter.write_line('the fast tier: tests that start processes, and slow ones, were not run; '
                                    'python -m pytest -m "" runs the full suite')
