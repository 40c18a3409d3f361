"""Fixtures of the cluster tests (``pytest -m cluster``): one site per test session (nodes in
network namespaces, the database host's TLS-only server), a fresh database per test, and a real
Slurm on two of the nodes. They skip, with the reason, where the machine cannot host them (not
root, no network namespaces, no TLS-capable PostgreSQL, Slurm not installed or not starting).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.helpers import cluster, slurm
from tests.helpers.cluster import Site, SiteDatabase
from tests.helpers.slurm import SlurmCluster, SlurmUnavailable


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    reason = cluster.unavailable()
    if reason:
        pytest.skip(reason)
    with cluster.cluster_site(tmp_path_factory.mktemp("site")) as built:
        yield built


@pytest.fixture
def site_db(site: Site) -> Iterator[SiteDatabase]:
    """A fresh database on the site; every link is up again after the test."""
    try:
        with site.database() as db:
            yield db
    finally:
        site.net.heal_all()


@pytest.fixture(scope="session")
def slurm_nodes(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """slurmctld on the database host, slurmd on node1 and node2."""
    reason = slurm.unavailable()
    if reason:
        pytest.skip(reason)
    with contextlib.ExitStack() as stack:
        try:
            started = stack.enter_context(
                slurm.slurm_cluster(
                    tmp_path_factory.mktemp("slurm"),
                    site.address,
                    [site.node("node1"), site.node("node2")],
                )
            )
        except SlurmUnavailable as exc:
            pytest.skip(f"Slurm does not start here: {exc}")
        yield started


@pytest.fixture
def slurm_cluster(slurm_nodes: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's Slurm, with no job of this test left running after it."""
    try:
        yield slurm_nodes
    finally:
        slurm_nodes.cancel_all()
