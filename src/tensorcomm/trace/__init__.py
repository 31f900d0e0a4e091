"""Seeing what ran: the flight recorder (``recorder``), timelines (``chrome``), and the tools
behind ``tensorcomm trace merge`` and ``tensorcomm trace analyze``. docs/tracing.md.

``start(directory)`` / ``stop()`` write a timeline of this rank's calls (``start`` is collective);
``dump(reason)`` writes the flight recorder's calls now.
"""

from __future__ import annotations

from collections.abc import Callable

from .chrome import start, stop
from .recorder import dump

__all__ = ["dump", "start", "stop"]


def on_init(rank: int, world_size: int, barrier: Callable[[], object]) -> None:
    """Set the recorder and the timeline up from the environment for a new world (``init()``
    calls it, collectively: a timeline starts with barriers)."""
    from ..rendezvous.discovery import trace_settings
    from . import chrome, recorder

    directory, calls, flight_dir = trace_settings()
    recorder.configure(calls, flight_dir)
    recorder.joined(rank, world_size)
    chrome.joined(barrier, rank, world_size)
    if calls:
        recorder.install_signal_handler()
    if directory:
        start(directory)


def on_destroy() -> None:
    """The world ends: finish the timeline; later dumps name no rank."""
    from . import chrome

    stop()
    chrome.joined(None, None, None)
