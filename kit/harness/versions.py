"""Which version of each agent is installed, and is it newer than the one we verified?

``harness status`` asks every agent binary for ``--version``. Some agents write files into
HOME while doing so (opencode creates ~/.cache, ~/.config, ~/.local/share; Continue's cn a
log under ~/.continue), even when mlx-kit never configured them, so each probe runs with a
throwaway HOME and XDG folders, the agents' own config-dir variables removed, and in a
throwaway working folder. The probes run in parallel, one per CPU core (each agent takes 0.1-4 s to start).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from kit.harness.spec import HarnessSpec
from kit.harness.tools import find_agent

#: A dotted version number as agents print it ("1.6.0", "codex-cli 0.171.0", "v22.1").
_VERSION = re.compile(r"(?<![\w.])v?(\d+(?:\.\d+)+)(?![\w.]*\d)")
_XDG = ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME")


@dataclass(frozen=True)
class AgentVersion:
    """What ``<binary> --version`` said.

    Attributes:
        line: the first line it printed (at most 80 characters), or None (no answer).
        version: the version number in that output ("1.6.0"), or None.
        verified: the spec's [oldest, newest] verified versions, or None.
        newer: True when ``version`` is newer than the newest verified one.
    """

    line: str | None
    version: str | None
    verified: tuple[str, str] | None
    newer: bool


def version_key(text: str) -> tuple[int, ...]:
    """``"1.10.2"`` -> ``(1, 10, 2)``, so versions compare numerically."""
    return tuple(int(p) for p in text.split("."))


def parse_version(*outputs: str) -> str | None:
    """The first dotted version number in ``outputs`` (stdout before stderr), or None."""
    for text in outputs:
        for line in (text or "").splitlines():
            m = _VERSION.search(line)
            if m:
                return m.group(1)
    return None


def probe_env(specs: Iterable[HarnessSpec], home: Path) -> dict[str, str]:
    """The environment a version probe runs in: ours, with HOME and the XDG folders moved
    to ``home`` and every agent's config-dir variable (CODEX_HOME, QWEN_HOME...) removed,
    so an agent that writes on start writes there."""
    drop = {c.partition("/")[0] for s in specs
            for c in (*s.config_dir_env, *(s.config_dir_darwin_env or ()))}
    env = {k: v for k, v in os.environ.items() if k not in drop and k not in _XDG}
    env["HOME"] = str(home)
    for var, sub in zip(_XDG, (".config", ".local/share", ".local/state", ".cache")):
        env[var] = str(home / sub)
    return env


def _run(binary: str, env: dict[str, str], cwd: Path, timeout: float) -> tuple[str, str] | None:
    try:
        r = subprocess.run([binary, "--version"], capture_output=True, text=True, env=env,
                           cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout or "", r.stderr or ""


def _env_of(spec: HarnessSpec, binary: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` for ``binary``: a copy in mlx-kit's tools folder runs on the Node mlx-kit
    provided for it (first on PATH), as launch runs it."""
    found = find_agent(spec)
    return found.environ(env) if found is not None and found.path == binary else env


def probe_versions(agents: list[tuple[HarnessSpec, str]], timeout: float = 15
                   ) -> dict[str, AgentVersion]:
    """Ask each agent binary for its version, all at once, writing nothing into HOME.

    Args:
        agents: (spec, the binary's path) pairs (agents without a binary are left out).
        timeout: seconds per probe; a probe that takes longer counts as no answer.

    Returns:
        ``{spec.name: AgentVersion}`` for every agent in ``agents``.
    """
    results: dict[str, AgentVersion] = {}
    if not agents:
        return results
    with tempfile.TemporaryDirectory(prefix="mlx-kit-probe-") as tmp:
        home, cwd = Path(tmp) / "home", Path(tmp) / "cwd"
        home.mkdir()
        cwd.mkdir()
        env = probe_env([spec for spec, _ in agents], home)
        # One probe per core: agents' start-up is CPU-bound (Node compiling its bundle), so
        # on a 2-core box 8 at once were slower than one after another (bench/harness_status.py).
        with ThreadPoolExecutor(max_workers=max(1, min(len(agents), os.cpu_count() or 1))
                                ) as pool:
            futures = [(spec, pool.submit(_run, binary, _env_of(spec, binary, env), cwd,
                                          timeout))
                       for spec, binary in agents]
            for spec, future in futures:
                out = future.result()
                lines = "\n".join(out).strip().splitlines() if out else []
                line = next((ln for ln in lines if parse_version(ln)), lines[0] if lines
                            else None)
                version = parse_version(*out) if out else None
                newer = bool(version and spec.verified and
                             version_key(version) > version_key(spec.verified[1]))
                results[spec.name] = AgentVersion(line[:80] if line else None, version,
                                                  spec.verified, newer)
    return results
