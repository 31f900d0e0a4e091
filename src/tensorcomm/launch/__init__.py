"""``tensorcomm run``: the launcher that starts a job's ranks on each node.

``run`` holds the subcommand's options (``tensorcomm.cli`` builds the command line), ``env`` the
environment contract (what the launcher reads and what it writes for each rank; see
``docs/env.md``), ``spawner`` starts, watches and stops the ranks. This package may import
``rendezvous`` and ``config``, never ``core``.
"""
