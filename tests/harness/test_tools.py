"""Agents installed on demand into mlx-kit's tools folder, model-free: the spec's [package]
(and the install line derived from it), the folder's layout (a copy counts only with its
receipt), which copy runs (the tools folder's before PATH's, as `harness status` shows),
launch's install decision (--install / MLX_KIT_INSTALL / a terminal's question / refusal)
and the refusals for agents with no registry package. The real installs are in
tests/e2e/test_install_agent.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from kit.errors import HarnessError
from kit.harness.spec import parse_spec
from kit.harness.spec_loader import all_specs, load_spec
from kit.harness.tools import (RECEIPT, agent_dir, current_copy, find_agent, install_decision,
                               tools_dir)
from tests.helpers import agentless_path, run_kit, table_rows
from tests.harness.test_spec import shipped


def _data(**top) -> dict:
    data = shipped("pi")
    data.update(top)
    return data


# --- the spec -----------------------------------------------------------------------------

def test_every_registry_agent_has_a_package_and_its_install_line_derives_from_it():
    specs = all_specs()
    for name in ("pi", "claude", "codex", "continue", "gemini", "opencode", "qwen"):
        assert specs[name].package.registry == "npm", name
        assert specs[name].install == \
            f"npm install -g {specs[name].package.name}@{specs[name].verified[1]}"
    for name, pkg in (("aider", "aider-chat"), ("llm", "llm")):
        assert specs[name].package.registry == "pypi"
        assert specs[name].install == f"pipx install {pkg}=={specs[name].verified[1]}"
    for name in ("goose", "zed", "crush"):  # no registry package mlx-kit installs
        assert specs[name].package is None and specs[name].install
    assert specs["pi"].package.node == "22.19"
    assert specs["opencode"].package.postinstall == "postinstall.mjs"


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.update(install="npm i -g x"), "install is derived from [package]"),
    (lambda d: d.pop("verified"), "add verified"),
    (lambda d: d.pop("package"), "needs [package]"),
    (lambda d: d["package"].update(registry="pypi"), "node and postinstall are for"),
    (lambda d: d["package"].update(registry="cargo"), "package.registry"),
    (lambda d: d["package"].update(name="pi; rm -rf ~"), "package.name"),
])
def test_a_bad_package_table_is_refused_naming_the_key(edit, words):
    data = _data()
    edit(data)
    with pytest.raises(HarnessError) as e:
        parse_spec(data, "pi.toml")
    assert words in e.value.message + (e.value.hint or "")


# --- the folder and which copy runs -------------------------------------------------------

def _fake_copy(agent: str, version: str, *, receipt: bool = True, node_bin: str | None = None,
               prints: str = "") -> Path:
    """A copy as agent_install leaves one: an executable under <version>/, the receipt,
    ``current`` naming it."""
    root = agent_dir(agent) / version
    binary = root / "bin" / agent
    binary.parent.mkdir(parents=True)
    binary.write_text(f"#!/bin/sh\necho '{prints or version}'\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    if receipt:
        (root / RECEIPT).write_text(json.dumps({
            "agent": agent, "version": version, "binary": f"bin/{agent}",
            "node_bin": node_bin}))
    (agent_dir(agent) / "current").write_text(version + "\n")
    return binary


def test_the_tools_folder_is_under_the_data_dir_and_its_copy_runs_before_paths(home, tmp_path):
    assert tools_dir() == home / ".local" / "share" / "mlx-kit" / "tools"
    spec = load_spec("pi")
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "pi").write_text("#!/bin/sh\n")
    (on_path / "pi").chmod(0o755)
    found = find_agent(spec, path=str(on_path))
    assert (found.source, found.path, found.copy) == ("path", str(on_path / "pi"), None)
    binary = _fake_copy("pi", "1.6.0", node_bin="/opt/node/bin")
    found = find_agent(spec, path=str(on_path))
    assert (found.source, found.path) == ("tools", str(binary))
    # npm agents start with `#!/usr/bin/env node`: the Node mlx-kit provided goes first
    assert found.environ({"PATH": "/usr/bin"})["PATH"] == os.pathsep.join(
        ["/opt/node/bin", "/usr/bin"])


def test_an_unfinished_install_is_never_run(home):
    _fake_copy("pi", "1.6.0", receipt=False)  # the install died before its receipt
    assert current_copy(load_spec("pi")) is None
    (agent_dir("pi") / "current").write_text("../../elsewhere\n")
    assert current_copy(load_spec("pi")) is None


@pytest.mark.parametrize("flag, env, tty, expected", [
    (True, {}, False, "install"),
    (False, {"MLX_KIT_INSTALL": "1"}, False, "install"),
    (False, {"MLX_KIT_INSTALL": "yes"}, True, "install"),
    (False, {"MLX_KIT_INSTALL": "0"}, True, "ask"),
    (False, {}, True, "ask"),
    (False, {}, False, "refuse"),  # a script or CI: never a hidden prompt
])
def test_launch_installs_asks_or_refuses(flag, env, tty, expected):
    assert install_decision(flag, env, tty) == expected


def test_harness_status_shows_which_copy_runs(home, tmp_path):
    """codex from the tools folder, opencode from PATH; as a user reads it and as --json."""
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "opencode").write_text("#!/bin/sh\necho 1.18.33\n")
    (on_path / "opencode").chmod(0o755)
    codex = _fake_copy("codex", "0.171.0", prints="codex-cli 0.171.0")
    path = os.pathsep.join([str(on_path), agentless_path()])
    r = run_kit(home, "harness", "status", "--json", PATH=path)
    assert r.returncode == 0, r.stderr
    agents = {a["name"]: a for a in json.loads(r.stdout)["agents"]}
    assert (agents["codex"]["source"], agents["codex"]["binary"],
            agents["codex"]["version"]) == ("tools", str(codex), "0.171.0")
    assert (agents["opencode"]["source"], agents["opencode"]["version"]) == ("path", "1.18.33")
    assert agents["pi"]["source"] is None and agents["pi"]["binary"] is None
    r = run_kit(home, "harness", "status", PATH=path)
    rows = table_rows(r.stdout)
    assert (rows["codex"][1], rows["codex"][-1]) == ("0.171.0", "mlx-kit")
    assert (rows["opencode"][1], rows["opencode"][-1]) == ("1.18.33", "PATH")
    assert (rows["pi"][1], rows["pi"][-1]) == ("not found", "-")


# --- refusals -----------------------------------------------------------------------------

@pytest.mark.parametrize("agent", ["goose", "zed", "crush"])
def test_an_agent_with_no_registry_package_prints_its_official_install_line(home, agent):
    r = run_kit(home, "harness", "install-agent", agent)
    assert r.returncode == 1
    assert "has no registry package mlx-kit can install" in r.stderr
    assert load_spec(agent).install.split()[0] in r.stderr  # curl ... / npm ...
    assert not tools_dir().exists()


def test_launch_of_a_missing_agent_off_a_terminal_names_both_ways_to_install_it(home, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    r = run_kit(home, "launch", "pi", PATH=str(empty), stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and "not installed" in r.stderr
    hint = " ".join(r.stderr.split())
    assert "mlx-kit launch pi --install" in hint
    assert "npm install -g @earendil-works/pi-coding-agent@1.6.0" in hint
    assert not tools_dir().exists()  # nothing installed, no folder made


def test_install_agent_refuses_a_version_that_is_not_one(home):
    r = run_kit(home, "harness", "install-agent", "llm", "--version", "latest; rm -rf ~")
    assert r.returncode == 1 and "is not a version number" in r.stderr
    assert not (tools_dir() / "llm").exists() or not any((tools_dir() / "llm").iterdir())


def test_launch_on_a_terminal_asks_first_and_a_no_installs_nothing(home, tmp_path):
    """The question a user sees on a terminal names what would be installed and where;
    answering n leaves no tools folder and exits 1 with the ways to install it."""
    import pty
    import select
    import sys

    from tests.helpers import clean_env

    empty = tmp_path / "empty-bin"
    empty.mkdir()
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "kit", "launch", "pi"], stdin=secondary,
                            stdout=subprocess.PIPE, stderr=secondary, cwd=home,
                            env=clean_env(home, PATH=str(empty)))
    os.close(secondary)
    seen = b""
    try:
        while b"?" not in seen.split(b"tools folder")[-1]:
            ready, _, _ = select.select([primary], [], [], 60)
            assert ready, f"no question on the terminal: {seen!r}"
            seen += os.read(primary, 4096)
        os.write(primary, b"n\n")
        assert proc.wait(timeout=60) == 1
        while select.select([primary], [], [], 0.5)[0]:
            try:
                seen += os.read(primary, 4096)
            except OSError:  # the child closed its end
                break
    finally:
        proc.kill()
        os.close(primary)
    text = " ".join(seen.decode(errors="replace").split())
    assert "pi (pi coding agent) is not installed. Install @earendil-works/pi-coding-agent " \
           f"1.6.0 (npm) into mlx-kit's tools folder ({tools_dir()})? [Y/n]" in text
    assert "mlx-kit launch pi --install" in text
    assert not tools_dir().exists()
