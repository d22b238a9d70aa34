"""Fixtures of the distributed-engine tests: a real 3-rank server (``serve --ranks 3``:
three ring ranks on 127.0.0.1 started by ``mlx.launch``, tensor parallel over the model's
3 attention / 3 KV heads) and a real single-process server on the same model, each with a
throwaway HOME, so every test can compare what the two answer.

Both are greedy (``--temperature 0``) and serve the decisive tiny model
(:func:`tests.helpers.tiny_world_model`): random weights whose greedy steps are clear,
so two computations that differ (a wrong shard, a rank out of step, a stale cache entry)
write other words. On the starter a 3-rank world decodes ~1-2 tok/s on this 2-core
machine and takes ~15 s to load; the starter's own answer on 3 ranks ("Paris") is tested
through a real agent (tests/distributed/test_agents.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import Server, start_server, stop, tiny_world_model, wait_until

#: the flags both servers share; the 3-rank one adds ``--ranks 3``
COMMON = ("--max-batch", "8", "--temperature", "0")
#: a hung world fails a test in a minute, not after the default 300 s
RANK_FLAGS = ("--ranks", "3", "--rank-timeout", "60")


def ready(server: Server, timeout: float = 240) -> Server:
    """``server`` once /health says its model is loaded (``/health`` answers 200 while
    the ranks still load, which is all :func:`start_server` waits for)."""
    def loaded() -> bool:
        health = server.health()
        assert health["model_state"] != "failed", health.get("error")  # fail now, not later
        return health["model_state"] == "ready"

    wait_until(loaded, timeout, every=0.2, what=f"{server.root}'s model being ready")
    return server


def start_ranks(home: Path, hf_home: Path, *args: str) -> Server:
    """A 3-rank server (``COMMON`` + ``RANK_FLAGS`` + ``args``), its model loaded."""
    return ready(start_server(home, hf_home, *COMMON, *RANK_FLAGS, *args))


@pytest.fixture(scope="session")
def world_model(hf_home, tmp_path_factory) -> Path:
    """The decisive tiny model both servers start on (seed 0)."""
    return tiny_world_model(hf_home, tmp_path_factory.mktemp("world") / "tiny-decisive",
                            decisive=True)


@pytest.fixture(scope="session")
def other_world_model(hf_home, tmp_path_factory) -> Path:
    """Another decisive tiny model (seed 1): what a swap moves to."""
    return tiny_world_model(hf_home, tmp_path_factory.mktemp("world") / "tiny-decisive-1",
                            seed=1, decisive=True)


@pytest.fixture(scope="module")
def single_server(hf_home, world_model, tmp_path_factory):
    """The single-process server the 3-rank one is compared with."""
    s = ready(start_server(tmp_path_factory.mktemp("home-single"), hf_home, *COMMON,
                           "--model", str(world_model)))
    yield s
    stop(s)


@pytest.fixture(scope="module")
def ranks_server(hf_home, world_model, tmp_path_factory):
    """``serve --ranks 3 --max-batch 8`` on the decisive tiny model."""
    s = start_ranks(tmp_path_factory.mktemp("home-ranks"), hf_home, "--model",
                    str(world_model))
    yield s
    stop(s)
