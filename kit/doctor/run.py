"""Run every ``doctor`` check at once, each area in its own thread, bounded in time.

The areas' own bounds (the mlx child's timeout, the probe's per-request timeouts, each
agent's ``--version`` timeout) end them; :data:`DEADLINE_S` is the backstop: an area still
running then is reported as not finished, and its daemon thread is left behind (a thread
cannot be stopped; a daemon one does not hold up the exit).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from kit.doctor.agents import agent_checks
from kit.doctor.cache import cache_checks
from kit.doctor.check import Check
from kit.doctor.proxy import proxy_check
from kit.doctor.server import server_checks
from kit.doctor.system import mlx_checks, python_check
from kit.urls import ServerURL

#: The most seconds the whole report may take: the areas' own bounds end them sooner
#: (the mlx child 30 s; agents' versions 15 s each, one per core at a time, so ~5 rounds
#: of them on 2 cores with every agent hung)
DEADLINE_S = 90.0
#: Areas in the order they are printed
AREAS = ("system", "server", "network", "cache", "agents")


class _Area(threading.Thread):
    """One area's checks, computed in a daemon thread; ``checks`` is None until done."""

    def __init__(self, area: str, fn: Callable[[], list[Check]]) -> None:
        super().__init__(name=f"doctor-{area}", daemon=True)
        self.area, self.fn, self.checks = area, fn, None

    def run(self) -> None:
        try:
            self.checks = self.fn()
        except Exception as e:  # a bug in one check must not hide the others' lines
            self.checks = [Check(self.area, self.area, "warn", f"the check itself failed: "
                                 f"{type(e).__name__}: {e}", "report it (mlx-kit's bug)")]


def run_checks(url: ServerURL, deadline: float = DEADLINE_S) -> list[Check]:
    """Every check, in :data:`AREAS` order; returns within about ``deadline`` seconds."""
    probed = threading.Event()
    server: dict = {}

    def server_area() -> list[Check]:
        try:
            checks, p = server_checks(url)
            server["up"] = p.kind == "ours"
            return checks
        finally:
            probed.set()

    def server_up() -> bool | None:
        return server.get("up") if probed.wait(deadline) else None

    areas = [_Area("system", lambda: [python_check(), *mlx_checks()]),
             _Area("server", server_area),
             _Area("network", lambda: [proxy_check(url)]),
             _Area("cache", cache_checks),
             _Area("agents", lambda: agent_checks(url, server_up))]
    end = time.monotonic() + deadline
    for a in areas:
        a.start()
    out: list[Check] = []
    for a in areas:
        a.join(max(0.0, end - time.monotonic()))
        out.extend(a.checks if a.checks is not None else [
            Check(a.area, a.area, "warn", f"did not finish in {deadline:g} s",
                  "run mlx-kit doctor again; if it hangs again, report it")])
    return out
