"""kit.blas.share_cores and the rank's count of ranks on its host, model-free: several
ranks of one world on one host split its cores between their BLAS thread pools."""

from __future__ import annotations

import os

import pytest

from kit import blas
from kit.engine.distributed import rank


@pytest.fixture(scope="module", autouse=True)
def thread_counts_kept():
    """Regression: this module left OPENBLAS_NUM_THREADS set in the suite's process, so
    every later server and rank inherited it (and a world's ranks, taking it for the
    user's, kept a pool of every core each). Fails the module's last test if it does."""
    before = {name: os.environ.get(name) for name in blas.THREAD_VARIABLES}
    yield
    assert {name: os.environ.get(name) for name in blas.THREAD_VARIABLES} == before


@pytest.fixture
def no_thread_vars(monkeypatch):
    for name in blas.THREAD_VARIABLES:
        # setenv first, so the undo deletes what share_cores sets: a bare delenv of an
        # unset variable records nothing, and OPENBLAS_NUM_THREADS leaked into every later
        # test's servers and ranks (whose share_cores then kept it as the user's)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)


def test_three_ranks_on_eight_cores_get_two_blas_threads_each(no_thread_vars):
    assert blas.share_cores(3) == 2
    assert os.environ["OPENBLAS_NUM_THREADS"] == "2"


def test_more_ranks_than_cores_get_one_thread_each(no_thread_vars):
    assert blas.share_cores(12) == 1
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"


def test_one_rank_on_its_host_keeps_the_default_pool(no_thread_vars):
    assert blas.share_cores(1) is None
    assert "OPENBLAS_NUM_THREADS" not in os.environ


@pytest.mark.parametrize("name", blas.THREAD_VARIABLES)
def test_a_thread_count_the_user_set_is_kept(no_thread_vars, monkeypatch, name):
    monkeypatch.setenv(name, "6")
    assert blas.share_cores(3) is None
    assert os.environ[name] == "6"
    if name != "OPENBLAS_NUM_THREADS":  # OpenBLAS reads OMP_NUM_THREADS too: not overridden
        assert "OPENBLAS_NUM_THREADS" not in os.environ


@pytest.mark.parametrize(("hosts", "me", "count"), [
    ("127.0.0.1,127.0.0.1,127.0.0.1", "2", 3),
    ("10.0.0.1,10.0.0.1,10.0.0.2,10.0.0.2", "3", 2),
    ("mac1,mac2", "0", 1),
    ("", "0", 1),
    ("a,b", "7", 1),  # a rank index the list does not hold: assume alone
])
def test_ranks_on_this_host_counts_the_ranks_sharing_its_host(monkeypatch, hosts, me, count):
    monkeypatch.setenv("MLX_KIT_RANK_HOSTS", hosts)
    monkeypatch.setenv("MLX_RANK", me)
    assert rank._ranks_on_this_host() == count

