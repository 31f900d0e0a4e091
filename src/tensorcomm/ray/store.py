"""The rendezvous store of a group of Ray actors, served by a Ray actor: no port of tensorcomm's own.

``StoreServer`` is an async Ray actor holding the keys (waits are coroutines, so one actor serves
every waiting rank at once) and the job secret, which it generates and hands only to callers of
its ``secret`` method: the secret travels in Ray's own actor calls, never in a command line, an
environment variable or a log. Anyone who can call Ray actors on the cluster can run code there
anyway; the secret keeps everyone else out of the job's sockets (docs/ray.md). ``RayStore`` is the
``Store`` the ranks use; it pickles (with its actor handle) into the actors that join.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import ray

from ..errors import RendezvousError
from ..rendezvous.auth import generate_secret
from ..rendezvous.store import (
    Store,
    add_to_counter,
    check_key,
    check_keys,
    check_value,
    compare_and_set,
    timeout_error,
)

CALL_MARGIN = 30.0  # seconds a store call may take beyond its own timeout before Ray is blamed
STOP_WAIT = 10.0  # seconds ``stop`` waits for the killed server to stop answering


@ray.remote(num_cpus=0)
class StoreServer:
    """Keys, values and the job secret of one group of actors (an async Ray actor)."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._secret = generate_secret()
        self._changed: asyncio.Condition | None = None  # made in the actor's event loop

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def secret(self) -> str:
        """The job secret (hex), generated when the server started."""
        return self._secret

    async def host(self) -> str:
        """The IP address of the node this server runs on."""
        return str(ray.util.get_node_ip_address())

    async def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``."""
        async with self._condition():
            self._data[key] = value
            self._condition().notify_all()

    async def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the counter ``key``; return the new count."""
        async with self._condition():
            count, self._data[key] = add_to_counter(key, self._data.get(key), amount)
            self._condition().notify_all()
            return count

    async def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected``; return what it holds then."""
        async with self._condition():
            store, value = compare_and_set(self._data.get(key), expected, desired)
            if store:
                self._data[key] = desired
                self._condition().notify_all()
            return value

    async def wait(self, keys: list[str], timeout: float) -> list[str]:
        """Wait until every key is set; return the keys still missing at the timeout."""
        changed = self._condition()
        async with changed:
            try:
                await asyncio.wait_for(changed.wait_for(lambda: all(k in self._data for k in keys)),
                                       timeout)
            except asyncio.TimeoutError:
                pass
            return [k for k in keys if k not in self._data]

    async def get(self, key: str, timeout: float) -> bytes | None:
        """The value of ``key`` once set; None if it is not set within ``timeout`` seconds."""
        missing = await self.wait([key], timeout)
        return None if missing else self._data[key]

    async def check(self, keys: list[str]) -> bool:
        """Whether every key is set."""
        return all(k in self._data for k in keys)

    async def delete(self, key: str) -> bool:
        """Remove ``key``; return whether it was set."""
        async with self._condition():
            return self._data.pop(key, None) is not None


class RayStore(Store):
    """A ``Store`` whose keys live in a ``StoreServer`` actor.

    Args:
        server: the ``StoreServer`` actor handle.
        timeout: default seconds for ``get`` and ``wait``.

    Attributes:
        host: the IP address of the node the server runs on; ranks listen on the interface that
            reaches it (``core.world``), so actors on other nodes can connect to them.
    """

    def __init__(self, server: Any, timeout: float = 300.0) -> None:
        super().__init__(timeout)
        self.server = server
        self.host = str(self._call(server.host.remote(), 0.0))

    @classmethod
    def create(cls, timeout: float = 300.0, name: str | None = None) -> RayStore:
        """Start a ``StoreServer`` (or, with ``name``, join the named one or start it) and
        connect to it; the server lives as long as the process that started it."""
        options: dict[str, Any] = {} if name is None else {"name": name, "get_if_exists": True}
        return cls(StoreServer.options(**options).remote(), timeout)  # type: ignore[attr-defined]

    def secret(self) -> str:
        """The job secret the server generated."""
        return str(self._call(self.server.secret.remote(), 0.0))

    def _call(self, ref: Any, timeout: float) -> Any:
        try:
            return ray.get(ref, timeout=timeout + CALL_MARGIN)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            raise RendezvousError(f"the Ray actor serving tensorcomm's store is gone or not "
                                  f"answering: {exc}") from exc

    def set(self, key: str, value: bytes) -> None:
        self._call(self.server.set.remote(check_key(key), check_value(value)), 0.0)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        seconds = self._timeout(timeout)
        value = self._call(self.server.get.remote(check_key(key), seconds), seconds)
        if value is None:
            raise timeout_error("get", [key], seconds)
        return bytes(value)

    def add(self, key: str, amount: int) -> int:
        return int(self._call(self.server.add.remote(check_key(key), amount), 0.0))

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        call = self.server.compare_set.remote(check_key(key), check_value(expected), check_value(desired))
        return bytes(self._call(call, 0.0))

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        seconds = self._timeout(timeout)
        missing = self._call(self.server.wait.remote(check_keys(keys), seconds), seconds)
        if missing:
            raise timeout_error("wait", missing, seconds)

    def check(self, keys: Sequence[str]) -> bool:
        return bool(self._call(self.server.check.remote(check_keys(keys)), 0.0))

    def delete(self, key: str) -> bool:
        return bool(self._call(self.server.delete.remote(check_key(key)), 0.0))

    def close(self) -> None:
        """Do nothing: the server belongs to whoever started it (``stop`` ends it)."""

    def stop(self) -> None:
        """End the server actor; return once it answers no more (``ray.kill`` only asks Ray to
        end it, and a call made right after could still be served), or after ``STOP_WAIT``
        seconds."""
        ray.kill(self.server)
        deadline = time.monotonic() + STOP_WAIT
        while time.monotonic() < deadline:
            try:
                ray.get(self.server.check.remote([]), timeout=STOP_WAIT)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                return
            time.sleep(0.01)
