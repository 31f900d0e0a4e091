"""``transports/shm/cma.py``: whom a rank lets read it under Yama, and a read that comes up short."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os

import numpy as np
import pytest

from tensorcomm.transports.shm import cma

PARENTS = {10: 5, 11: 5, 12: 5, 13: 6, 5: 1, 6: 1, 20: 1, 21: 1}


def test_nothing_to_grant_without_yama_or_with_scope_0():
    assert cma.ptracer(None, 10, [10, 11], PARENTS.get) == (None, None)
    assert cma.ptracer(0, 10, [10, 11, 12], PARENTS.get) == (None, None)


@pytest.mark.parametrize("scope", [2, 3])
def test_scopes_2_and_3_refuse_with_the_reason(scope):
    target, reason = cma.ptracer(scope, 10, [10, 11], PARENTS.get)
    assert target is None and f"ptrace_scope is {scope}" in reason


def test_scope_1_names_the_peer_of_a_pair_else_the_common_parent():
    assert cma.ptracer(1, 10, [10, 11], PARENTS.get) == (11, None)  # narrower than the parent
    assert cma.ptracer(1, 10, [10, 11, 12], PARENTS.get) == (5, None)
    target, reason = cma.ptracer(1, 10, [10, 11, 13], PARENTS.get)  # two parents
    assert target is None and "no common parent" in reason
    target, reason = cma.ptracer(1, 20, [20, 21, 10], {20: 1, 21: 1, 10: 1}.get)  # only init
    assert target is None and "no common parent" in reason


def test_descends_follows_parents_up_to_init():
    assert cma.descends(11, 5, PARENTS.get) and cma.descends(5, 5, PARENTS.get)
    assert not cma.descends(13, 5, PARENTS.get)


def test_a_read_of_memory_that_is_not_there_fails_instead_of_coming_up_short():
    here = np.zeros(16, np.uint8)
    with pytest.raises(cma.CmaError) as caught:
        cma.read(os.getpid(), here.ctypes.data, 8, 16)  # address 8 is never mapped
    assert caught.value.errno == errno.EFAULT and caught.value.moved == 0
    there = np.arange(16, dtype=np.uint8)
    cma.read(os.getpid(), here.ctypes.data, there.ctypes.data, 16)
    assert (here == there).all()
    assert cma.refusal(errno.EPERM).startswith(os.strerror(errno.EPERM))
    assert cma.refusal(0) == "it copied fewer bytes than asked"


def test_a_read_that_runs_into_an_unreadable_page_is_a_short_read_and_fails():
    page = mmap.PAGESIZE
    here = np.zeros(3 * page, np.uint8)
    with mmap.mmap(-1, 3 * page) as there:
        anchor = ctypes.c_char.from_buffer(there)
        address = ctypes.addressof(anchor)
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.mprotect(ctypes.c_void_p(address + 2 * page), page, 0) == 0  # PROT_NONE
        try:
            with pytest.raises(cma.CmaError) as caught:
                cma.read(os.getpid(), here.ctypes.data, address, here.nbytes)
        finally:
            libc.mprotect(ctypes.c_void_p(address + 2 * page), page, mmap.PROT_READ | mmap.PROT_WRITE)
            del anchor
    assert caught.value.moved == 2 * page and "moved 8192 of 12288" in str(caught.value)
