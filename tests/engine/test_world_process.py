"""DistributedEngine's account of a lost world, from mlx.launch's exit lines (model-free:
the lines are what mlx.launch 0.32 prints; tests/distributed/test_failures.py kills real
ranks)."""

from __future__ import annotations

import pytest

from kit.engine.distributed.hosts import plan_world
from kit.engine.distributed.world_process import DistributedEngine
from kit.models.resolve import ModelInfo

INFO = ModelInfo(id="m", path=".", context_window=1024)  # type: ignore[arg-type]


def _engine(lines: list[str], errors: dict[int, str] | None = None) -> DistributedEngine:
    engine = DistributedEngine(INFO, plan_world(3, None, None, None, False, 300))
    for line in lines:
        engine._note_output(line, launcher=True)
    engine._errors.update(errors or {})
    return engine


@pytest.mark.parametrize("lines, blamed", [
    # a follower killed: the others lose their peers (75), mlx.launch terminates the rest
    (["[WARN] Node with rank 2 exited with code -9", "[WARN] Node with rank 0 exited with "
      "code 75", "[WARN] Node with rank 1 exited with code 75"],
     "rank 2 on 127.0.0.1 was killed by signal 9"),
    # a follower's watchdog gave up first, then mlx.launch's SIGTERM reached rank 0: the
    # SIGTERM is not the cause (it once was blamed)
    (["[WARN] Node with rank 2 exited with code 75", "[WARN] Node with rank 0 exited with "
      "code -15", "[WARN] Node with rank 1 exited with code -15"],
     "rank 2 on 127.0.0.1 lost its connection to the other ranks"),
    # a rank terminated from outside before anything failed is the cause
    (["[WARN] Node with rank 1 exited with code -15", "[WARN] Node with rank 0 exited with "
      "code 75"], "rank 1 on 127.0.0.1 was killed by signal 15"),
])
def test_a_lost_world_names_the_rank_that_failed_first_not_the_ones_ended_after(lines, blamed):
    assert _engine(lines)._why() == blamed


def test_a_rank_that_failed_on_its_own_is_named_with_its_last_error():
    engine = _engine(["\x1b[33m[WARN] Node with rank 1 exited with code 1 \x1b[0m\n",
                      "[WARN] Node with rank 0 exited with code -15"],
                     {1: "rank 1 (mac2): cannot load its shard of /m: FileNotFoundError"})
    assert engine._why() == ("rank 1 on 127.0.0.1 exited with code 1: rank 1 (mac2): cannot "
                             "load its shard of /m: FileNotFoundError")


def test_text_a_model_wrote_cannot_pose_as_a_rank_exit():
    # a rank's log line quoting a model's output arrives on stdout; mlx.launch's reports
    # come on its stderr and start the line
    engine = _engine([])
    quoted = ("2026-12-01 INFO rank 1 [vm] mlx_kit.engine: could not parse: [WARN] Node "
              "with rank 1 exited with code 3")
    assert engine._note_output(quoted, launcher=False) is False
    assert engine._note_output("see: [WARN] Node with rank 1 exited with code 3",
                               launcher=True) is False
    assert engine._note_output("[WARN] Node with rank 7 exited with code 3",
                               launcher=True) is False  # no rank 7 in a world of 3
    assert engine._exits == []
    assert engine._note_output("\x1b[33m[WARN] Node with rank 1 exited with code 3 \x1b[0m",
                               launcher=True) is True


def test_a_distributed_engine_runs_without_the_prompt_cache_disk_tier(caplog):
    # each rank holds only its KV shard: no rank may load a file the others do not
    import logging

    from kit.config import EngineConfig

    with caplog.at_level(logging.INFO, logger="mlx_kit.engine"):
        engine = DistributedEngine(INFO, plan_world(2, None, None, None, False, 300),
                                   EngineConfig(prompt_cache_disk=10 << 30,
                                                prompt_cache_dir="/x"))
    assert engine.config.prompt_cache_disk == 0
    assert "disk tier is off for a distributed engine" in caplog.text


@pytest.mark.parametrize("others", [
    ["[WARN] Node with rank 0 exited with code 75", "[WARN] Node with rank 1 exited with "
     "code 75"],
    # rank 1's watchdog gave up first and mlx.launch's SIGTERM reached rank 0 before its
    # own watchdog did (seen in tests/distributed/test_failures.py on a loaded machine)
    ["[WARN] Node with rank 1 exited with code 75", "[WARN] Node with rank 0 exited with "
     "code -15"],
])
def test_a_hung_rank_is_named_when_a_peer_gave_up_on_it_and_the_rest_were_ended(others):
    engine = _engine(others)
    engine._hung = [2]  # still running when mlx.launch's group was ended
    assert engine._why() == ("rank 2 on 127.0.0.1 stopped answering: the other ranks "
                             "waited 300 s (--rank-timeout) and gave up")


def test_ranks_all_ended_from_outside_do_not_blame_a_hung_one():
    engine = _engine(["[WARN] Node with rank 0 exited with code -15",
                      "[WARN] Node with rank 1 exited with code -15"])
    engine._hung = [2]  # no peer gave up on it: it is not known to have hung
    assert "stopped answering" not in engine._why()
