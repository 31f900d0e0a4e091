"""Where ``env://`` puts the store under srun when ``MASTER_ADDR`` is unset.

The store goes to the first host of the step's node list (``SLURM_STEP_NODELIST``, else the
job's), where rank 0 runs under Slurm's default block distribution, on port ``PORT_BASE +
SLURM_JOB_ID % PORT_SPAN`` (15000..29999: below Linux's ephemeral ports, the same on every node
without talking). Two job steps of one job that run at once on the same first node would pick the
same port: give those ``MASTER_PORT``. Imports nothing from tensorcomm.
"""

from __future__ import annotations

import itertools
import re

PORT_BASE = 15000
PORT_SPAN = 15000
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def store_port(job_id: int) -> int:
    """The store's port for Slurm job ``job_id``."""
    return PORT_BASE + job_id % PORT_SPAN


def expand_nodelist(text: str) -> list[str]:
    """The host names of a Slurm node list in its compressed form, in order.

    ``"node[01-03,07],gpu5"`` is ``node01 node02 node03 node07 gpu5``; several bracket groups in
    one name (``rack[1-2]-n[1-2]``) multiply; a range keeps its lower bound's zero padding.

    Raises:
        ValueError: unbalanced brackets, an empty name or a range that is not ``a`` or ``a-b``
            with ``a <= b``.
    """
    hosts: list[str] = []
    for name in _split_top(text):
        parts: list[list[str]] = []
        rest = name
        while "[" in rest:
            head, _, tail = rest.partition("[")
            inner, closed, rest = tail.partition("]")
            if not closed or "[" in inner:
                raise ValueError(f"node list {text!r}: unbalanced brackets in {name!r}")
            parts += [[head], _expand_ranges(text, inner)]
        if "]" in rest:
            raise ValueError(f"node list {text!r}: unbalanced brackets in {name!r}")
        parts.append([rest])
        hosts += ["".join(pieces) for pieces in itertools.product(*parts)]
    return hosts


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets; refuses an empty name, unbalanced brackets."""
    names, depth, start = [], 0, 0
    for i, char in enumerate(text + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or (i == len(text) and depth):
            raise ValueError(f"node list {text!r}: unbalanced brackets")
        if char == "," and depth == 0:
            name = text[start:i].strip()
            if not name:
                raise ValueError(f"node list {text!r}: an empty host name")
            names.append(name)
            start = i + 1
    return names


def _expand_ranges(text: str, inner: str) -> list[str]:
    values = []
    for item in inner.split(","):
        match = _RANGE.match(item.strip())
        if match is None or (match[2] is not None and int(match[2]) < int(match[1])):
            raise ValueError(f"node list {text!r}: {item!r} is not a number or a range a-b")
        width = len(match[1])
        last = match[1] if match[2] is None else match[2]
        values += [str(n).zfill(width) for n in range(int(match[1]), int(last) + 1)]
    return values
