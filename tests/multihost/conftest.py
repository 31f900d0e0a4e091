"""Fixtures of the multi-host tests: clusters of network-namespace "hosts" (see multihost_harness).

Every cluster a test makes is torn down after it, and the test fails if a namespace, process or
link of it is left. Where namespaces cannot be made (not root, no ``ip``, EPERM in a container)
the tests skip, saying why.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from multihost_harness import MakeCluster, clusters, unsupported_reason


def _skip_unless_supported() -> None:
    reason = unsupported_reason()
    if reason is not None:
        pytest.skip(f"multi-host tests need network namespaces: {reason}")


@pytest.fixture
def netns_cluster(tmp_path: Path) -> Iterator[MakeCluster]:
    """``make(n)``: a cluster of n hosts, torn down and checked for leftovers after the test."""
    _skip_unless_supported()
    with clusters(tmp_path) as make:
        yield make


@pytest.fixture(scope="module")
def module_netns_cluster(tmp_path_factory: pytest.TempPathFactory
                         ) -> Iterator[MakeCluster]:
    """As ``netns_cluster``, for one job whose outcome several tests of a module examine."""
    _skip_unless_supported()
    with clusters(tmp_path_factory.mktemp("multihost")) as make:
        yield make


@pytest.fixture
def netns_harness() -> Callable:
    """``multihost_harness.clusters`` itself, for a test that checks the teardown from inside."""
    _skip_unless_supported()
    return clusters
