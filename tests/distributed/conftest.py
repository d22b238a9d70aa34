"""Fixtures of the distributed-engine tests: a real 3-rank server (``serve --ranks 3``:
three ring ranks on 127.0.0.1 started by ``mlx.launch``, tensor parallel over the starter's
9 attention heads / 3 KV heads) and a real single-process server on the same starter, each
with a throwaway HOME, so every test can compare what the two answer.

Both are greedy (``--temperature 0``). A 3-rank server decodes the starter at ~1-2 tok/s
on this 2-core machine and takes ~15-30 s to load: each module starts one, and tests keep
``max_tokens`` small.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import Server, start_server, stop, wait_until

#: the flags both servers share; the 3-rank one adds ``--ranks 3``
COMMON = ("--max-batch", "8", "--temperature", "0")
#: a hung world fails a test in a minute, not after the default 300 s
RANK_FLAGS = ("--ranks", "3", "--rank-timeout", "60")


def ready(server: Server, timeout: float = 240) -> Server:
    """``server`` once /health says its model is loaded (``/health`` answers 200 while
    the ranks still load, which is all :func:`start_server` waits for)."""
    wait_until(lambda: server.health()["model_state"] == "ready", timeout,
               every=0.2, what=f"{server.root}'s model being ready")
    return server


def start_ranks(home: Path, hf_home: Path, *args: str) -> Server:
    """A 3-rank server (``COMMON`` + ``RANK_FLAGS`` + ``args``), its model loaded."""
    return ready(start_server(home, hf_home, *COMMON, *RANK_FLAGS, *args))


@pytest.fixture(scope="module")
def single_server(hf_home, tmp_path_factory):
    """The single-process server the 3-rank one is compared with."""
    s = ready(start_server(tmp_path_factory.mktemp("home-single"), hf_home, *COMMON))
    yield s
    stop(s)


@pytest.fixture(scope="module")
def ranks_server(hf_home, tmp_path_factory):
    """``serve --ranks 3 --max-batch 8`` on the starter."""
    s = start_ranks(tmp_path_factory.mktemp("home-ranks"), hf_home)
    yield s
    stop(s)
