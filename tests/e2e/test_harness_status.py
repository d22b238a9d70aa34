"""`mlx-kit harness status` asks each installed agent for its version: in parallel, without
writing into HOME, and flagging a version newer than the newest one mlx-kit verified.

The first test uses the real agent binaries that are on PATH. The others put small
stand-in executables first on PATH, because what they check cannot exist here with a real
agent: a release newer than the newest one we verified (we verify the newest), and an
agent whose `--version` waits for the others (the proof that the probes overlap)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kit.harness.spec_loader import all_specs
from tests.helpers import clean_env, run_kit, table_rows


def status(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return run_kit(env, "harness", "status", cwd=cwd)


def rows(stdout: str) -> dict[str, list[str]]:
    """The table's rows by agent name, each as its cells."""
    return table_rows(stdout)


def files_under(root: Path) -> set[str]:
    """Every path under ``root`` but mlx-kit's own (empty) data folder, which kit.paths
    creates on first use: the agents' files are what these tests are about."""
    ours = {".local", ".local/share", ".local/share/mlx-kit"}
    return {str(p.relative_to(root)) for p in root.rglob("*")} - ours


def fake_agent(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def test_status_shows_the_real_agents_versions_and_writes_nothing_into_home(tmp_path):
    found = {n: shutil.which(s.binary) for n, s in all_specs().items() if shutil.which(s.binary)}
    if not found:
        pytest.skip("no agent binary on PATH")
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(home, COLUMNS="250")
    before = files_under(home)

    r = status(env, tmp_path)

    assert r.returncode == 0, r.stderr
    # opencode and cn create folders and logs in HOME when asked for --version: not here
    assert files_under(home) == before
    table = rows(r.stdout)
    for name in found:
        spec = all_specs()[name]
        assert any(ch.isdigit() for ch in table[name][1]), table[name]  # a version, not a path
        if spec.verified:
            assert table[name][2].startswith(spec.verified[0]), table[name]


def test_an_agent_newer_than_the_verified_one_is_flagged(tmp_path):
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    bin_dir.mkdir()
    home.mkdir()
    newest = all_specs()["pi"].verified[1]
    fake_agent(bin_dir, "pi", 'echo "99.0.0"\n')
    fake_agent(bin_dir, "codex", f'echo "codex-cli {all_specs()["codex"].verified[1]}"\n')
    env = clean_env(home, COLUMNS="250", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    table = rows(status(env, tmp_path).stdout)

    assert table["pi"][1] == "99.0.0"
    assert table["pi"][2] == f"0.73.1-{newest} (newer: untested)"
    assert "newer" not in table["codex"][2]  # the verified version itself is not flagged


def test_version_probes_run_at_once_and_get_a_throwaway_home(tmp_path):
    """Each stand-in writes a file into the HOME it sees, then waits (up to 20 s) until both
    have started: with one probe after another, the first would wait in vain and its row
    would show no version. (Probes run one per CPU core, so two need two cores.)"""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU core: the probes run one at a time")
    bin_dir, home, started = tmp_path / "bin", tmp_path / "home", tmp_path / "started"
    for d in (bin_dir, home, started):
        d.mkdir()
    for name in ("pi", "codex"):
        fake_agent(bin_dir, name, f"""
touch "$HOME/{name}-was-here" "$STARTED/{name}"
i=0
while [ "$(ls "$STARTED" | wc -l)" -lt 2 ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done
[ "$(ls "$STARTED" | wc -l)" -ge 2 ] && echo "{name} 1.0.0"
""")
    # only the two stand-ins on PATH (plus sh's tools), so no real agent takes a core
    env = clean_env(home, COLUMNS="250", STARTED=str(started), PATH=f"{bin_dir}:/usr/bin:/bin")

    r = status(env, tmp_path)

    table = rows(r.stdout)
    assert [table[n][1] for n in ("pi", "codex")] == ["1.0.0", "1.0.0"], r.stdout
    assert files_under(home) == set()  # each wrote into its throwaway HOME instead
