"""``tensorcomm run``: the launcher that starts a job's ranks on each node.

``cli`` parses the command line, ``env`` holds the environment contract (what the launcher reads
and what it writes for each rank; see ``docs/env.md``), ``spawner`` starts, watches and stops the
ranks. This package may import ``rendezvous`` and ``config``, never ``core``.
"""

from __future__ import annotations

from tensorcomm.launch.cli import main, register_subcommand

__all__ = ["main", "register_subcommand"]
