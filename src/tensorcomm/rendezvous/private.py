"""Files only this user can reach: the trust check for them, and generated job secrets kept in them.

Owns :func:`unsafe` (what makes a file or directory someone else could have read, written or
planted), the checked reads and writes of files that are not secret but must not be planted
(:func:`trusted_dir`, :func:`read_trusted`, :func:`write_replacing`: flight records, timelines,
the tuning file, launcher logs), the link-proof write of output a user names anywhere
(:func:`replace_file`: benchmark results), where such files go by default (:func:`user_dir`),
:class:`SecretDir` (the directory generated secrets
live in) and :class:`SecretFile` (one such secret, removed by its writer). Imports ``errors``
only.

Why files: a job started without ``TENSORCOMM_SECRET`` on one host still needs a key strangers
cannot know, and the ranks share no channel that is private to them (torch's store and a store
on loopback are open to every local user). A 0600 file in a directory only this user can enter
is such a channel on one host: the process that makes the secret writes it there, the other
ranks read it. Other users cannot; processes of the same user and root can (docs/security.md).

Which directory: ``TENSORCOMM_SECRET_DIR`` if set, else ``$XDG_RUNTIME_DIR/tensorcomm`` (both
chosen by ``discovery``), else :func:`default_dir`: ``~/.cache/tensorcomm`` under this user's
own home (from the password database, not ``$HOME``), and only for a user without a private home
``/tmp/tensorcomm-<uid>``, a name any local user could create first (docs/security.md). Every
rank probes that it can write there, so a full or read-only disk is a prompt error naming the
directory on every rank, not a wait for a file that never comes.

Every path is opened with ``O_NOFOLLOW`` and checked on the open descriptor (owner = this
process's effective uid, no permission bits for group or other, the right kind of file), so a
link or a file planted by another user is refused, never followed or trusted. A secret file is
written under a temporary name (``O_EXCL``) and renamed into place, so a reader never sees half
of one and a stale file left by an earlier job is replaced atomically.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from tensorcomm.errors import RendezvousError

DEFAULT_DIR = "/tmp/tensorcomm-{uid}"  # the last resort: for a user without a private home
HOME_DIR = (".cache", "tensorcomm")  # under the home directory, before DEFAULT_DIR
FILE_PREFIX = "tensorcomm-"
_MAX_SECRET_BYTES = 4096
_PROBE_BYTES = 64  # a secret file's size: what the probe writes


def unsafe(info: os.stat_result, directory: bool, shared_reading: bool = False) -> str | None:
    """Why ``info`` (from ``fstat``) is not this user's private file or directory, or None if it is.

    ``shared_reading``: others may read it, as long as only this user (or root, who can change
    anything anyway) owns it and only its owner may write to it: for records and settings that
    are not secret but must not be planted or changed by someone else.
    """
    if directory and not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if not directory and not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    euid = os.geteuid()
    if info.st_uid != euid and not (shared_reading and info.st_uid == 0):
        return f"is owned by uid {info.st_uid}, not by this user (uid {euid})"
    if info.st_mode & (0o022 if shared_reading else 0o077):
        return (f"has mode {stat.S_IMODE(info.st_mode):04o}: group or other users have "
                f"{'write ' if shared_reading else ''}permission bits on it")
    return None


class Untrusted(PermissionError):
    """A file or directory another user could have planted, changed or linked: refused.
    ``reason``: what is wrong with it and what follows, without its name."""

    def __init__(self, what: str, path: str, reason: str) -> None:
        super().__init__(f"{what} {path}: {reason}")
        self.reason = reason


def trusted_dir(path: str, create: bool = False, what: str = "directory") -> int:
    """Open the directory ``path`` (made mode 0700, with its parents, if ``create`` and missing)
    and return its descriptor, if it is this user's (or root's) and nobody else may write in it.

    Raises:
        Untrusted: it is a link, or someone else owns it or may write in it; the message names
            ``what`` and ``path`` and says why.
        OSError: it cannot be created or opened.
    """
    if create and not os.path.lexists(path):
        with contextlib.suppress(FileExistsError):  # made by a rank beside us: checked next
            os.makedirs(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            raise Untrusted(what, path, "is a symbolic link; refusing to follow it (another user "
                            "may have planted it)") from None
        raise
    problem = unsafe(os.fstat(fd), directory=True, shared_reading=True)
    if problem is not None:
        os.close(fd)
        raise Untrusted(what, path, f"{problem}; refusing to use it: it must be a directory that "
                                    f"only this user (uid {os.geteuid()}) may write in")
    return fd


def read_trusted(path: str, what: str = "file", dir_fd: int | None = None, shown: str | None = None,
                 follow: bool = False) -> bytes:
    """The contents of the regular file ``path`` (relative to ``dir_fd`` if given; ``shown``: its
    full path, for messages), if this user (or root) owns it and nobody else may write to it; a
    link is refused unless ``follow`` (then what it leads to is checked).

    Raises:
        Untrusted: it is a link (not ``follow``), not a regular file, someone else's, or
            writable by others; the message names ``what`` and the path and says why.
        OSError: it cannot be opened or read (FileNotFoundError: there is none).
    """
    shown = path if shown is None else shown
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise Untrusted(what, shown, "is a symbolic link; refusing to follow it (another user "
                            "may have planted it)") from None
        raise
    try:
        problem = unsafe(os.fstat(fd), directory=False, shared_reading=True)
        if problem is not None:
            raise Untrusted(what, shown, f"{problem}; refusing to trust it (another user may have "
                                         f"planted or changed it)")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def create_replacing(dir_fd: int, name: str, mode: int = 0o600) -> int:
    """A new file, open for writing, that has just replaced ``name`` in the directory ``dir_fd``
    (a link or a stranger's file of that name is replaced, never followed or written to)."""
    temporary = f".{name}.{secrets.token_hex(8)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode, dir_fd=dir_fd)
    try:
        os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise
    return fd


def write_replacing(dir_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``name`` in the directory ``dir_fd`` all at once: it is written under a
    temporary name and renamed into place, so a reader sees the old file or the new one."""
    temporary = f".{name}.{secrets.token_hex(8)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise


def replace_file(path: str, data: bytes, mode: int = 0o666) -> None:
    """Write ``data`` to ``path`` by :func:`write_replacing` in its directory, whoever owns that
    directory: for output a user names anywhere, ``/tmp`` included, and tensorcomm never reads
    back (a link at ``path`` is replaced, not followed). ``mode`` is masked by the umask, as
    ``open`` does.

    Raises:
        OSError: the directory cannot be opened or written in, or ``path`` cannot be replaced
            (in a sticky directory like ``/tmp``: another user's file or link of that name);
            its ``filename`` is ``path``.
    """
    try:
        dir_fd = os.open(os.path.dirname(os.path.abspath(path)),
                         os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            write_replacing(dir_fd, os.path.basename(path), data, mode)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), path) from None


def user_dir(name: str) -> str:
    """``<base>/<name>`` for files of this user's that are not secret (the flight recorder's
    records), where ``<base>`` is the default private directory of generated secrets:
    ``$XDG_RUNTIME_DIR/tensorcomm`` if ``XDG_RUNTIME_DIR`` is set, else :func:`default_dir`.
    ``<base>`` is made mode 0700 if missing (as :class:`SecretDir` would), so a secret can still
    be kept in it; ``<name>`` is left for its writer to make and check (:func:`trusted_dir`).
    If ``<base>`` is a link or another user may write in it (the last resort
    ``/tmp/tensorcomm-<uid>``, made first by someone else), or cannot be made, ``<base>`` itself
    is returned: its writer's check then refuses it by name, rather than trusting ``<name>``
    inside a directory someone else controls."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = os.path.join(runtime, HOME_DIR[-1]) if runtime else default_dir()
    with contextlib.suppress(OSError):  # exists already, or cannot be made: checked next
        os.mkdir(base, 0o700)
    try:
        problem = unsafe(os.lstat(base), directory=True, shared_reading=True)
    except OSError:
        return base
    return base if problem is not None else os.path.join(base, name)


def default_dir() -> str:
    """The directory for generated secrets when neither ``TENSORCOMM_SECRET_DIR`` nor
    ``XDG_RUNTIME_DIR`` is set: ``~/.cache/tensorcomm`` if this user's home (and its ``.cache``)
    is this user's, writable by nobody else and writable at all (not a read-only home, as in
    some containers), else ``/tmp/tensorcomm-<uid>``."""
    euid = os.geteuid()
    try:
        parent = pwd.getpwuid(euid).pw_dir
    except KeyError:
        return DEFAULT_DIR.format(uid=euid)
    for part in HOME_DIR[:-1]:
        if not _own_directory(parent, euid):
            return DEFAULT_DIR.format(uid=euid)
        parent = os.path.join(parent, part)
        with contextlib.suppress(OSError):  # exists already, or cannot be made: checked next
            os.mkdir(parent, 0o700)
    if not _own_directory(parent, euid) or not os.access(parent, os.W_OK):
        return DEFAULT_DIR.format(uid=euid)
    return os.path.join(parent, HOME_DIR[-1])


def _own_directory(path: str, euid: int) -> bool:
    """Whether ``path`` (a link is followed: homes may be links) is a directory of ``euid`` that
    no other user may write to."""
    try:
        info = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == euid and not info.st_mode & 0o022


def open_nofollow(path: str, flags: int, mode: int = 0o600, dir_fd: int | None = None) -> int:
    """``os.open`` that refuses a symbolic link with a RendezvousError naming ``path``."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RendezvousError(f"{path}: is a symbolic link; refusing to follow it (another "
                                  f"user may have planted it)") from None
        raise


@dataclass(frozen=True)
class SecretFile:
    """A generated job secret as written by :meth:`SecretDir.write`; its writer removes it."""

    directory: SecretDir
    name: str
    secret: bytes

    @property
    def path(self) -> str:
        """The file's full path."""
        return os.path.join(self.directory.path, self.name)

    def remove(self) -> None:
        """Delete the file if it still holds this secret (a later job's is left alone)."""
        try:
            if self.directory.read(self.name) == self.secret:
                with self.directory.opened() as dir_fd:
                    os.unlink(self.name, dir_fd=dir_fd)
        except (OSError, RendezvousError):
            pass  # gone already, or the directory changed under us: nothing of ours to remove


class SecretDir:
    """The directory generated job secrets live in, created (mode 0700) if missing.

    Args:
        path: the directory; None means :func:`default_dir`.
        hint: what to set instead, for the error message (e.g. the variable names).

    Raises:
        RendezvousError: the directory cannot be created or opened, is a link, is not this
            user's, lets group or other users in, or a file cannot be written in it (a full
            disk, a quota, a read-only file system or directory); the message names it and
            what is wrong.
    """

    def __init__(self, path: str | None, hint: str = "") -> None:
        self.path = default_dir() if path is None else path
        self._hint = hint
        try:
            os.mkdir(self.path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise self._error(f"cannot create it: {exc}") from None
        with self.opened() as dir_fd:  # checks it
            probe = f".probe-{secrets.token_hex(8)}"
            try:
                fd = open_nofollow(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd)
                try:
                    os.write(fd, bytes(_PROBE_BYTES))
                finally:
                    os.close(fd)
                    with contextlib.suppress(OSError):
                        os.unlink(probe, dir_fd=dir_fd)
            except OSError as exc:
                raise self._unwritable(exc) from None

    def _unwritable(self, exc: OSError) -> RendezvousError:
        return RendezvousError(f"secret directory {self.path}: cannot write a file in it: "
                               f"{exc.strerror or exc} (a full disk, a quota, a read-only file "
                               f"system or directory?)" + (f". {self._hint}" if self._hint else ""))

    def _error(self, problem: str) -> RendezvousError:
        return RendezvousError(f"secret directory {self.path}: {problem}; it must be a directory "
                               f"only this user can enter (owned by uid {os.geteuid()}, mode 0700)"
                               + (f". {self._hint}" if self._hint else ""))

    @contextlib.contextmanager
    def opened(self) -> Iterator[int]:
        """Open and check the directory; yield its descriptor (for ``dir_fd=``)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(self.path):
                raise self._error("is a symbolic link") from None
            raise self._error(f"cannot open it: {exc}") from None
        try:
            problem = unsafe(os.fstat(fd), directory=True)
            if problem is not None:
                raise self._error(problem)
            yield fd
        finally:
            os.close(fd)

    def write(self, name: str, secret: bytes) -> SecretFile:
        """Write ``secret`` to ``name`` (mode 0600), replacing a stale file of that name."""
        temporary = f".{name}.{secrets.token_hex(8)}"
        with self.opened() as dir_fd:
            try:
                fd = open_nofollow(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd)
            except OSError as exc:
                raise self._unwritable(exc) from None
            try:
                try:
                    view = memoryview(secret)
                    while view:
                        view = view[os.write(fd, view):]
                finally:
                    os.close(fd)
                os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException as exc:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=dir_fd)
                if isinstance(exc, OSError):
                    raise self._unwritable(exc) from None
                raise
        return SecretFile(self, name, secret)

    def read(self, name: str) -> bytes | None:
        """The secret in ``name``, or None while there is no such file (or it is empty).

        Raises:
            RendezvousError: the file is a link, not a regular file, or not private to this user.
        """
        with self.opened() as dir_fd:
            path = os.path.join(self.path, name)
            try:
                fd = open_nofollow(name, os.O_RDONLY | os.O_NONBLOCK, dir_fd=dir_fd)
            except FileNotFoundError:
                return None
            except RendezvousError as exc:
                raise RendezvousError(f"secret file {path}: {exc}") from None
            try:
                problem = unsafe(os.fstat(fd), directory=False)
                if problem is not None:
                    raise RendezvousError(f"secret file {path}: {problem}; remove it")
                data = os.read(fd, _MAX_SECRET_BYTES)
            finally:
                os.close(fd)
        return data or None


def store_secret_name(host: str, port: int) -> str:
    """The secret file of the tensorcomm store at ``host:port`` on this host.

    The network namespace is part of the name: the same loopback address in two namespaces is
    two different stores. So is the kernel's boot id: a home directory may be shared by several
    hosts (NFS), whose loopback addresses and namespace numbers repeat.
    """
    try:
        namespace = str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        namespace = "host"
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            boot = file.read().strip().replace("-", "")
    except OSError:
        boot = "boot"
    printable = "".join(c if c.isalnum() or c in ".-" else "_" for c in f"{boot}-{namespace}-{host}")
    return f"{FILE_PREFIX}store-{printable}-{port}.key"


def job_secret_name() -> str:
    """A fresh random name for a job's secret file (announced through a store, so no clashes)."""
    return f"{FILE_PREFIX}job-{secrets.token_hex(16)}.key"


def valid_job_secret_name(name: str) -> bool:
    """Whether ``name`` is one :func:`job_secret_name` makes (so a store cannot name other paths)."""
    stem = name.removeprefix(f"{FILE_PREFIX}job-").removesuffix(".key")
    return (name == f"{FILE_PREFIX}job-{stem}.key" and len(stem) == 32
            and all(c in "0123456789abcdef" for c in stem))
