"""Fixtures of the fault suite: a stranger's interpreter, a sticky directory like /tmp."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import NOBODY


@pytest.fixture(scope="module")
def nobody_python() -> str:
    """A Python interpreter the user ``nobody`` may run (the venv's may sit in root's home)."""
    if os.geteuid() != 0:
        pytest.skip("running the stranger as another user (nobody) needs root")
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            done = subprocess.run([candidate, "-c", "pass"], user=NOBODY, capture_output=True, timeout=30)
        except OSError:
            continue
        if done.returncode == 0:
            return candidate
    pytest.skip("no Python interpreter that user nobody may run")


@pytest.fixture
def sticky() -> Iterator[Path]:
    """A world-writable sticky directory like /tmp (pytest's tmp_path is closed to nobody)."""
    if os.geteuid() != 0:
        pytest.skip("acting as another user (nobody) needs root")
    where = Path(tempfile.mkdtemp(prefix="tensorcomm-stranger-", dir="/tmp"))
    where.chmod(0o1777)
    try:
        yield where
    finally:
        shutil.rmtree(where)
