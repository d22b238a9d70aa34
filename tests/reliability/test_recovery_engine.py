"""Issue 11 item 5: an engine process that died is restarted by the server on its own, so
`launch` and the next request work; a model that failed to load is told apart (it is not
retried in a loop) and `status` exits non-zero with the reason and the fix. Real servers on
loopback, the real starter model, `kill -9` of the real engine process, the real pi."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.helpers import (REPO, flat, require_binary, run_kit, spawn_server, start_server,
                           stop)

CHAT = {"model": "local", "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 3, "temperature": 0}
AGENT_PATH = str(REPO / ".tools" / "npm" / "node_modules" / ".bin")  # .ci/run installs pi here


def kit(home: Path, hf_home: Path, *args: str, path: str | None = None,
        timeout: float = 180) -> subprocess.CompletedProcess:
    """:func:`run_kit` in ``home`` with the session's models (and ``path`` as PATH)."""
    return run_kit(home, *args, hf_home=hf_home, timeout=timeout,
                   **({"PATH": path} if path else {}))


def agents_path() -> str:
    """PATH with the agents .ci/run installs in front; skips (fails under CI) without pi."""
    path = f"{AGENT_PATH}{os.pathsep}{os.environ.get('PATH', '')}"
    if shutil.which("pi", path=path) is None:
        require_binary("pi")
    return path


