"""The key/value store ranks use to find each other, and its in-process, prefix and file forms.

Owns: the :class:`Store` interface every store implements (``tcp_store.TCPStore`` too), argument
checks shared by all of them, :class:`HashStore` (one process, for tests), :class:`PrefixStore`
(a namespace inside another store, one per group) and :class:`FileStore` (processes sharing a
file, for ``file://``). Imports ``config``, ``errors`` and ``rendezvous.private`` only.

Values are bytes; ``add`` keeps its counter as the decimal ASCII text of the number, so ``get``
on a counter returns e.g. ``b"3"`` (as torch's stores do). ``compare_set`` is the one
read-modify-write on values: what ``core/elastic.py`` agrees through (the first proposal wins).
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import itertools
import math
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from tensorcomm.config import MAX_TIMEOUT
from tensorcomm.errors import CommTimeoutError, RendezvousError
from tensorcomm.rendezvous.private import open_nofollow, unsafe

MAX_KEY_BYTES = 4 << 10  # UTF-8 bytes of one key
MAX_VALUE_BYTES = 64 << 20  # bytes of one value

# FileStore polls the file while it waits; back off up to this interval between reads.
_FILE_POLL_MAX = 0.05
_FILE_REFCOUNT_KEY = "__tensorcomm_filestore_users"


class Store(abc.ABC):
    """A key/value store shared by the ranks of a job.

    ``foreign`` is True for a store tensorcomm does not own and others may read and write
    (torch's): tensorcomm then keeps its keys in a store of its own (``rendezvous.own_store``).

    Args:
        timeout: seconds ``get``/``wait`` block when called with ``timeout=None``.
    """

    foreign = False

    def __init__(self, timeout: float = 300.0) -> None:
        self.timeout = check_timeout(timeout, "timeout")

    @abc.abstractmethod
    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` (bytes, or str encoded as UTF-8) under ``key``, replacing any old value."""

    @abc.abstractmethod
    def get(self, key: str, timeout: float | None = None) -> bytes:
        """Return the value of ``key``, waiting until some rank sets it.

        Raises:
            CommTimeoutError: ``key`` was not set within ``timeout`` (None: the store's default).
        """

    @abc.abstractmethod
    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter ``key`` (created at 0) and return the new value.

        Raises:
            ValueError: ``key`` holds a value that is not a counter.
        """

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Atomically set ``key`` to ``desired`` if it holds ``expected``; return what it holds then.

        An unset key counts as holding ``b""``: ``compare_set(key, b"", value)`` sets ``key``
        only if nobody has, and returns the value that won. (torch's ``compare_set`` is the same
        except that for an unset key and a non-empty ``expected`` it returns ``expected``.)

        Raises:
            NotImplementedError: this kind of store cannot compare and set atomically (every
                store of tensorcomm can; a store of your own must override this for
                ``Group.shrink``).
        """
        raise NotImplementedError(f"{type(self).__name__} has no compare_set; Group.shrink needs a "
                                  "store that can compare and set atomically")

    @abc.abstractmethod
    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key in ``keys`` is set.

        Raises:
            CommTimeoutError: some keys were still missing after ``timeout``; the message names them.
        """

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        """Return the values of ``keys`` once every one is set, in order.

        Stores of tensorcomm answer in one request (what ``init`` reads every rank's join entry
        with); this default waits, then reads key by key.

        Raises:
            CommTimeoutError: some keys were still missing after ``timeout``; the message names them.
        """
        keys, timeout = check_keys(keys), self._timeout(timeout)
        self.wait(keys, timeout)
        return [self.get(key, timeout) for key in keys]

    @abc.abstractmethod
    def check(self, keys: Sequence[str]) -> bool:
        """Return whether every key in ``keys`` is set, without waiting."""

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Remove ``key``; return whether it existed."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store's resources; idempotent."""

    def _timeout(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else check_timeout(timeout, "timeout")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def check_timeout(timeout: float, argument: str) -> float:
    """Return ``timeout`` as float seconds.

    Raises:
        TypeError: not a number.
        ValueError: negative, inf/nan, or above ``config.MAX_TIMEOUT`` (longer waits overflow
            the platform's timers).
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{argument}: expected seconds as a number, got {type(timeout).__name__}")
    if not math.isfinite(timeout) or not 0 <= timeout <= MAX_TIMEOUT:
        raise ValueError(f"{argument}: expected a number of seconds in 0..{MAX_TIMEOUT:g}, got {timeout}")
    return float(timeout)


def check_key(key: str) -> str:
    """Return ``key``; TypeError if not a str, ValueError if over MAX_KEY_BYTES in UTF-8."""
    if not isinstance(key, str):
        raise TypeError(f"key: expected str, got {type(key).__name__}")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise ValueError(f"key: at most {MAX_KEY_BYTES} UTF-8 bytes allowed, got a key starting {key[:40]!r}")
    return key


def check_keys(keys: Sequence[str]) -> list[str]:
    """Return ``keys`` as a list of checked keys; TypeError for a lone str or a non-sequence."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise TypeError(f"keys: expected a sequence of str, got {type(keys).__name__}")
    return [check_key(k) for k in keys]


def check_value(value: bytes | str) -> bytes:
    """Return ``value`` as bytes (str as UTF-8); TypeError if neither, ValueError if too large."""
    if isinstance(value, str):
        value = value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value)
    else:
        raise TypeError(f"value: expected bytes or str, got {type(value).__name__}")
    if len(value) > MAX_VALUE_BYTES:
        raise ValueError(f"value: at most {MAX_VALUE_BYTES} bytes allowed, got {len(value)}")
    return value


def check_amount(amount: int) -> int:
    """Return ``amount``; TypeError if not an int (or a bool), ValueError if beyond 64 signed bits."""
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise TypeError(f"amount: expected int, got {type(amount).__name__}")
    if not -(1 << 63) <= amount < (1 << 63):
        raise ValueError(f"amount: must fit in 64 signed bits, got {amount}")
    return amount


def add_to_counter(key: str, old: bytes | None, amount: int) -> tuple[int, bytes]:
    """Return the new count and its stored form; ValueError if ``old`` is not a decimal integer."""
    try:
        count = (0 if old is None else int(old.decode("ascii"))) + amount
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"add: key {key!r} holds {(old or b'')[:40]!r}, which is not a counter") from None
    return count, str(count).encode("ascii")


