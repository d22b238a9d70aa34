"""The server's decision when its engine process died (kit/engine/proc/process.py,
kit/engine/proc/restarts.py), however it finds out: the pipe's reader, or a call (a
request, /health's memory probe) that found the process dead first. Model-free: the dead
process is a stand-in with an exit code, and ``start`` records instead of spawning (a real
kill -9 of a real engine is tests/reliability/test_recovery_engine.py's)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from kit.engine.proc.process import EngineProcess, _Link
from kit.engine.proc.restarts import RESTART_LIMIT
from kit.errors import EngineUnavailable
from kit.models.resolve import ModelInfo

MODEL = ModelInfo("org/m", Path("/models/m"), 4096)


class _Dead:
    """An engine process killed by SIGKILL, already reaped."""
    exitcode = -9
    pid = 1

    def join(self, timeout=None) -> None:
        pass


def engine_with_a_dead_link(restarts_so_far: int) -> tuple[EngineProcess, list[str]]:
    """An engine whose serving process just died, after ``restarts_so_far`` automatic
    restarts; its ``start`` records the state it would start a process in."""
    engine = EngineProcess(MODEL)
    engine.state = "ready"
    conn, _ = multiprocessing.Pipe()
    engine._link = _Link(conn, _Dead())
    for _ in range(restarts_so_far):
        assert engine._restarts.refusal("ready", -9, MODEL.id) is None
    starts: list[str] = []
    engine.start = lambda: starts.append(engine.state)  # type: ignore[method-assign]
    return engine, starts


def test_a_death_a_call_finds_first_counts_as_a_restart_once():
    # Regression: a /health probe that met the dead process before its reader did
    # restarted it uncounted, so an engine that kept dying was restarted a 4th time
    # (seen as 'restarting' instead of 'failed' in a loaded CI run).
    engine, starts = engine_with_a_dead_link(0)
    dead = engine._link
    engine._alive_link()
    assert starts == ["restarting"] and engine.restarts == 1
    assert "exited unexpectedly (exit code -9)" in engine.error
    engine._gone(dead)  # its reader catches up: nothing decided twice
    assert starts == ["restarting"] and engine.restarts == 1


def test_an_engine_past_the_restart_limit_found_dead_by_a_call_is_failed_not_restarted():
    engine, starts = engine_with_a_dead_link(RESTART_LIMIT)
    dead = engine._link
    with pytest.raises(EngineUnavailable, match="not restarting it"):
        engine._alive_link()
    assert starts == [] and engine.state == "failed" and "not restarting it" in engine.error
    engine._gone(dead)
    assert starts == [] and engine.state == "failed"
    engine._alive_link()  # the next request tries again, as the error says
    assert starts == ["loading"]
