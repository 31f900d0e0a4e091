"""The interface one array type implements to enter tensorcomm."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Adapter(Protocol):
    """How tensorcomm reads, writes and creates one kind of array."""

    name: str  # shown in error messages, e.g. "numpy.ndarray"

    def accepts(self, obj: Any) -> bool:
        """Whether ``obj`` is of this adapter's kind (must not import a framework to decide)."""
        ...

    def as_numpy(self, obj: Any, writable: bool) -> np.ndarray:
        """A numpy view of ``obj`` (zero-copy where the framework allows).

        Raises:
            TypeError: ``writable`` is asked of an object that cannot be written in place.
        """
        ...

    def write_back(self, obj: Any, array: np.ndarray) -> None:
        """Make ``obj`` hold ``array``'s values (a no-op when ``as_numpy`` returned a view)."""
        ...

    def new_like(self, obj: Any, array: np.ndarray) -> Any:
        """A new object of ``obj``'s kind holding ``array``'s values."""
        ...