def compare_and_set(old: bytes | None, expected: bytes, desired: bytes) -> tuple[bool, bytes]:
    """``compare_set``'s rule on a key holding ``old`` (None: unset): (whether to store
    ``desired``, the value to return)."""
    current = b"" if old is None else old
    return (True, desired) if current == expected else (False, current)


def timeout_error(op: str, missing: Sequence[str], timeout: float) -> CommTimeoutError:
    """Build the error a ``get``/``wait`` raises when ``missing`` keys did not appear in time."""
    names = ", ".join(repr(k) for k in missing)
    noun = "key" if len(missing) == 1 else "keys"
    return CommTimeoutError(f"store {op}: {noun} {names} not set within {timeout:g} s")


def wait_for(keys: list[str], timeout: float, op: str, look: Callable[[], dict[str, bytes]],
             pause: Callable[[float], object]) -> list[bytes]:
    """The values of ``keys`` once all are set: ``look()`` gives the store's keys and values as
    they are now, ``pause(remaining)`` waits (at most ``remaining`` seconds) before it looks again.

    Raises:
        CommTimeoutError: some keys were still missing after ``timeout`` (``op``'s error).
    """
    deadline = time.monotonic() + timeout
    while True:
        data = look()
        missing = [k for k in keys if k not in data]
        if not missing:
            return [data[k] for k in keys]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise timeout_error(op, missing, timeout)
        pause(remaining)


class HashStore(Store):
    """A store held in this process's memory, shared by its threads (ranks-as-threads tests)."""

    def __init__(self, timeout: float = 300.0) -> None:
        super().__init__(timeout)
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._closed = False

    def set(self, key: str, value: bytes) -> None:
        key, value = check_key(key), check_value(value)
        with self._cond:
            self._check_open()
            self._data[key] = value
            self._cond.notify_all()

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return self._wait_for([check_key(key)], self._timeout(timeout), "get")[0]

    def add(self, key: str, amount: int) -> int:
        key, amount = check_key(key), check_amount(amount)
        with self._cond:
            self._check_open()
            count, self._data[key] = add_to_counter(key, self._data.get(key), amount)
            self._cond.notify_all()
            return count

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        key, expected, desired = check_key(key), check_value(expected), check_value(desired)
        with self._cond:
            self._check_open()
            store, value = compare_and_set(self._data.get(key), expected, desired)
            if store:
                self._data[key] = desired
                self._cond.notify_all()
            return value

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        self._wait_for(check_keys(keys), self._timeout(timeout), "wait")

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        return self._wait_for(check_keys(keys), self._timeout(timeout), "multi_get")

    def check(self, keys: Sequence[str]) -> bool:
        keys = check_keys(keys)
        with self._cond:
            self._check_open()
            return all(k in self._data for k in keys)

    def delete(self, key: str) -> bool:
        key = check_key(key)
        with self._cond:
            self._check_open()
            return self._data.pop(key, None) is not None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _wait_for(self, keys: list[str], timeout: float, op: str) -> list[bytes]:
        def look() -> dict[str, bytes]:
            self._check_open()
            return self._data

        with self._cond:  # ``wait`` releases it while it sleeps
            return wait_for(keys, timeout, op, look, self._cond.wait)

    def _check_open(self) -> None:
        if self._closed:
            raise RendezvousError("the store is closed")


