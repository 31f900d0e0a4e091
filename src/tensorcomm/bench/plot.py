"""``--plot FILE.png``: busbw and time per call against size, log-log, one line per library.

Each line is the median; a shaded band around it spans the fastest and slowest batch (the
table's min and max), so a spread from a busy machine shows.

One row of two panels per collective. matplotlib is an optional dependency (the ``bench``
extra); it is imported only here, with the non-interactive Agg backend.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence

from ..rendezvous import private
from .results import Row


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _size_label(size: float, _position: object = None) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g}{unit}"
    return f"{size:g}"


def _band(rows: Sequence[Row]) -> tuple[list[float], list[float]]:
    """Each row's fastest and slowest batch time in µs (the median where a bound is missing)."""
    low = [r.min_us or r.time_us or 1.0 for r in rows]
    high = [r.max_us or r.time_us or 1.0 for r in rows]
    return low, high


def plot(rows: Sequence[Row], path: str, title: str) -> None:
    """Draw the rows that have numbers into ``path`` (PNG).

    Raises:
        PlotUnavailable: matplotlib is missing; the message says how to install it.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'tensorcomm[bench]'") from None

    measured = [r for r in rows if r.time_us is not None]
    collectives = list(dict.fromkeys(r.collective for r in rows))
    figure, axes = plt.subplots(len(collectives), 2, figsize=(12, 4 * len(collectives)),
                                squeeze=False)
    for (bw_axis, time_axis), collective in zip(axes, collectives, strict=True):
        for library in dict.fromkeys(r.library for r in rows):
            mine = sorted((r for r in measured if r.collective == collective
                           and r.library == library), key=lambda r: r.size)
            if not mine:
                continue
            sizes = [r.size for r in mine]
            line, = bw_axis.plot(sizes, [r.busbw for r in mine], marker="o", markersize=3,
                                 label=library)
            time_axis.plot(sizes, [r.time_us for r in mine], marker="o", markersize=3,
                           label=library, color=line.get_color())
            low, high = _band(mine)
            time_axis.fill_between(sizes, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            # busbw is inversely proportional to the time: the slowest batch is the lowest busbw
            scaled = [(r.busbw or 0.0) * (r.time_us or 0.0) for r in mine]
            bw_axis.fill_between(sizes, [b / t for b, t in zip(scaled, high, strict=True)],
                                 [b / t for b, t in zip(scaled, low, strict=True)],
                                 color=line.get_color(), alpha=0.2, linewidth=0)
        for axis, ylabel in ((bw_axis, "busbw (GB/s)"), (time_axis, "time per call (µs)")):
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.xaxis.set_major_formatter(FuncFormatter(_size_label))
            axis.set_xlabel("size (bytes)")
            axis.set_ylabel(ylabel)
            axis.set_title(f"{collective}: {ylabel.split(' (')[0]}")
            axis.grid(True, which="both", alpha=0.3)
            axis.legend()
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0, 1, 0.97))  # keep the suptitle clear of the panels
    image = io.BytesIO()  # written as report's files are: a link at ``path`` is replaced
    figure.savefig(image, dpi=110, format=os.path.splitext(path)[1][1:].lower() or "png")
    private.replace_file(path, image.getvalue())
    plt.close(figure)
