"""Fixtures of the fault suite: a stranger's interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

NOBODY = 65534  # the uid strangers run as (tests that need another user run as root)


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
