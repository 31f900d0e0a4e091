"""The tuning file: which algorithm this host runs at which size, as ``tensorcomm tune`` measured.

``select.pick`` asks ``choice`` before it walks its built-in predicates. ``select`` reads the
file once per process (``read``), when the first plan is made; plans are kept per call shape, so
selection and this file stay off the per-call path. A file is used only if it was written by this format
and this tensorcomm version (else *stale*) on a host with this fingerprint (else *foreign*: CPU
model, cores, memory), parses as below (else *malformed*) and is owned by this user (or root)
with no write permission for anyone else (else *unsafe*: another user could have planted or
changed it to steer every job's algorithms; a link is followed and where it leads is checked);
otherwise a RuntimeWarning names
the file and the reason and the built-in thresholds apply. Where it lives: ``TENSORCOMM_TUNING_FILE``
(a path, or ``off``), else ``tuning-<fingerprint hash>.json`` in the per-user cache directory
(``discovery.tuning_location``), so hosts of different kinds can share a home directory.

The file (JSON)::

    {"format": 1, "tensorcomm": "0.1.0",
     "host": {"cpu": "...", "cores": 16, "memory_gib": 64},
     "choices": [{"transport": "shm", "collective": "all_reduce", "members": 4,
                  "rows": [[131072, "shm_direct"], [1048576, "shm_split"], [16777216, "shm_pipelined"]]},
                 ...],
     "measured": [...]}

Each entry's ``rows`` are ``[up to nbytes, algorithm]`` with ascending sizes: the first whose
bound holds is the choice. ``tune`` ends the last row at the largest size it measured, above
which the built-in rules choose; a last bound of ``null`` extends it to any size.
``transport`` is ``shm`` (the group's shared-memory domain) or ``tcp`` (TCP between members on
one host). A group whose member count was not tuned uses the nearest tuned count (the smaller on
a tie). ``measured`` (what ``tune`` timed, for people) is not read.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from ..config import VERSION
from ..rendezvous import discovery, private
from ..transports.tcp.transport import TcpTransport
from .base import Team

FORMAT = 1
TRANSPORTS = ("shm", "tcp")
OFF = "off"

# (transport, collective) -> {members: ((up to nbytes or None, algorithm), ...)}
Rows = tuple[tuple[int | None, str], ...]  # (up to nbytes, None (last only) for any size; algorithm)
Table = dict[tuple[str, str], dict[int, Rows]]


class Ignored(Exception):
    """Why a tuning file is not used: ``kind`` is ``stale``, ``foreign``, ``malformed`` or
    ``unsafe``."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Processor", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_gib() -> int:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30))
    except (ValueError, OSError, AttributeError):
        return 0


@functools.cache
def fingerprint() -> dict[str, Any]:
    """This host as the tuning file keys it: CPU model, logical cores, memory in GiB."""
    return {"cpu": _cpu_model(), "cores": os.cpu_count() or 1, "memory_gib": _memory_gib()}


