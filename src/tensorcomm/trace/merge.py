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

TIMELINE = re.compile(r"rank(\d+)\.trace\.json$")
MERGED = "merged.trace.json"


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """One rank's timeline; a file cut short (the rank died) is closed and read as far as it goes.

    Raises:
        ValueError: the file is not a tensorcomm timeline.
    """
    with open(path) as f:
        text = f.read()
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

    Raises:
        FileNotFoundError: no timeline in ``directory``.
        ValueError: a file is not a timeline.
    """
    ranks = {}
    for name in sorted(os.listdir(directory)):
        match = TIMELINE.match(name)
        if match:
            ranks[int(match.group(1))] = read(os.path.join(directory, name))
    if not ranks:
        raise FileNotFoundError(f"no timeline (rank<R>.trace.json) in {os.fspath(directory)}")
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
    path = os.fspath(output) if output is not None else os.path.join(directory, MERGED)
    with open(path, "w") as out:
        json.dump({"traceEvents": events, "displayTimeUnit": "ns",
                   "otherData": {"clock_offsets_us": {str(r): o for r, o in offsets.items()},
                                  "origin_us": origin}}, out)
    return path, offsets
