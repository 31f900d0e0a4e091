"""``tensorcomm trace merge``: one timeline from every rank's, on one clock.

Each rank's file (``chrome.py``) starts with the clock stamps it took as it left each of a few
barriers. The ranks leave a barrier within about a message latency of each other, so the median
of the differences between a rank's stamps and the lowest rank's is that rank's clock offset;
it is subtracted from the rank's events, and every time is counted from the lowest rank's first
stamp. The offsets go into the merged file's ``otherData``.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from typing import Any

from ..rendezvous import private

TIMELINE = re.compile(r"rank(\d+)\.trace\.json$")
MERGED = "merged.trace.json"


def read(path: str | os.PathLike[str], dir_fd: int | None = None) -> dict[str, Any]:
    """One rank's timeline (``dir_fd``: the checked directory it is in); a file cut short (the
    rank died) is closed and read as far as it goes.

    Raises:
        ValueError: the file is not a tensorcomm timeline.
        private.Untrusted: it is a link, or another user owns it or may write to it.
    """
    raw = private.read_trusted(os.path.basename(path), "timeline", dir_fd, os.fspath(path)) \
        if dir_fd is not None else private.read_trusted(os.fspath(path), "timeline")
    text = raw.decode("utf-8", errors="replace")
    try:
        data: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError:
        cut = text[:text.rfind("\n", 0, len(text.rstrip()) + 1) + 1].rstrip().rstrip(",")
        try:
            data = json.loads(cut + "\n]}")
        except json.JSONDecodeError:
            raise ValueError(f"{os.fspath(path)} is not a tensorcomm timeline") from None
    if "tensorcomm" not in data or "traceEvents" not in data:
        raise ValueError(f"{os.fspath(path)} is not a tensorcomm timeline")
    return data


def merge(directory: str | os.PathLike[str],
          output: str | os.PathLike[str] | None = None) -> tuple[str, dict[int, float]]:
    """Merge the ``rank<R>.trace.json`` files in ``directory`` into ``output`` (default
    ``<directory>/merged.trace.json``); return its path and each rank's clock offset in µs.

    Only a directory and files this user owns and nobody else may write are read, and the
    result replaces ``output`` (never follows a link there) in such a directory (docs/security.md).

    Raises:
        FileNotFoundError: no timeline in ``directory``.
        ValueError: a file is not a timeline.
        private.Untrusted: a directory or file is a link, or another user owns it or may write it.
    """
    ranks = {}
    dir_fd = private.trusted_dir(os.fspath(directory), what="timeline directory")
    try:
        for name in sorted(os.listdir(dir_fd)):
            match = TIMELINE.match(name)
            if match:
                ranks[int(match.group(1))] = read(os.path.join(directory, name), dir_fd)
    finally:
        os.close(dir_fd)
    if not ranks:
        raise FileNotFoundError(f"no timeline (rank<R>.trace.json) in {os.fspath(directory)}")
    merged, offsets = _combine(ranks)
    path = os.fspath(output) if output is not None else os.path.join(directory, MERGED)
    out_fd = private.trusted_dir(os.path.dirname(os.path.abspath(path)), what="output directory")
    try:
        private.write_replacing(out_fd, os.path.basename(path), json.dumps(merged).encode())
    finally:
        os.close(out_fd)
    return path, offsets


def _combine(ranks: dict[int, dict[str, Any]]) -> tuple[dict[str, Any], dict[int, float]]:
    """The merged trace of the ranks' timelines, and each rank's clock offset in µs."""
    reference = ranks[min(ranks)]["tensorcomm"]["clock_sync_ns"]
    origin = reference[0] / 1000
    offsets: dict[int, float] = {}
    events = []
    for rank, data in sorted(ranks.items()):
        stamps = data["tensorcomm"]["clock_sync_ns"]
        pairs = list(zip(stamps, reference, strict=False))
        offsets[rank] = statistics.median(a - b for a, b in pairs) / 1000 if pairs else 0.0
        shift = offsets[rank] + origin
        for event in data["traceEvents"]:
            if "ts" in event:
                event = {**event, "ts": round(event["ts"] - shift, 3)}
            events.append(event)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"clock_offsets_us": {str(r): o for r, o in offsets.items()},
                          "origin_us": origin}}, offsets
