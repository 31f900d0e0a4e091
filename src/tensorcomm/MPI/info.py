"""``MPI.Info``: string key/value hints. tensorcomm takes none, so an info is kept and handed
back, never acted on. Imports nothing of tensorcomm's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class Info:
    """A set of string hints; ``Info()`` is ``INFO_NULL``, ``Info.Create()`` an empty one."""

    __slots__ = ("_items",)

    def __init__(self, info: Info | None = None) -> None:
        self._items: dict[str, str] | None = None if info is None else info._items

    @classmethod
    def Create(cls, items: Any = None) -> Info:
        """An empty info (or one holding ``items``)."""
        made = cls()
        made._items = {}
        if items is not None:
            made.update(dict(items))
        return made

    def __bool__(self) -> bool:
        return self._items is not None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Info) and self._items is other._items

    def __hash__(self) -> int:
        return id(self._items)

    def _live(self) -> dict[str, str]:
        if self._items is None:
            raise ValueError("the info is MPI.INFO_NULL")
        return self._items

    def Dup(self) -> Info:
        """A copy."""
        return Info.Create(self._live())

    def Free(self) -> None:
        """Release the info."""
        self._items = None

    def Get(self, key: str) -> str | None:
        """The value of ``key``, or None."""
        return self._live().get(key)

    def Set(self, key: str, value: str) -> None:
        """Set ``key`` to ``value``."""
        self._live()[str(key)] = str(value)

    def Delete(self, key: str) -> None:
        """Remove ``key``."""
        del self._live()[key]

    def Get_nkeys(self) -> int:
        """How many keys."""
        return len(self._live())

    def Get_nthkey(self, n: int) -> str:
        """The ``n``-th key."""
        return list(self._live())[n]

    def __len__(self) -> int:
        return len(self._items or {})

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self._items or {}))

    def __contains__(self, key: object) -> bool:
        return key in (self._items or {})

    def __getitem__(self, key: str) -> str:
        return self._live()[key]

    def __setitem__(self, key: str, value: str) -> None:
        self.Set(key, value)

    def __delitem__(self, key: str) -> None:
        self.Delete(key)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""
        return (self._items or {}).get(key, default)

    def keys(self) -> list[str]:
        """The keys."""
        return list(self._items or {})

    def values(self) -> list[str]:
        """The values."""
        return list((self._items or {}).values())

    def items(self) -> list[tuple[str, str]]:
        """The pairs."""
        return list((self._items or {}).items())

    def update(self, other: Any = (), **kwargs: str) -> None:
        """Set many keys."""
        for key, value in dict(other, **kwargs).items():
            self.Set(key, value)

    def pop(self, key: str, *default: Any) -> Any:
        """Remove ``key`` and return its value."""
        return self._live().pop(key, *default)

    def clear(self) -> None:
        """Remove every key."""
        self._live().clear()

    def copy(self) -> Info:
        """A copy."""
        return self.Dup()


INFO_NULL = Info()
INFO_ENV = Info.Create()
