"""What ``tensorcomm bench`` prints and writes: the machine header, the table, CSV and JSON.

The table follows nccl-tests' layout (size, count, type, redop, time, algbw, busbw, #wrong), with
the median time and the min/max across batches, a library column, and on each peer's row the
ratio of tensorcomm's speed to that peer's (busbw ratio; above 1: tensorcomm is faster).

A file (``--csv``, ``--json``) is written under a fresh name in its directory and renamed over
its name (``private.replace_file``), so a link planted at that name is replaced, never written
through, even in a shared directory like /tmp (docs/security.md).
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from typing import Any, TextIO

import numpy as np

import tensorcomm

from ..rendezvous import private
from . import copyrate
from .formulas import COLLECTIVES
from .options import BenchOptions
from .results import TENSORCOMM, Row, ratios

# Settings that change what a run measures; shown in the header whether set or not.
ENV_SHOWN = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TENSORCOMM_TRANSPORT")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    except (ValueError, OSError, AttributeError):
        return None


def source_revision(directory: str | None = None) -> str | None:
    """The git commit of ``directory`` (default: the tensorcomm package this process runs),
    ``+modified`` if its files there differ from it; None if it is no checkout.

    Benchmarks are often run from a working tree: the commit alone would not say what ran.
    """
    package = directory or os.path.dirname(os.path.abspath(tensorcomm.__file__))
    try:
        head = subprocess.run(["git", "-C", package, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", package, "status", "--porcelain", "--", "."],
                                capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+modified" if status.stdout.strip() else "")


def machine_info(env: Mapping[str, str], versions: Mapping[str, str]) -> dict[str, Any]:
    """The machine and software a run measured: cores, memory, versions, thread settings.

    Args:
        env: the environment the ranks ran with.
        versions: library name -> version string, as each job reported it.
    """
    affinity = getattr(os, "sched_getaffinity", None)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(affinity(0)) if affinity else os.cpu_count(),
        "memory_gib": _memory_gib(),
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "tensorcomm": tensorcomm.__version__,
        "tensorcomm_git": source_revision(),
        "libraries": dict(versions),
        "env": {name: env.get(name) for name in ENV_SHOWN},
        "load": _load(),
    }


def _load() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages, or None where the system has none."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def load_lines(machine: Mapping[str, Any]) -> list[str]:
    """The header's load line, and a warning when the load exceeds the usable cores."""
    load, cores = machine.get("load"), machine["usable_cores"]
    if load is None:
        return ["# load: unknown"]
    lines = [(f"# load: {load[0]:.2f} (1 min), {load[1]:.2f} (5 min), {load[2]:.2f} (15 min) "
              f"on {cores} usable cores")]
    if load[0] > cores:
        lines.append(f"# WARNING: the load ({load[0]:.2f}) exceeds the cores ({cores}): other work "
                     "competes for the CPUs, so these timings (and ratios between libraries) "
                     "are not those of a quiet machine")
    return lines


def machine_line(machine: Mapping[str, Any]) -> str:
    """The header's machine line: CPU, cores, memory, system."""
    memory = machine["memory_gib"]
    return (f"# machine: {machine['cpu']}, {machine['cores']} cores ({machine['usable_cores']} usable)"
            + (f", {memory:.1f} GiB" if memory else "") + f"; {machine['system']}")


def header(options: BenchOptions, ranks: int, machine: Mapping[str, Any]) -> list[str]:
    """The comment lines above the table."""
    env = " ".join(f"{k}={v if v is not None else 'unset'}" for k, v in machine["env"].items())
    timing = (f"{options.iters} timed calls" if options.iters else
              f"{options.budget:g} s of timed calls")
    how = ("one at a time, each after a barrier and timed alone (--barrier each, OSU)"
           if options.barrier == "each" else "back to back in batches after a barrier (nccl-tests)")
    return [
        (f"# tensorcomm bench: {', '.join(options.collectives)}; {ranks} ranks; {options.dtype}; "
         f"op {options.op}; check {'on' if options.check else 'off'}"
         + ("; tensorcomm on shared arrays (tensorcomm.zeros)" if options.shared else "")),
        machine_line(machine),
        f"# software: Python {machine['python']}, numpy {machine['numpy']}; "
        + "; ".join(machine["libraries"].values())
        + (f"; tensorcomm from git {machine['tensorcomm_git']}" if machine["tensorcomm_git"]
           else ""),
        *load_lines(machine),
        f"# env: {env}",
        (f"# timing: per size and library, {timing}, {how}; time = median "
         f"of the batches' slowest rank (min, max beside it); {options.rounds} round(s), "
         "libraries interleaved per size"),
        *([copyrate.line(machine["cross_core"])] if "cross_core" in machine else []),
    ]


_COLUMNS = (("size(B)", ">12"), ("count", ">11"), ("type", ">9"), ("redop", ">6"),
            ("library", "<11"), ("time(us)", ">10"), ("min(us)", ">10"), ("max(us)", ">10"),
            ("algbw(GB/s)", ">12"), ("busbw(GB/s)", ">12"), ("#wrong", ">7"), ("tc/peer", ">8"),
            ("algorithm", "<"))