def default_path(environ: Mapping[str, str] | None = None) -> str | None:
    """The tuning file this process reads and ``tune`` writes; None when set to ``off``."""
    explicit, cache = discovery.tuning_location(environ)
    if explicit is not None:
        return None if explicit.lower() == OFF else os.path.expanduser(explicit)
    digest = hashlib.sha256(json.dumps(fingerprint(), sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(cache, f"tuning-{digest}.json")


def _entry(item: Any, known: Mapping[str, Sequence[str]]) -> tuple[str, str, int, Rows]:
    if not isinstance(item, dict):
        raise Ignored("malformed", f"a choice is {type(item).__name__}, expected an object")
    transport, collective, members, rows = (
        item.get(k) for k in ("transport", "collective", "members", "rows"))
    if transport not in TRANSPORTS:
        raise Ignored("malformed", f"transport {transport!r}, expected one of {', '.join(TRANSPORTS)}")
    if not isinstance(collective, str) or collective not in known:
        raise Ignored("malformed", f"unknown collective {collective!r}")
    if type(members) is not int or members < 2:
        raise Ignored("malformed", f"{collective}: members {members!r}, expected an integer >= 2")
    if not isinstance(rows, list) or not rows:
        raise Ignored("malformed", f"{collective}: rows must be a non-empty list")
    out: list[tuple[int | None, str]] = []
    for i, row in enumerate(rows):
        last = i == len(rows) - 1
        if not (isinstance(row, list) and len(row) == 2):
            raise Ignored("malformed", f"{collective}: row {row!r}, expected [up to bytes, algorithm]")
        bound, name = row
        if not (last and bound is None) and (type(bound) is not int or bound < 0
                                             or (out and bound <= (out[-1][0] or 0))):
            raise Ignored("malformed", f"{collective}: bound {bound!r}, expected ascending byte counts "
                                          f"(null only last)")
        if name not in known[collective] or name.startswith("shm_") != (transport == "shm") \
                or name == "hierarchical":
            raise Ignored("malformed", f"{collective}: {name!r} is not a {transport} algorithm of it")
        out.append((bound, name))
    return transport, collective, members, tuple(out)


def parse(data: Any, known: Mapping[str, Sequence[str]]) -> Table:
    """The table a tuning file's JSON holds, checked against this host and ``known``
    (collective -> algorithm names).

    Raises:
        Ignored: the file is stale, foreign or malformed; the message says how.
    """
    if not isinstance(data, dict):
        raise Ignored("malformed", f"the top level is {type(data).__name__}, expected an object")
    if data.get("format") != FORMAT:
        raise Ignored("stale", f"format {data.get('format')!r}, this tensorcomm reads format {FORMAT}")
    if data.get("tensorcomm") != VERSION:
        raise Ignored("stale", f"written by tensorcomm {data.get('tensorcomm')!r}, this is {VERSION}")
    if data.get("host") != fingerprint():
        raise Ignored("foreign", f"made on {data.get('host')!r}, this host is {fingerprint()!r}")
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise Ignored("malformed", "'choices' must be a list")
    table: Table = {}
    for item in choices:
        transport, collective, members, rows = _entry(item, known)
        table.setdefault((transport, collective), {})[members] = rows
    return table


def read_json(path: str) -> Any:
    """The JSON in the tuning file at ``path``, if this user (or root) owns it and nobody else
    may write to it (a link is followed; where it leads is checked).

    Raises:
        FileNotFoundError: there is none.
        Ignored: it is *unsafe* (another user could have planted or changed it) or *malformed*
            (unreadable, not JSON); the message says why.
    """
    try:
        text = private.read_trusted(path, "tuning file", follow=True)
    except private.Untrusted as exc:
        raise Ignored("unsafe", exc.reason) from None
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise Ignored("malformed", f"cannot be read ({exc.strerror or exc})") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Ignored("malformed", f"not JSON ({exc})") from None


def load(path: str, known: Mapping[str, Sequence[str]]) -> Table:
    """Read (``read_json``) and check (``parse``) the tuning file at ``path``.

    Raises:
        FileNotFoundError: there is none.
        Ignored: it cannot be used; the message says why.
    """
    return parse(read_json(path), known)


def read(known: Mapping[str, Sequence[str]], environ: Mapping[str, str] | None = None) -> Table | None:
    """The table of the file this process uses (``default_path``), or None: no usable file, a
    RuntimeWarning says why (an absent file at the default place, or ``off``, says nothing)."""
    path = default_path(environ)
    if path is None:
        return None
    try:
        return load(path, known)
    except FileNotFoundError:
        if discovery.tuning_location(environ)[0] is not None:
            warnings.warn(f"tensorcomm: tuning file {path} does not exist; the built-in algorithm "
                          f"thresholds apply", RuntimeWarning, stacklevel=2)
        return None
    except Ignored as exc:
        warnings.warn(f"tensorcomm: ignoring tuning file {path}, {exc}; the built-in algorithm "
                      f"thresholds apply (run `tensorcomm tune` on this host)", RuntimeWarning,
                      stacklevel=2)
        return None


def transport_of(team: Team) -> str | None:
    """Which tuned transport ``team`` runs on: ``shm``, ``tcp`` (one host, no hierarchy), or None."""
    if team.shm is not None:
        return "shm"
    if team.hier is None and isinstance(team.transport, TcpTransport) and len(set(team.host_of)) <= 1:
        return "tcp"
    return None


def lookup(table: Table, transport: str | None, collective: str, members: int, nbytes: int) -> str | None:
    """The algorithm ``table`` chooses for ``collective`` on ``members`` members over
    ``transport`` at ``nbytes``, or None."""
    by_members = table.get((transport, collective)) if transport is not None else None
    if not by_members:
        return None
    rows = by_members.get(members) or \
        by_members[min(by_members, key=lambda m: (abs(m - members), m))]
    for bound, name in rows:
        if bound is None or nbytes <= bound:
            return name
    return None  # above the sizes measured: the built-in rules


def choice(table: Table | None, collective: str, team: Team, nbytes: int) -> str | None:
    """The algorithm ``table`` names for this call on ``team``, or None."""
    if table is None:
        return None
    return lookup(table, transport_of(team), collective, len(team.ranks), nbytes)