class PrefixStore(Store):
    """A namespace inside another store: key ``k`` is stored as ``f"{prefix}/{k}"``.

    The wrapped store belongs to whoever made it; closing a PrefixStore leaves it open.

    Args:
        prefix: the namespace, e.g. a group's name.
        store: the store to share; its default timeout is inherited.
    """

    def __init__(self, prefix: str, store: Store) -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix: expected str, got {type(prefix).__name__}")
        if not isinstance(store, Store):
            raise TypeError(f"store: expected a tensorcomm Store, got {type(store).__name__}")
        super().__init__(store.timeout)
        self.prefix = prefix
        self.store = store
        self.foreign = store.foreign

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{check_key(key)}"

    def set(self, key: str, value: bytes) -> None:
        self.store.set(self._key(key), value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return self.store.get(self._key(key), self._timeout(timeout))

    def add(self, key: str, amount: int) -> int:
        return self.store.add(self._key(key), amount)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self.store.compare_set(self._key(key), expected, desired)

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        self.store.wait([self._key(k) for k in check_keys(keys)], self._timeout(timeout))

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        return self.store.multi_get([self._key(k) for k in check_keys(keys)], self._timeout(timeout))

    def check(self, keys: Sequence[str]) -> bool:
        return self.store.check([self._key(k) for k in check_keys(keys)])

    def delete(self, key: str) -> bool:
        return self.store.delete(self._key(key))

    def close(self) -> None:
        """Do nothing: the wrapped store is closed by its owner."""


# One FileStore record: op, key length, value length, then the key and value bytes.
_RECORD = struct.Struct("!cIQ")
_SET, _DELETE = b"S", b"D"


class FileStore(Store):
    """A store shared by processes through an append-only file locked with ``fcntl.flock``.

    Every instance counts itself in the file; the last one to ``close`` removes the file, so a
    later job at the same path starts empty. A file left by a crashed job must be removed by hand
    (its keys would otherwise be seen as already set).

    The store may hold the job secret, so the file is trusted only if it is this user's alone:
    it is created exclusively (``O_EXCL``, mode 0600), and an existing one must be a regular
    file (not a link) owned by this user with no permission bits for group or other.

    Args:
        path: the file.
        timeout: default seconds for ``get``/``wait``.

    Raises:
        RendezvousError: the file exists but another user could have read or planted it; the
            message names the path and what is wrong.
    """

    def __init__(self, path: str, timeout: float = 300.0) -> None:
        super().__init__(timeout)
        self.path = os.fspath(path)
        self._lock = threading.Lock()  # guards the parse cache below between threads
        self._data: dict[str, bytes] = {}
        self._offset = 0
        self._closed = False
        self.add(_FILE_REFCOUNT_KEY, 1)

    def set(self, key: str, value: bytes) -> None:
        key, value = check_key(key), check_value(value)
        with self._locked(fcntl.LOCK_EX) as fd:
            self._append(fd, _SET, key, value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return self._wait_for([check_key(key)], self._timeout(timeout), "get")[0]

    def add(self, key: str, amount: int) -> int:
        key, amount = check_key(key), check_amount(amount)
        with self._locked(fcntl.LOCK_EX) as fd:
            count, stored = add_to_counter(key, self._data.get(key), amount)
            self._append(fd, _SET, key, stored)
            return count

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        key, expected, desired = check_key(key), check_value(expected), check_value(desired)
        with self._locked(fcntl.LOCK_EX) as fd:
            store, value = compare_and_set(self._data.get(key), expected, desired)
            if store:
                self._append(fd, _SET, key, desired)
            return value

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        self._wait_for(check_keys(keys), self._timeout(timeout), "wait")

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        return self._wait_for(check_keys(keys), self._timeout(timeout), "multi_get")

    def check(self, keys: Sequence[str]) -> bool:
        keys = check_keys(keys)
        with self._locked(fcntl.LOCK_SH):
            return all(k in self._data for k in keys)

    def delete(self, key: str) -> bool:
        key = check_key(key)
        with self._locked(fcntl.LOCK_EX) as fd:
            existed = key in self._data
            if existed:
                self._append(fd, _DELETE, key, b"")
            return existed

    def close(self) -> None:
        try:
            with self._locked(fcntl.LOCK_EX, closing=True) as fd:
                count, stored = add_to_counter(_FILE_REFCOUNT_KEY, self._data.get(_FILE_REFCOUNT_KEY), -1)
                self._append(fd, _SET, _FILE_REFCOUNT_KEY, stored)
                if count <= 0:
                    os.unlink(self.path)
        except FileNotFoundError:  # removed by hand already
            pass

    def _wait_for(self, keys: list[str], timeout: float, op: str) -> list[bytes]:
        def look() -> dict[str, bytes]:
            with self._locked(fcntl.LOCK_SH):
                return dict(self._data)

        pauses = (min(0.001 * 2 ** n, _FILE_POLL_MAX) for n in itertools.count())
        return wait_for(keys, timeout, op, look, lambda remaining: time.sleep(min(next(pauses), remaining)))

    @contextlib.contextmanager
    def _locked(self, mode: int, closing: bool = False) -> Iterator[int]:
        """Open and flock the file and bring the parse cache up to date; yield the descriptor.

        With ``closing`` the store is marked closed (once) and the file is not re-created.
        """
        with self._lock:
            if self._closed:
                if closing:
                    raise FileNotFoundError(self.path)  # already closed: nothing to do
                raise RendezvousError(f"FileStore {self.path} is closed")
            self._closed = closing
            fd = self._open(create=not closing)
            try:
                fcntl.flock(fd, mode)  # released when fd is closed
                self._refresh(fd)
                yield fd
            finally:
                os.close(fd)

    def _open(self, create: bool) -> int:
        """Open the file (creating it, exclusively, if ``create``) and check it is ours alone."""
        flags = os.O_RDWR | os.O_APPEND
        while True:
            try:
                fd = open_nofollow(self.path, flags)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    return open_nofollow(self.path, flags | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    continue  # another rank made it first: open and check theirs
            except RendezvousError as exc:
                raise RendezvousError(f"FileStore {exc}") from None
            problem = unsafe(os.fstat(fd), directory=False)
            if problem is None:
                return fd
            os.close(fd)
            raise RendezvousError(f"FileStore {self.path}: {problem}; refusing a file another user "
                                  f"could read or have planted (remove it, or use another path)")

    def _refresh(self, fd: int) -> None:
        """Parse the records appended since the last read (caller holds the file lock)."""
        size = os.fstat(fd).st_size
        if size < self._offset:
            raise RendezvousError(f"FileStore {self.path}: the file shrank; was it replaced?")
        chunk = os.pread(fd, size - self._offset, self._offset)
        pos = 0
        while pos + _RECORD.size <= len(chunk):
            op, klen, vlen = _RECORD.unpack_from(chunk, pos)
            end = pos + _RECORD.size + klen + vlen
            if end > len(chunk):
                # Writers append whole records under the exclusive lock, so a short record
                # means a write failed (disk full?) and every later record is misaligned.
                raise RendezvousError(f"FileStore {self.path}: truncated record at byte {self._offset + pos}")
            key = chunk[pos + _RECORD.size:pos + _RECORD.size + klen].decode("utf-8")
            if op == _SET:
                self._data[key] = chunk[end - vlen:end]
            elif op == _DELETE:
                self._data.pop(key, None)
            else:
                raise RendezvousError(f"FileStore {self.path}: corrupt record at byte {self._offset + pos}")
            pos = end
        self._offset += pos

    def _append(self, fd: int, op: bytes, key: str, value: bytes) -> None:
        raw_key = key.encode("utf-8")
        record = memoryview(_RECORD.pack(op, len(raw_key), len(value)) + raw_key + value)
        while record:  # a write may be partial; we hold the exclusive lock, so nothing interleaves
            record = record[os.write(fd, record):]
        self._refresh(fd)
