"""The restart bookkeeping of :class:`kit.engine.proc.process.EngineProcess`: when an engine
process that died unexpectedly is started again on its own, and how its counters carry
over a restart. Pure Python (no process, no pipe): the decisions, not the start."""

from __future__ import annotations

import time
from collections.abc import Mapping

#: the counters /health sums over every engine process one EngineProcess started
COUNTERS = ("requests_served", "swaps", "reloads", "unloads")
#: automatic restarts allowed per window: an engine that keeps dying (a model that crashes
#: every decode, the OOM killer on every load) is left failed instead of restarted forever
RESTART_LIMIT = 3
RESTART_WINDOW_S = 300.0


class RestartWindow:
    """The automatic restarts made in the last :data:`RESTART_WINDOW_S` seconds (monotonic
    time), at most :data:`RESTART_LIMIT` of them. Not thread-safe: its owner calls it
    holding its start lock."""

    def __init__(self) -> None:
        self._times: list[float] = []  # monotonic seconds of the restarts made on our own

    def refusal(self, state: str, code: int | None, model_id: str) -> str | None:
        """Why an engine that died with exit ``code`` in ``state`` (the owner's
        ``state``: ``loading``/``restarting`` mean it died while loading) is not restarted
        on its own; None when it is, which records the restart now."""
        now = time.monotonic()
        recent = [t for t in self._times if now - t < RESTART_WINDOW_S]
        if state in ("loading", "restarting"):  # died while loading: likely again
            return (f"the engine process exited (exit code {code}) while loading "
                    f"{model_id}; the next request tries again")
        if len(recent) >= RESTART_LIMIT:
            return (f"the engine process exited unexpectedly (exit code {code}), the "
                    f"{len(recent) + 1}th time in {RESTART_WINDOW_S:.0f} s; not restarting "
                    "it on its own (the next request tries again)")
        self._times = recent + [now]
        return None


def add_counters(snapshot: dict, base: Mapping[str, int]) -> None:
    """Add ``base`` (the counters of the engines that ended) to a new engine's
    ``snapshot`` in place: it counts from 0, /health counts from the first start."""
    for key in COUNTERS:
        snapshot[key] += base.get(key, 0)