def wait_ok(server, old: int | None = None, timeout: float = 120) -> tuple[int, list[str]]:
    """Poll /health until an engine (not ``old``) serves. Returns (its pid, every status
    /health reported meanwhile)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    h: dict = {}
    while time.monotonic() < deadline:
        h = httpx.get(server.root + "/health", timeout=10).json()
        seen.append(h["status"])
        if h["status"] == "ok" and h["engine_pid"] != old:
            return h["engine_pid"], seen
        if h["status"] == "failed":
            break
        time.sleep(0.02)
    pytest.fail(f"no new engine; /health said {seen[-5:]}: {h.get('error')}")


def kill_engine_and_watch(server) -> tuple[int, list[str]]:
    """kill -9 the idle engine, then wait until a new one serves (see :func:`wait_ok`)."""
    old = server.health()["engine_pid"]
    os.kill(old, signal.SIGKILL)
    return wait_ok(server, old)


@pytest.fixture
def fresh(hf_home, tmp_path):
    server = start_server(tmp_path, hf_home, "--temperature", "0")
    yield server
    stop(server)


def test_the_server_restarts_an_engine_killed_while_idle_and_the_next_request_works(fresh,
                                                                                     hf_home):
    old = fresh.health()["engine_pid"]
    os.kill(old, signal.SIGKILL)
    new = old
    deadline = time.monotonic() + 60
    while new == old and time.monotonic() < deadline:  # no request: the server notices
        new = httpx.get(fresh.root + "/health", timeout=10).json()["engine_pid"]
        time.sleep(0.01)
    assert new != old and psutil.Process(new).ppid() == fresh.proc.pid
    os.kill(new, signal.SIGSTOP)  # hold the new engine mid-load: "restarting" stays visible
    try:
        r = httpx.get(fresh.root + "/health", timeout=10)
        assert r.status_code == 503 and r.json()["status"] == "restarting"
        assert "exited unexpectedly (exit code -9)" in r.json()["error"]
        st = kit(fresh.home, hf_home, "status", "--url", fresh.root)
        assert st.returncode == 4 and "not ready yet" in st.stderr, st.stderr
        st = kit(fresh.home, hf_home, "status", "--json", "--url", fresh.root)
        assert st.returncode == 4 and json.loads(st.stdout)["status"] == "restarting"
    finally:
        os.kill(new, signal.SIGCONT)
    _, seen = wait_ok(fresh)
    assert "failed" not in seen  # recoverable: never reported as failed
    health = fresh.health()
    assert health["restarts"] == 1 and health["error"] is None and health["engine_pid"] == new
    assert kit(fresh.home, hf_home, "status", "--url", fresh.root).returncode == 0
    r = httpx.post(fresh.v1 + "/chat/completions", json=CHAT, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1
    assert fresh.health()["engine_pid"] == new  # served by it, no second restart


@pytest.mark.agent  # pi, through agents_path()
def test_launch_after_the_idle_engine_was_killed_runs_the_agent_and_its_request_works(
        fresh, hf_home):
    # Regression: launch exited 1 every time ("wait_ready sees status failed") and the
    # agent never ran. Now launch waits through "restarting" and pi gets its answer.
    path = agents_path()
    (fresh.home / ".pi" / "agent").mkdir(parents=True)
    (fresh.home / ".pi" / "agent" / "settings.json").write_text('{"retry": {"enabled": false}}')
    served = fresh.health()["requests_served"]
    old = fresh.health()["engine_pid"]
    os.kill(old, signal.SIGKILL)
    r = kit(fresh.home, hf_home, "launch", "pi", "--url", fresh.root, "--", "-p",
            "What is the capital of France?", "--no-session", path=path)
    assert r.returncode == 0, r.stderr
    assert "reusing mlx-kit server" in r.stderr and r.stdout.strip()
    health = fresh.health()
    assert health["status"] == "ok" and health["restarts"] == 1
    assert health["requests_served"] > served  # pi's request ran on the new engine
    assert kit(fresh.home, hf_home, "status", "--url", fresh.root).returncode == 0


def test_an_engine_that_keeps_dying_is_left_failed_with_the_reason_and_status_exits_1(fresh,
                                                                                        hf_home):
    from kit.engine.proc.process import _RESTART_LIMIT

    for _ in range(_RESTART_LIMIT):
        kill_engine_and_watch(fresh)
    last = fresh.health()["engine_pid"]
    os.kill(last, signal.SIGKILL)
    for _ in range(500):
        h = httpx.get(fresh.root + "/health", timeout=10).json()
        if h["status"] != "ok":
            break
        time.sleep(0.02)
    assert h["status"] == "failed" and "not restarting it" in h["error"], h
    r = kit(fresh.home, hf_home, "status", "--url", fresh.root)
    assert r.returncode == 1
    assert "exited unexpectedly" in flat(r.stderr) and "hint:" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    # the fix the hint names works: the next request starts an engine again
    r = httpx.post(fresh.v1 + "/chat/completions", json=CHAT, timeout=120)
    assert r.status_code == 200, r.text
    assert fresh.health()["status"] == "ok"


@pytest.fixture
def broken_model(hf_home, tmp_path) -> Path:
    """The starter's folder with its weights replaced by garbage: the engine starts, the
    load fails (the engine stays alive and reports it)."""
    from huggingface_hub import snapshot_download

    from kit.models.starter import STARTER_ID

    src = Path(snapshot_download(STARTER_ID, cache_dir=hf_home / "hub", local_files_only=True))
    folder = tmp_path / "broken-model"
    folder.mkdir()
    for f in src.iterdir():
        if not f.name.startswith(".") and f.suffix != ".safetensors":
            (folder / f.name).symlink_to(f.resolve())
    (folder / "model.safetensors").write_bytes(b"not a safetensors file" * 100)
    return folder


@pytest.mark.agent  # pi, through agents_path()
def test_a_model_that_failed_to_load_is_failed_not_restarted_and_status_says_the_fix(
        hf_home, tmp_path, broken_model):
    home = tmp_path / "home"
    home.mkdir()
    s = spawn_server(home, hf_home, "--model", str(broken_model), log_level=None)
    proc, log, root = s.proc, s.log, s.root
    try:
        h: dict = {}
        for _ in range(1200):
            try:
                h = httpx.get(root + "/health", timeout=5).json()
                if h["status"] not in ("loading", "restarting"):
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        assert h["status"] == "failed" and h["restarts"] == 0, h
        r = kit(home, hf_home, "status", "--url", root)
        assert r.returncode == 1
        assert "error:" in r.stderr and "hint:" in r.stderr and "mlx-kit swap" in flat(r.stderr)
        assert "status:  failed" in r.stdout
        r = kit(home, hf_home, "launch", "pi", "--url", root, "--timeout", "20",
                path=agents_path())
        assert r.returncode == 1 and "engine failed" in flat(r.stderr)
        assert "Traceback" not in r.stderr
        assert httpx.get(root + "/health", timeout=5).json()["restarts"] == 0
    finally:
        proc.terminate()
        proc.wait(30)
