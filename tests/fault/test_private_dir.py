"""The private directory of generated secrets (issue 21): another user who creates the
predictable ``/tmp/tensorcomm-<uid>`` first stops no job, and a full or read-only disk is a
prompt RendezvousError naming the directory on every rank, not a wait for a file that never
comes.

Ranks are threads here, each with its own rendezvous; "another user" is ``nobody`` and needs
root, as do the file systems mounted for a full and a read-only disk (else those tests skip).
The rendezvous timeout is far above the threads' hard limit, so a rank that waits for its
timeout fails the test.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tensorcomm import config
from tensorcomm.errors import RendezvousError
from tensorcomm.rendezvous import private, rendezvous
from tensorcomm.testing import free_port

from helpers import NOBODY

pytestmark = pytest.mark.fault

RENDEZVOUS_TIMEOUT = 600.0  # far beyond HARD_LIMIT: waiting it out fails the test
HARD_LIMIT = 60.0


def in_threads(count: int, fn: Callable[[int], Any]) -> list[Any]:
    """Run ``fn(i)`` in ``count`` threads; return results (or the exceptions raised) by index."""
    results: list[Any] = [None] * count

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HARD_LIMIT)
    assert not any(thread.is_alive() for thread in threads), f"a rank still waits: {results}"
    return results


def two_ranks(environ: dict[str, str]) -> list[Any]:
    """Rendezvous of a 2-rank job on loopback without TENSORCOMM_SECRET; each rank closes its end."""
    url = f"tcp://127.0.0.1:{free_port()}"

    left = threading.Event()  # rank 1 has closed its store client

    def rank(i: int) -> str:
        try:
            with rendezvous(url, i, 2, RENDEZVOUS_TIMEOUT, environ=environ) as meeting:
                meeting.store.set(f"hello/{i}", b"1")
                meeting.store.get(f"hello/{1 - i}", HARD_LIMIT)
                if i == 0:  # the host keeps its store until the other rank has left it (a "bye"
                    left.wait(HARD_LIMIT)  # key read here could beat the server's reply to its set)
        finally:
            if i == 1:
                left.set()
        return "ok"

    return in_threads(2, rank)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment with no secret, no secret directory and no runtime directory."""
    for name in (config.ENV_SECRET, config.ENV_SECRET_DIR, "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    return {}


# --- squatting ---

def test_a_squatted_tmp_directory_stops_no_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               clean_env: dict[str, str]) -> None:
    if os.geteuid() != 0:
        pytest.skip("creating a directory as another user (nobody) needs root")
    # A world-writable sticky directory like /tmp (pytest's tmp_path is closed to nobody).
    sticky = Path(tempfile.mkdtemp(prefix="tensorcomm-squat-", dir="/tmp"))
    try:
        sticky.chmod(0o1777)
        squatted = sticky / f"tensorcomm-{os.geteuid()}"
        subprocess.run(["mkdir", "-m", "0700", str(squatted)], user=NOBODY, check=True, timeout=30)
        assert squatted.stat().st_uid == NOBODY
        monkeypatch.setattr(private, "DEFAULT_DIR", str(sticky / "tensorcomm-{uid}"))
        default = getattr(private, "default_dir", None)  # absent before issue 21
        if default is not None and default() == str(squatted):
            pytest.skip("this user has no private home directory, so /tmp/tensorcomm-<uid> is "
                        "the only default left")
        assert two_ranks(clean_env) == ["ok", "ok"]
    finally:
        shutil.rmtree(sticky)


def test_the_default_directory_is_under_the_users_home(clean_env: dict[str, str]) -> None:
    home = pwd.getpwuid(os.geteuid()).pw_dir
    info = os.stat(home)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        pytest.skip(f"this user's home {home} is not private to it")
    assert private.default_dir() == os.path.join(home, ".cache", "tensorcomm")


def test_a_read_only_home_falls_back_to_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with tiny_tmpfs(tmp_path / "home") as home:
        subprocess.run(["mount", "-o", "remount,ro", str(home)], check=True, timeout=30)
        fields = list(pwd.getpwuid(os.geteuid()))
        fields[5] = str(home)  # pw_dir
        monkeypatch.setattr(private.pwd, "getpwuid", lambda uid: pwd.struct_passwd(fields))
        assert private.default_dir() == private.DEFAULT_DIR.format(uid=os.geteuid())


# --- a full or unusable disk ---

@contextlib.contextmanager
def tiny_tmpfs(where: Path) -> Iterator[Path]:
    """Mount a 64 KiB tmpfs at ``where`` (root only; else the test skips)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(where)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def fill(directory: Path) -> None:
    """Write into ``directory`` until its file system is full."""
    with open(directory / "filler", "wb", buffering=0) as filler, contextlib.suppress(OSError):
        while True:
            filler.write(bytes(4096))


def assert_every_rank_names(results: list[Any], directory: Path) -> None:
    for result in results:
        assert isinstance(result, RendezvousError), results
        assert str(directory) in str(result) and "cannot write" in str(result), results


def test_a_full_disk_is_a_prompt_error_on_every_rank(tmp_path: Path, clean_env: dict[str, str]) -> None:
    with tiny_tmpfs(tmp_path / "mnt") as mount:
        secrets = mount / "secrets"
        secrets.mkdir(mode=0o700)
        fill(mount)
        results = two_ranks({config.ENV_SECRET_DIR: str(secrets)})
    assert_every_rank_names(results, secrets)
    assert any("No space left" in str(r) for r in results), results


def test_a_read_only_directory_is_a_prompt_error_on_every_rank(tmp_path: Path,
                                                               clean_env: dict[str, str]) -> None:
    if os.geteuid() == 0:  # root writes through mode bits: use a read-only file system
        with tiny_tmpfs(tmp_path / "mnt") as mount:
            secrets = mount / "secrets"
            secrets.mkdir(mode=0o700)
            subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True, timeout=30)
            results = two_ranks({config.ENV_SECRET_DIR: str(secrets)})
    else:
        secrets = tmp_path / "secrets"
        secrets.mkdir(mode=0o700)
        secrets.chmod(0o500)
        try:
            results = two_ranks({config.ENV_SECRET_DIR: str(secrets)})
        finally:
            secrets.chmod(0o700)
    assert_every_rank_names(results, secrets)
