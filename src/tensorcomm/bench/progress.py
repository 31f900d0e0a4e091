"""A progress bar on the terminal while the sweep runs (rich, else tqdm, else none).

Only when stdout is a terminal: piped or redirected output gets nothing but the table. With rich,
rows printed to ``sys.stdout`` inside the context appear above the bar.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

Advance = Callable[[str], None]  # called before each step with what it is about to run


@contextlib.contextmanager
def progress(total: int, enabled: bool) -> Iterator[Advance]:
    """A context yielding ``advance(description)``; a no-op unless ``enabled``."""
    if enabled:
        try:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        except ImportError:
            pass
        else:
            with Progress(TextColumn("{task.description:<40}"), BarColumn(),
                          TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                          transient=True) as bar:
                task = bar.add_task("starting", total=total)
                started = [False]

                def advance_rich(description: str) -> None:
                    # The bar counts finished steps: the first call only names the step.
                    bar.update(task, description=description, advance=1 if started[0] else 0)
                    started[0] = True

                yield advance_rich
                return
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            with tqdm(total=total, leave=False) as bar_tqdm:
                def advance_tqdm(description: str) -> None:
                    bar_tqdm.set_description_str(description)
                    bar_tqdm.update(1)

                yield advance_tqdm
                return
    yield lambda description: None
