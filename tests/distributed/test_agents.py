"""End to end: `mlx-kit launch pi --ranks 3` with the real pi binary, a throwaway HOME and
the real starter spread over 3 ring ranks on 127.0.0.1 by the server that launch starts;
then launches that ask for another world reuse it and say it keeps its layout.

pi is the newest pi on PATH (tests/e2e/test_pi.py covers both verified versions on one
process; a 3-rank server decodes ~1 tok/s here, so this module starts one and runs pi
against it once). The refusals at the end need no model: a stand-in `pi` script is on
PATH only so that launch gets past its "is the agent installed" check (it never runs:
the flags are refused first).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.warnings import assert_no_config_warnings
from tests.helpers import (assert_served, clean_env, flat, free_port, require_binary,
                           run_kit)

READY_S = 300  # launch's wait for the 3-rank server (~15-30 s here, more on a busy machine)


class Env:
    """A throwaway HOME with pi set up (retries off), the server URL launch uses, and the
    log of the server it starts."""

    def __init__(self, home: Path, hf_home: Path | None, port: int, path: str):
        self.home, self.port = home, port
        self.url = f"http://127.0.0.1:{port}"
        (home / "tmp").mkdir()
        self.env = clean_env(home, hf_home, MLX_KIT_URL=self.url, MLX_KIT_LOG_LEVEL="debug",
                             MLX_KIT_TEMPERATURE="0", PATH=path, TMPDIR=str(home / "tmp"))
        self.agent_dir = home / ".pi" / "agent"
        self.agent_dir.mkdir(parents=True)
        (self.agent_dir / "settings.json").write_text(json.dumps({"retry": {"enabled": False}}))
        self.server_log = home / ".local" / "state" / "mlx-kit" / "log" / f"server-{port}.log"

    def kit(self, *args: str, timeout: float = READY_S + 200) -> subprocess.CompletedProcess:
        return run_kit(self.env, *args, cwd=self.home, timeout=timeout)

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=5).json()

    def log_text(self) -> str:
        return self.server_log.read_text(errors="replace")


@pytest.fixture(scope="module")
def env(hf_home, tmp_path_factory):
    require_binary("pi")
    e = Env(tmp_path_factory.mktemp("home-pi-ranks"), hf_home, free_port(), os.environ["PATH"])
    yield e
    e.kit("stop", timeout=60)


@pytest.mark.agent
def test_launch_pi_with_ranks_3_starts_a_3_rank_server_and_pi_answers_paris(env):
    r = env.kit("launch", "pi", "--ranks", "3", "--timeout", str(READY_S), "--",
                "-p", "What is the capital of France?", "--no-session")
    assert r.returncode == 0, r.stderr
    assert_no_config_warnings("pi", r.stdout, r.stderr)
    assert "started mlx-kit server" in r.stderr
    assert "Paris" in r.stdout
    assert_served(env, 0, r.stdout)  # the very text pi printed came from this server
    world = env.health()["distributed"]
    assert (world["world_size"], world["backend"], world["mode"]) == (3, "ring", "tensor")
    assert [r["rank"] for r in world["ranks"]] == [0, 1, 2]
    assert all(psutil.pid_exists(r["pid"]) for r in world["ranks"])
    env.first_pid = env.health()["pid"]


@pytest.mark.agent
@pytest.mark.parametrize(("flags", "differs"), [
    (["--ranks", "9", "--backend", "mpi"],
     "3 ring ranks, tensor parallel; asked for 9 mpi ranks, tensor parallel"),
    (["--ranks", "3", "--pipeline"],
     "3 ring ranks, tensor parallel; asked for 3 ring ranks, pipeline parallel"),
    ([], None),  # no world asked for: nothing to warn about
    (["--ranks", "3"], None),  # the same world
])
def test_a_launch_reuses_the_running_world_and_warns_when_the_flags_ask_for_another(
        env, flags, differs):
    r = env.kit("launch", "pi", *flags, "--", "--version", timeout=120)  # no model request
    assert r.returncode == 0, r.stderr
    assert "reusing mlx-kit server" in r.stderr
    assert env.health()["pid"] == env.first_pid
    assert env.health()["distributed"]["world_size"] == 3
    text = flat(r.stderr)
    if differs is None:
        assert "keeps its layout" not in text
    else:
        assert f"warning: the running server keeps its layout ({differs})" in text, text


@pytest.mark.agent
def test_launch_with_ranks_on_a_single_process_server_warns_it_stays_one_process(
        server, tmp_path):
    require_binary("pi")
    e = Env(tmp_path, None, server.port, os.environ["PATH"])
    r = e.kit("launch", "pi", "--ranks", "3", "--", "--version", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "reusing mlx-kit server" in r.stderr
    assert ("warning: the running server keeps its layout (one process, not 3 ring ranks)"
            in flat(r.stderr))
    assert "distributed" not in server.health()


# --- refused before anything starts (no model) -------------------------------------------------

@pytest.fixture
def fake_pi(tmp_path) -> str:
    """A PATH whose `pi` is a stand-in that records that it ran (it must not)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pi = bin_dir / "pi"
    pi.write_text(f"#!/bin/sh\ntouch {tmp_path / 'pi-ran'}\n")
    pi.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.parametrize(("flags", "message"), [
    (["--ranks", "2", "--hosts", "a,b"],
     "--hosts a: the ring backend needs IP addresses, not host names"),
    (["--hosts", "10.255.255.1,127.0.0.1"],
     "rank 0 would run on 10.255.255.1, not on this machine"),
    (["--ranks", "3", "--backend", "foo"], "--backend 'foo': one of ring, jaccl, mpi, nccl"),
    (["--hostfile", "{missing}"], "--hostfile {missing}: No such file or directory"),
    (["--pipeline"], "--pipeline and --backend need --ranks, --hosts or --hostfile"),
])
def test_launch_refuses_a_world_that_cannot_start_before_any_server_or_agent(
        tmp_path, fake_pi, flags, message):
    missing = str(tmp_path / "missing.json")
    port = free_port()
    r = run_kit(clean_env(tmp_path, PATH=fake_pi), "launch", "pi", "--url",
                f"http://127.0.0.1:{port}", *(f.format(missing=missing) for f in flags),
                cwd=tmp_path, timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"error: {message.format(missing=missing)}" in flat(r.stderr), r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "pi-ran").exists()
    assert not (tmp_path / ".local" / "state" / "mlx-kit" / "log").exists()  # no server
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
