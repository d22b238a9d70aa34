"""How :class:`kit.engine.distributed.world_process.DistributedEngine` names a lost world's
cause: it notes ``mlx.launch``'s exit reports (on its stderr, where the ranks write nothing,
so no text a model wrote can pose as one) and each rank's last ERROR line, then blames
the rank that failed first (not those ``mlx.launch`` ended after it, nor those that gave
up on a peer) or the rank that hung. Pure text handling: no process, no socket.
"""

from __future__ import annotations

import re
import signal
from collections import deque

from kit.engine.distributed.hosts import (
    EXIT_PEER_LOST,
    EXIT_TAMPERED,
    WorldPlan,
    python_for_ranks,
)

#: mlx.launch's own report on its stderr, where the ranks write nothing (they send their
#: stderr to stdout), so no text a model wrote can pose as one
_EXIT_LINE = re.compile(
    r"^\[WARN\] Node with rank (\d+) (?:exited with code (-?\d+)|was killed)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RANK_ERROR = re.compile(r" ERROR rank (\d+) \[[^\]]*\] \S+: (.*)")


class RankExits:
    """The ranks' exits and last errors, and the account of a lost world built from them
    (a mixin: the engine sets these in its ``__init__``)."""

    plan: WorldPlan
    _exits: list[tuple[int, int | None]]  # (rank, exit code; None: killed) as mlx.launch said
    _errors: dict[int, str]  # each rank's last ERROR line
    _hung: list[int]  # ranks still running when mlx.launch's group was ended
    _said: deque[str]  # mlx.launch's last lines of its own
    _launcher_code: int | None  # mlx.launch's own exit code, once it exited

    def _note_output(self, line: str, launcher: bool) -> bool:
        """Note a rank's exit (``launcher``: a line of mlx.launch's stderr) or its last
        error from one output line; True when it is the first exit (the world is over)."""
        line = _ANSI.sub("", line).strip()
        if launcher:
            m = _EXIT_LINE.match(line)
            if m and int(m.group(1)) < self.plan.size:
                code = int(m.group(2)) if m.group(2) is not None else None
                self._exits.append((int(m.group(1)), code))
                return len(self._exits) == 1
            if line:
                self._said.append(line[:300])
            return False
        if m := _RANK_ERROR.search(line):
            self._errors[int(m.group(1))] = m.group(2)
        return False

    def _why(self) -> str:
        """Which rank failed first and why, from mlx.launch's exit lines and the ranks'
        last errors; a rank that hung (every other one gave up on it) is named as such."""
        # the others gave up on it (75); mlx.launch may have ended some of them first
        # (SIGTERM, or "was killed" remotely) after the first one gave up
        others = [c for r, c in self._exits if r not in self._hung]
        if self._hung and EXIT_PEER_LOST in others and all(
                c in (EXIT_PEER_LOST, -signal.SIGTERM, None) for c in others):
            names = ", ".join(f"rank {r} on {self.plan.hosts[r]}" for r in self._hung)
            return (f"{names} stopped answering: the other ranks waited "
                    f"{self.plan.timeout:.0f} s (--rank-timeout) and gave up")
        # mlx.launch terminates the rest (SIGTERM, or "was killed" for a remote rank) only
        # after a rank failed: those exits, and the peers-lost ones, follow the failure
        after = (0, EXIT_PEER_LOST, -signal.SIGTERM, None)
        failed = [(r, c) for r, c in self._exits if c not in after] or self._exits[:1]
        if not failed:
            if self._launcher_code not in (None, 0) and not self._said:
                return f"mlx.launch exited with code {self._launcher_code}; its ranks were ended"
            if self._said:  # mlx.launch itself failed (no mpirun, a malformed host file)
                return f"mlx.launch: {self._said[-1]}"
            return "no rank reported why (see the log)"
        rank, code = failed[0]
        host = self.plan.hosts[rank] if rank < len(self.plan.hosts) else "?"
        how = ("could not be started over ssh (exit 255): check that `ssh "
               f"{host} true` works without a password" if code == 255 else
               f"could not start {python_for_ranks()} (exit 127): install mlx-kit in the "
               "same virtual environment path on every host" if code == 127 else
               "was killed" if code is None else
               f"was killed by signal {-code}" if code < 0 else
               "lost its connection to the other ranks" if code == EXIT_PEER_LOST else
               "refused what crossed the ring (docs/distributed.md: who can reach the "
               "ring)" if code == EXIT_TAMPERED else
               f"exited with code {code}")
        why = f"rank {rank} on {host} {how}"
        if rank in self._errors:
            why += f": {self._errors[rank]}"
        return why