# send_recv (point to point) in OSU's osu_latency terms: one-way latency and the bandwidth it implies.
_OSU_COLUMNS = (("size(B)", ">12"), ("type", ">9"), ("library", "<11"), ("latency(us)", ">12"),
                ("min(us)", ">10"), ("max(us)", ">10"), ("bandwidth(MB/s)", ">16"), ("#wrong", ">7"),
                ("tc/peer", ">8"))
OSU_NOTE = ("# latency: half the round trip of a ping-pong between ranks 0 and 1 (osu_latency); "
            "bandwidth = size / latency")


def _num(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _cells(row: Row, ratio: float | None, reduces: bool) -> list[str]:
    tail = ["n/a" if row.wrong is None else str(row.wrong), "" if ratio is None else f"{ratio:.2f}x"]
    if COLLECTIVES[row.collective].round_trip:
        base = [str(row.size), row.dtype, row.library]
        if row.time_us is None:
            return [*base, row.note]
        megabytes = None if row.algbw is None else row.algbw * 1e3
        return [*base, _num(row.time_us), _num(row.min_us), _num(row.max_us), _num(megabytes),
                *tail]
    base = [str(row.size), str(row.count), row.dtype, row.op if reduces else "none",
            row.library]
    if row.time_us is None:
        return [*base, row.note]
    return [*base, _num(row.time_us, 1), _num(row.min_us, 1), _num(row.max_us, 1), _num(row.algbw),
            _num(row.busbw), *tail, row.algorithm]


def _line(cells: Sequence[str], columns: Sequence[tuple[str, str]] = _COLUMNS) -> str:
    parts = [f"{cell:{fmt}}" for cell, (_, fmt) in zip(cells, columns, strict=False)]  # a row may stop early
    parts += cells[len(columns):]  # a note past the last column
    return " ".join(parts).rstrip()


class TableWriter:
    """Prints rows as each size finishes, with a column header per collective."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._collective: str | None = None

    def emit(self, rows: Sequence[Row]) -> None:
        """Print the rows of one size (every library's)."""
        if not rows:
            return
        collective = COLLECTIVES[rows[0].collective]
        columns = _OSU_COLUMNS if collective.round_trip else _COLUMNS
        if rows[0].collective != self._collective:
            self._collective = rows[0].collective
            print(f"#\n# {self._collective}", file=self._out)
            if collective.round_trip:
                print(OSU_NOTE, file=self._out)
            names = [name for name, _ in columns]
            print(_line(["#" + names[0].rjust(11), *names[1:]], columns), file=self._out)
        speed = ratios(rows)
        for row in rows:
            ratio = speed.get((row.collective, row.size, row.library))
            print(_line(_cells(row, ratio, collective.reduces), columns), file=self._out)
        self._out.flush()


def ratio_summary(rows: Sequence[Row]) -> list[str]:
    """Per collective, a size x peer table of tensorcomm's speed over the peer's."""
    speed = ratios(rows)
    peers = list(dict.fromkeys(r.library for r in rows if r.library != TENSORCOMM))
    if not peers:
        return []
    lines = ["#", "# tensorcomm speed / peer speed (above 1: tensorcomm faster)"]
    for collective in dict.fromkeys(r.collective for r in rows):
        lines.append(f"# {collective:<14}" + "".join(f"{p:>12}" for p in peers))
        for size in dict.fromkeys(r.size for r in rows if r.collective == collective):
            cells = [speed.get((collective, size, p)) for p in peers]
            lines.append(f"{size:>16}" + "".join(f"{c:>11.2f}x" if c else f"{'-':>12}"
                                                 for c in cells))
    return lines


def write_csv(path: str, rows: Sequence[Row]) -> None:
    """Write one CSV line per row, with tensorcomm's speed ratio on peer rows."""
    speed = ratios(rows)
    names = [f.name for f in fields(Row)] + ["tensorcomm_speedup"]
    handle = io.StringIO(newline="")
    writer = csv.DictWriter(handle, fieldnames=names)
    writer.writeheader()
    for row in rows:
        writer.writerow({**asdict(row), "tensorcomm_speedup":
                         speed.get((row.collective, row.size, row.library), "")})
    private.replace_file(path, handle.getvalue().encode())


def write_json(path: str, machine: Mapping[str, Any], options: BenchOptions,
               rows: Sequence[Row]) -> None:
    """Write the machine, the options, every row and every ratio as one JSON document."""
    document = {
        "machine": dict(machine),
        "options": asdict(options),
        "rows": [row.to_json() for row in rows],
        "ratios": [{"collective": c, "size": s, "peer": p, "tensorcomm_speedup": v}
                   for (c, s, p), v in ratios(rows).items()],
    }
    private.replace_file(path, (json.dumps(document, indent=1) + "\n").encode())
