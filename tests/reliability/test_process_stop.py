"""Issue 11 item 2: `mlx-kit stop` signals only a process it can prove is this user's
server. Everything here is real: `python -m kit stop` subprocesses, real servers on
loopback, real bystander processes (`sleep 60`) that must survive; the one stand-in is a
tiny HTTP server in the test that impersonates mlx-kit's unauthenticated /health."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import psutil
import pytest

from tests.helpers import clean_env, flat, free_port, run_kit, start_server, stop


def pid_file(home: Path, port: int) -> Path:
    return home / ".local" / "state" / "mlx-kit" / f"server-{port}.json"


def gone(pid: int, timeout: float = 20) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        return False
    return True


@pytest.fixture
def bystander():
    """An unrelated process of this user: nothing may signal it."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def fake_health(bystander):
    """A loopback HTTP server answering /health as mlx-kit would, naming the bystander's
    pid (what an attacker's or a confused program's /health can say); every other path,
    /admin/shutdown included, is a 404. Yields (url, paths requested)."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append(f"{self.command} {self.path}")
            if self.path == "/health":
                body = json.dumps({"service": "mlx-kit", "status": "ok",
                                   "pid": bystander.pid}).encode()
                self.send_response(200)
            else:
                body = b'{"error": "not found"}'
                self.send_response(404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()


def test_stop_leaves_a_process_named_by_a_fake_health_alive_and_says_why(
        tmp_path, bystander, fake_health):
    url, _ = fake_health
    r = run_kit(clean_env(tmp_path), "stop", "--url", url)
    assert r.returncode == 1
    assert "no pid file of this user" in flat(r.stderr) and "another user or HOME" in flat(r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    assert bystander.poll() is None, "stop signalled the pid an unauthenticated /health named"


def test_stop_never_signals_an_unrelated_process_that_our_pid_file_and_health_name(
        tmp_path, bystander, fake_health):
    # Worse case: our pid file for that port names the same pid as /health (a stale file
    # whose pid the system gave to another program): its start time and command line are
    # not the server's, so no signal; the admin API (404 here) is asked and refuses.
    url, seen = fake_health
    port = int(url.rsplit(":", 1)[1])
    path = pid_file(tmp_path, port)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"pid": bystander.pid, "create_time": 1.0,
                                "cmdline": [sys.executable, "-m", "kit", "serve"],
                                "admin_token": "t0ken"}))
    r = run_kit(clean_env(tmp_path), "stop", "--url", url)
    assert r.returncode == 1 and "refused to shut down: HTTP 404" in flat(r.stderr)
    assert bystander.poll() is None
    assert "POST /admin/shutdown" in seen


def test_stop_never_signals_a_process_whose_real_identity_is_in_the_pid_file_if_not_a_server(
        tmp_path, bystander, fake_health):
    # Even a pid file with the bystander's true start time and command line, and /health
    # naming it: `sleep 60` is not an mlx-kit server's command line, so no signal.
    url, seen = fake_health
    me = psutil.Process(bystander.pid)
    path = pid_file(tmp_path, int(url.rsplit(":", 1)[1]))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"pid": me.pid, "create_time": me.create_time(),
                                "cmdline": me.cmdline(), "admin_token": "t0ken"}))
    r = run_kit(clean_env(tmp_path), "stop", "--url", url)
    assert r.returncode == 1 and "refused to shut down" in flat(r.stderr)
    assert bystander.poll() is None


def test_stop_with_a_non_loopback_url_refuses_and_signals_nothing(tmp_path, bystander):
    # Even a pid file that proves the bystander (its real start time and command line)
    # must not make a remote URL's port mean a local process.
    port = free_port()
    me = psutil.Process(bystander.pid)
    path = pid_file(tmp_path, port)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"pid": me.pid, "create_time": me.create_time(),
                                "cmdline": me.cmdline(), "admin_token": "t0ken"}))
    r = run_kit(clean_env(tmp_path), "stop", "--url", f"http://192.0.2.7:{port}")  # TEST-NET-1
    assert r.returncode == 1
    assert "not a loopback address" in flat(r.stderr)
    assert bystander.poll() is None
    assert path.exists(), "a remote URL's stop touched the local pid file"


def test_a_second_homes_server_survives_stop_from_the_first_home_and_its_own_stop_works(
        hf_home, tmp_path):
    other_home, my_home = tmp_path / "other", tmp_path / "mine"
    other_home.mkdir()
    my_home.mkdir()
    server = start_server(other_home, hf_home)
    try:
        engine_pid = server.health()["engine_pid"]
        r = run_kit(clean_env(my_home), "stop", "--url", server.root)
        assert r.returncode == 1 and "another user or HOME" in flat(r.stderr)
        assert server.proc.poll() is None and server.health()["status"] == "ok"
        # the admin API is closed to anyone without that HOME's token
        r = httpx.post(server.root + "/admin/shutdown", timeout=10)
        assert r.status_code == 401 and server.proc.poll() is None

        # the normal stop, from the server's own HOME: every check agrees -> SIGTERM
        r = run_kit(clean_env(other_home), "stop", "--url", server.root)
        assert r.returncode == 0, r.stderr
        assert f"stopped the server at {server.root} (pid {server.proc.pid}, via signal)" \
            in flat(r.stdout)
        assert server.proc.wait(20) is not None
        assert gone(engine_pid, 10), "the engine process outlived its server"
        assert not pid_file(other_home, server.port).exists()
        assert "Traceback" not in server.log_text()
    finally:
        stop(server)


def test_stop_asks_the_admin_api_when_the_pid_cannot_be_proven_and_leaves_no_process(
        hf_home, tmp_path):
    # e.g. a server in another pid namespace sharing this HOME: the pid file's start time
    # does not match the pid here, so no signal; the token still proves it is ours.
    server = start_server(tmp_path, hf_home)
    try:
        engine_pid = server.health()["engine_pid"]
        path = pid_file(tmp_path, server.port)
        info = json.loads(path.read_text())
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        assert info["create_time"] == pytest.approx(psutil.Process(server.proc.pid).create_time())
        path.write_text(json.dumps({**info, "create_time": info["create_time"] - 1000}))
        r = run_kit(clean_env(tmp_path), "stop", "--url", server.root)
        assert r.returncode == 0, r.stderr
        assert "via admin API" in r.stdout and f"pid {server.proc.pid}" in r.stdout
        server.proc.wait(20)  # the same path as SIGTERM: graceful, engine stopped
        assert gone(engine_pid, 10)
        assert not path.exists(), "the server did not remove its pid file"
        log = server.log_text()
        assert "Traceback" not in log and "did not stop" not in log
    finally:
        stop(server)


@pytest.fixture
def serve_lookalike(tmp_path):
    """A live process whose command line reads like mlx-kit's server (`/bin/sh .../mlx-kit
    serve`) but that serves nothing: a stand-in for a server that has not bound its port
    yet, or is wedged. Yields its psutil.Process."""
    script = tmp_path / "bin" / "mlx-kit"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\nsleep 60\n")
    script.chmod(0o755)
    proc = subprocess.Popen([str(script), "serve"])
    me = psutil.Process(proc.pid)
    for _ in range(200):  # until the shell runs the script (its command line is final)
        if "serve" in me.cmdline():
            break
        time.sleep(0.01)
    yield me
    proc.kill()
    proc.wait()


def write_proving_pid_file(home: Path, port: int, proc: psutil.Process) -> Path:
    path = pid_file(home, port)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": proc.pid, "create_time": proc.create_time(),
                                "cmdline": proc.cmdline(), "admin_token": "t0ken"}))
    return path


def test_stop_refuses_a_live_server_process_that_does_not_answer(tmp_path, serve_lookalike):
    # The pid file proves the process (start time, command line) but nothing answers at the
    # URL: /health cannot confirm it, so stop says so instead of signalling it.
    port = free_port()
    write_proving_pid_file(tmp_path, port, serve_lookalike)
    r = run_kit(clean_env(tmp_path), "stop", "--url", f"http://127.0.0.1:{port}")
    assert r.returncode == 1 and "nothing answers" in flat(r.stderr)
    assert f"kill {serve_lookalike.pid}" in flat(r.stderr)
    assert serve_lookalike.is_running() and serve_lookalike.status() != psutil.STATUS_ZOMBIE


def test_stop_refuses_when_health_names_another_pid_than_our_live_server_and_keeps_the_token(
        tmp_path, serve_lookalike, bystander, fake_health):
    # Our pid file proves a live server, but what answers on the port reports another pid:
    # neither process is signalled and our admin token is not sent to it.
    url, seen = fake_health
    path = write_proving_pid_file(tmp_path, int(url.rsplit(":", 1)[1]), serve_lookalike)
    r = run_kit(clean_env(tmp_path), "stop", "--url", url)
    assert r.returncode == 1
    assert f"reports pid {bystander.pid}" in flat(r.stderr)
    assert serve_lookalike.status() != psutil.STATUS_ZOMBIE and bystander.poll() is None
    assert not [x for x in seen if x.startswith("POST")] and path.exists()
