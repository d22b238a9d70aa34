"""The server's log as an operator reads it: rotated files, no /health polls, one traceback
per failure, a warning when debug writes answers to disk, and ``mlx-kit logs [-f]``.

Real servers on loopback (the starter model): one detached exactly as ``launch`` starts it
(kit.daemon.ensure_server), one rotating at a tiny size (the hidden MLX_KIT_LOG_MAX_BYTES),
one in the foreground without a log file. The readers and the rotation handler are also
tested model-free on real files."""

from __future__ import annotations

import json
import logging
import os
import queue
import stat
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from kit.logfile import BACKUPS, MAX_BYTES_ENV, ServerLogFile, _handlers, check_rotation_targets
from kit.logread import Follower, follow, last_lines
from tests.helpers import (clean_env, free_port, run_kit, spawn_server, stop, wait_health,
                           wait_until)

TRACEBACK = "Traceback (most recent call last)"


def log_dir(home: Path) -> Path:
    """platformdirs' user_log_dir under a throwaway HOME on Linux."""
    return home / ".local" / "state" / "mlx-kit" / "log"


def chat(root: str, text: str = "Say hi.", max_tokens: int = 4) -> httpx.Response:
    return httpx.post(root + "/v1/chat/completions", timeout=180, json={
        "model": "local", "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": text}]})


class Reader:
    """Lines a process prints on stdout, read by a thread (so a test can wait on them)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines, self._q = proc, [], queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))

    def text(self) -> str:
        while not self._q.empty():
            self.lines.append(self._q.get())
        return "\n".join(self.lines)

    def end(self) -> None:
        self.proc.terminate()  # only the `logs -f` process this test started
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def follow_logs(home: Path, port: int) -> Reader:
    proc = subprocess.Popen([sys.executable, "-m", "kit", "logs", "-f", "-n", "5", "--port",
                             str(port)], env=clean_env(home), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return Reader(proc)


# --- model-free: the readers, the rotation, no server --------------------------------------

def test_last_lines_reads_the_end_of_a_file_in_blocks(tmp_path):
    path = tmp_path / "log"
    path.write_text("".join(f"line {i} {'x' * 100}\n" for i in range(5000)))  # ~0.5 MB
    assert last_lines(path, 3) == [f"line {i} {'x' * 100}" for i in (4997, 4998, 4999)]
    assert len(last_lines(path, 1000)) == 1000 and last_lines(path, 1000)[0].startswith(
        "line 4000 ")
    assert last_lines(path, 0) == []
    assert len(last_lines(path, 10**6)) == 5000
    assert last_lines(path, 2, end=path.stat().st_size - 111) == [
        f"line 4997 {'x' * 100}", f"line 4998 {'x' * 100}"]


def test_the_log_rotates_at_its_size_and_keeps_3_backups(tmp_path, monkeypatch):
    monkeypatch.setenv(MAX_BYTES_ENV, "2048")
    path = tmp_path / "server.log"
    handler = ServerLogFile(path)
    handler.setFormatter(logging.Formatter("%(message)s"))
    try:
        for i in range(400):
            handler.emit(logging.makeLogRecord({"msg": f"record {i:04d} " + "y" * 40}))
    finally:
        handler.close()
    assert handler.no_rotation is None  # a private folder (pytest's tmp is 0700) rotates
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["server.log", "server.log.1", "server.log.2", "server.log.3"]
    assert BACKUPS == 3
    assert all(p.stat().st_size <= 2048 for p in tmp_path.iterdir())
    assert path.read_text().splitlines()[-1].startswith("record 0399 ")
    kept = "".join((tmp_path / n).read_text() for n in reversed(files[1:])) + path.read_text()
    numbers = [int(line.split()[1]) for line in kept.splitlines()]
    assert numbers == list(range(numbers[0], 400))  # in order, nothing lost in between


def test_follow_reads_every_line_across_rotations(tmp_path, monkeypatch):
    monkeypatch.setenv(MAX_BYTES_ENV, "1024")
    path = tmp_path / "server.log"
    handler = ServerLogFile(path)
    handler.setFormatter(logging.Formatter("%(message)s"))
    got: list[str] = []
    done = threading.Event()
    reader = threading.Thread(target=lambda: got.extend(
        follow(path, start=0, poll=0.01, stop=done.is_set)))
    reader.start()
    try:
        for i in range(120):  # ~5 rotations of 1 KiB, with the reader polling meanwhile
            handler.emit(logging.makeLogRecord({"msg": f"record {i:04d} " + "z" * 30}))
            if i % 10 == 0:
                wait_until(lambda: "".join(got).count("\n") > i, timeout=30,
                           what=f"record {i} followed")
        wait_until(lambda: "".join(got).count("\n") == 120, timeout=30, what="every record")
    finally:
        done.set()
        reader.join(10)
        handler.close()
    assert [int(line.split()[1]) for line in "".join(got).splitlines()] == list(range(120))


class Followed:
    """A :class:`Follower` iterated by a thread; ``text()`` is what it yielded so far."""

    def __init__(self, follower: Follower) -> None:
        self.follower, self.got, self.done = follower, [], threading.Event()
        follower.stop, follower.poll = self.done.is_set, 0.01
        self.thread = threading.Thread(target=lambda: self.got.extend(follower))
        self.thread.start()

    def text(self) -> str:
        return "".join(self.got)

    def end(self) -> None:
        self.done.set()
        self.thread.join(10)


def test_follow_holds_back_a_line_until_its_newline(tmp_path):
    path = tmp_path / "server.log"
    path.write_bytes(b"")
    followed = Followed(Follower(path, start=0))
    try:
        with open(path, "ab", buffering=0) as w:
            w.write(b"one\ntw")
            wait_until(lambda: followed.text() == "one\n", timeout=30, what="line one")
            wait_until(lambda: followed.follower.pending == "tw", timeout=30, what="held")
            assert followed.text() == "one\n"  # "tw" not printed as a line of its own
            w.write(b"o\nthr")
            wait_until(lambda: followed.text() == "one\ntwo\n", timeout=30, what="two")
    finally:
        followed.end()
    assert followed.text() == "one\ntwo\n" and followed.follower.pending == "thr"
    # follow() gives the unended line when it stops
    assert list(follow(path, start=0, stop=lambda: True)) == []
    done = iter([False, True])
    assert "".join(follow(path, start=0, poll=0.01, stop=lambda: next(done, True))) == \
        "one\ntwo\nthr\n"


def test_follow_from_a_measured_handle_reads_a_file_rotated_in_between(tmp_path):
    """`logs -f` takes the size and the file from one handle: a rotation right after it
    measured cannot make it start the new file at the old size (skipping its start)."""
    path = tmp_path / "server.log"
    path.write_bytes(b"old 1\nold 2\n" + b"x" * 100 + b"\n")
    log = open(path, "rb")
    size = os.fstat(log.fileno()).st_size
    path.rename(tmp_path / "server.log.1")  # the server rotates now
    path.write_bytes(b"new 1\nunended")
    followed = Followed(Follower(path, start=size, file=log))
    try:
        wait_until(lambda: followed.text() == "new 1\n", timeout=30, what="the new start")
    finally:
        followed.end()
    assert followed.follower.pending == "unended"


def test_a_rotated_files_unended_line_is_ended_not_joined_to_the_next(tmp_path):
    path = tmp_path / "server.log"
    path.write_bytes(b"a\npartial")
    followed = Followed(Follower(path, start=0))
    try:
        wait_until(lambda: followed.text() == "a\n", timeout=30, what="a")
        path.rename(tmp_path / "server.log.1")
        path.write_bytes(b"b\n")
        wait_until(lambda: followed.text() == "a\npartial\nb\n", timeout=30,
                   what="the old file's last line, ended, then the new file")
    finally:
        followed.end()


def test_log_files_are_created_0600_across_rotations_in_a_0700_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(MAX_BYTES_ENV, "1024")
    path = tmp_path / "new" / "server.log"
    handlers = _handlers(path, ServerLogFile)
    handler = handlers[0]
    handler.setFormatter(logging.Formatter("%(message)s"))
    try:
        for i in range(100):
            handler.emit(logging.makeLogRecord({"msg": f"record {i:04d} " + "y" * 40}))
    finally:
        handler.close()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == ["server.log", "server.log.1", "server.log.2", "server.log.3"]
    assert {stat.S_IMODE(p.stat().st_mode) for p in path.parent.iterdir()} == {0o600}


def test_a_log_dir_that_exists_keeps_its_mode(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    _handlers(shared / "server.log", ServerLogFile)[0].close()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert stat.S_IMODE((shared / "server.log").stat().st_mode) == 0o600


def test_a_detached_servers_log_is_0600_in_a_0700_dir(tmp_path, monkeypatch):
    """start_detached creates the log (before serve takes it over); serve is made to stop
    at once here by a foreign file where its rotation would go (no model needed)."""
    from kit.daemon import log_file, start_detached
    from kit.urls import parse_url

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    url = parse_url(f"http://127.0.0.1:{free_port()}")
    log = log_file(url)
    log.parent.parent.mkdir(parents=True)  # the state dir exists, the log dir not yet
    foreign = tmp_path / "elsewhere"
    foreign.write_text("not a log")
    proc, got = start_detached(url, None, ["--log-file", str(foreign)])  # the last wins
    try:
        assert proc.wait(60) == 1 and got == log
    finally:
        if proc.poll() is None:
            proc.kill()  # only the process this test started
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700


def test_rotation_never_overwrites_files_that_are_not_our_logs(tmp_path):
    """A relative --log-file whose .2 is someone's notes: serve refuses before it logs
    (naming the file by its absolute path), and the notes keep every byte."""
    (tmp_path / "rel").mkdir()
    notes = tmp_path / "rel" / "server.log.2"
    notes.write_bytes(b"my notes\nnot a log\n")
    ours = tmp_path / "rel" / "server.log.1"
    ours.write_text("2026-12-01 10:00:00,123 INFO mlx_kit.serve: an old run\n")
    r = run_kit(tmp_path, "serve", "--port", str(free_port()), "--log-file",
                "rel/server.log", "--model", "/nonexistent")
    assert r.returncode == 1, r.stderr
    said = " ".join(r.stderr.split())
    assert "error: the log file's rotation would overwrite or delete files that are not " \
           f"mlx-kit logs: {notes}" in said and str(ours) not in said
    assert "Traceback" not in r.stderr
    assert notes.read_bytes() == b"my notes\nnot a log\n"
    assert not (tmp_path / "rel" / "server.log").exists()


def test_an_empty_file_or_our_own_log_is_fine_to_rotate(tmp_path):
    path = tmp_path / "server.log"
    (tmp_path / "server.log.1").write_text("")
    (tmp_path / "server.log.3").write_text("\n--- 2026-12-01 10:00:00 python -m kit serve\n")
    check_rotation_targets(path)  # no error


def test_logs_with_no_server_and_no_log_exits_3_and_says_so(tmp_path):
    port = free_port()
    r = run_kit(tmp_path, "logs", "--port", str(port))
    assert r.returncode == 3, r.stderr
    assert f"no mlx-kit server is running on port {port}" in r.stderr
    assert str(log_dir(tmp_path) / f"server-{port}.log") in r.stderr.replace("\n", "")
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_logs_with_no_server_prints_the_last_servers_log(tmp_path):
    port = free_port()
    log = log_dir(tmp_path) / f"server-{port}.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"2026-12-01 10:00:00 INFO mlx_kit.serve: line {i}\n"
                           for i in range(80)))
    r = run_kit(tmp_path, "logs", "--port", str(port), "-n", "3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"2026-12-01 10:00:00 INFO mlx_kit.serve: line {i}"
                                     for i in (77, 78, 79)]
    assert "no server is running" in r.stderr and str(log) in r.stderr.replace("\n", "")
    assert len(run_kit(tmp_path, "logs", "--port", str(port)).stdout.splitlines()) == 50


# An unexpected exception cannot be provoked in a real server (each such bug gets fixed),
# so this process serves the real app, with serve's logging and uvicorn settings, over a
# stand-in engine whose one call behind /health raises.
BROKEN_SERVER = """
import sys, uvicorn
from pathlib import Path
from kit.logfile import setup_server
from kit.server.app import create_app
from kit.server.guard import EdgePolicy
from kit.server.state import ServerState

class BrokenEngine:
    async def current_memory(self):
        raise ZeroDivisionError("boom")

port, log = int(sys.argv[1]), Path(sys.argv[2])
setup_server("info", log)
app = create_app(ServerState(BrokenEngine()), edge=EdgePolicy.build("127.0.0.1", port, []))
uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                              log_level="info")).run()
"""


def test_an_unexpected_500_logs_exactly_one_traceback(tmp_path):
    port, log = free_port(), tmp_path / "server.log"
    with open(log, "ab") as out:  # as start_detached does: stdout and stderr into the log
        proc = subprocess.Popen([sys.executable, "-c", BROKEN_SERVER, str(port), str(log)],
                                env=clean_env(tmp_path), stdout=out, stderr=out)
    root = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(root + "/", timeout=2).status_code == 200, timeout=60,
                   what="the server listening")
        r = httpx.get(root + "/health", timeout=10)
        assert r.status_code == 500
        assert r.json()["error"]["message"] == "internal server error; see the server log"
        text = log.read_text()  # logged before the 500 was sent
        assert text.count(TRACEBACK) == 1, text
        assert "unexpected error in GET /health" in text and "ZeroDivisionError: boom" in text
        assert "Exception in ASGI application" not in text
    finally:
        proc.terminate()
        proc.wait(20)


# --- real servers --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def detached(hf_home, tmp_path_factory):
    """A server started as `launch` starts one (ensure_server -> start_detached), at debug
    level: (home, port, log path)."""
    home = tmp_path_factory.mktemp("home-logs")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = clean_env(home, hf_home, MLX_KIT_LOG_LEVEL="debug")
    code = ("from kit.daemon import ensure_server; from kit.urls import parse_url; "
            f"p, started = ensure_server(parse_url({url!r}), None, 180); "
            "print(started, p.health.status)")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.stdout.split() == ["True", "ok"], r.stderr[-2000:]
    yield home, port, log_dir(home) / f"server-{port}.log"
    subprocess.run([sys.executable, "-m", "kit", "stop", "--url", url], env=env,
                   capture_output=True, timeout=60)


def test_health_polls_stay_out_of_the_log_but_requests_do_not(detached):
    home, port, log = detached
    root = f"http://127.0.0.1:{port}"
    for _ in range(5):
        assert httpx.get(root + "/health", timeout=10).status_code == 200
    for path in ("/ui/data", "/metrics"):  # the status page's and a scraper's polls
        assert httpx.get(root + path, timeout=10).status_code == 200
    assert chat(root).status_code == 200
    wait_until(lambda: "POST /v1/chat/completions HTTP/1.1\" 200" in log.read_text(),
               timeout=30, what="the chat request's access line")
    text = log.read_text()
    assert "/health" not in text  # ensure_server polled it while the model loaded, too
    assert "/ui/data" not in text and "/metrics" not in text
    r = run_kit(home, "logs", "--port", str(port), "-n", "400")
    assert r.returncode == 0, r.stderr
    assert "POST /v1/chat/completions" in r.stdout and "/health" not in r.stdout
    assert "no server is running" not in r.stderr


def test_debug_level_with_a_log_file_warns_once_that_answers_go_to_disk(detached):
    _home, port, log = detached
    text = log.read_text()
    warning = f"log level debug: the text of every generated answer is written to {log}"
    assert text.count(warning) == 1
    assert chat(f"http://127.0.0.1:{port}", "Say yes.").status_code == 200
    wait_until(lambda: ": text '" in log.read_text() or ': text "' in log.read_text(),
               timeout=30, what="the debug line with the answer")


def test_a_failed_swap_500_is_logged_once_without_a_traceback(detached, hf_home, tmp_path):
    """The 500 the tests provoke on a real server (a truncated model): an expected
    failure, so one warning with the reason, no traceback (see the next test for an
    unexpected one)."""
    import shutil

    home, port, log = detached
    src = next((hf_home / "hub" / "models--mlx-kit--SmolLM2-135M-Instruct-4bit" /
                "snapshots").iterdir())
    corrupt = tmp_path / "corrupt-model"
    shutil.copytree(src, corrupt)
    weights = corrupt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])  # a truncated download
    before = log.read_text().count(TRACEBACK)
    token = json.loads((home / ".local" / "state" / "mlx-kit" / f"server-{port}.json")
                       .read_text())["admin_token"]
    r = httpx.post(f"http://127.0.0.1:{port}/admin/swap", json={"model": str(corrupt)},
                   headers={"Authorization": f"Bearer {token}"}, timeout=180)
    assert r.status_code == 500 and r.json()["error"]["code"] == "model_load_failed"
    # the failure is logged (its access line is written after it): then count
    wait_until(lambda: "POST /admin/swap HTTP/1.1\" 500" in log.read_text(), timeout=30,
               what="the swap's access line")
    text = log.read_text()
    assert text.count(TRACEBACK) == before == 0, text[-6000:]
    assert text.count(f"swap to {corrupt} failed") == 1
    assert chat(f"http://127.0.0.1:{port}").status_code == 200  # the old model still serves


def test_logs_follow_prints_a_line_written_after_it_started(detached):
    home, port, _log = detached
    reader = follow_logs(home, port)
    try:
        wait_until(lambda: reader.text().count("\n") >= 3, timeout=30,
                   what="the last lines printed")
        started = len(reader.text())
        assert chat(f"http://127.0.0.1:{port}", "Say ok.").status_code == 200
        wait_until(lambda: "POST /v1/chat/completions" in reader.text()[started:],
                   timeout=30, what="the new request's access line followed")
    finally:
        reader.end()


def test_a_tiny_log_rotates_keeps_3_backups_and_logs_follows_it(hf_home, tmp_path):
    """The same rotation in a real server (MLX_KIT_LOG_MAX_BYTES: hidden, for this test):
    the engine's lines go on into the new file, `logs` reads the current file and
    `logs -f` goes on across the rotations."""
    server = spawn_server(tmp_path, hf_home, **{MAX_BYTES_ENV: "512"})
    try:
        wait_health(server.root, server.proc)
        # `logs` finds the server's --log-file in its pid file
        reader = follow_logs(tmp_path, server.port)
        wait_until(lambda: reader.text(), timeout=30, what="logs -f's first lines")
        ids = []
        for i in range(5):  # ~500 bytes of lines each (debug)
            r = chat(server.root, f"Count to {i}.", max_tokens=1)
            assert r.status_code == 200
            ids.append(r.json()["id"])
        names = {p.name for p in tmp_path.glob(f"serve-{server.port}.log*")}
        assert names == {f"serve-{server.port}.log"} | {
            f"serve-{server.port}.log.{i}" for i in (1, 2, 3)}
        # the engine's lines (debug: each answer) keep coming into the current file
        wait_until(lambda: reader.text().count("POST /v1/chat/completions") == 5,
                   timeout=30, what="all five requests followed across the rotations")
        # each answer's line, which the engine process wrote after the server rotated
        # the file under it: it reopened the new file (else these went to a deleted one)
        for request_id in ids:
            assert f"{request_id}: text " in reader.text()
        r = run_kit(tmp_path, "logs", "--port", str(server.port), "-n", "1000")
        assert r.returncode == 0, r.stderr
        lines = server.log.read_text().splitlines()  # the current file, from its start
        assert r.stdout.splitlines() == lines[:len(r.stdout.splitlines())]
        reader.end()
    finally:
        stop(server)


def test_logs_of_a_foreground_server_without_a_log_file_says_where_it_logs(hf_home,
                                                                           tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kit", "serve", "--port", str(port)],
                            env=clean_env(tmp_path, hf_home), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_health(f"http://127.0.0.1:{port}", proc)
        r = run_kit(tmp_path, "logs", "--port", str(port))
        assert r.returncode == 1, r.stderr
        assert (f"the server on port {port} (pid {proc.pid}) runs in the foreground and "
                "logs to the terminal it was started in") in " ".join(r.stderr.split())
        assert "--log-file" in r.stderr and "Traceback" not in r.stderr
    finally:
        proc.terminate()
        proc.wait(30)


def test_logs_json_prints_each_line_as_a_record(tmp_path):
    port = free_port()
    log = log_dir(tmp_path) / f"server-{port}.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n--- 2026-12-01 10:00:00 python -m kit serve\n"
                   "2026-12-01 10:00:01,250 INFO mlx_kit.serve: ready: http://127.0.0.1 (1.2 s)\n"
                   "2026-12-01 10:00:02,003 WARNING uvicorn.access: \"GET /v1/models\" 401\n")
    r = run_kit(tmp_path, "logs", "--json", "--port", str(port), "-n", "3")
    assert r.returncode == 0, r.stderr
    assert [json.loads(line) for line in r.stdout.splitlines()] == [
        {"time": None, "level": None, "logger": None,
         "message": "--- 2026-12-01 10:00:00 python -m kit serve"},
        {"time": "2026-12-01 10:00:01,250", "level": "INFO", "logger": "mlx_kit.serve",
         "message": "ready: http://127.0.0.1 (1.2 s)"},
        {"time": "2026-12-01 10:00:02,003", "level": "WARNING", "logger": "uvicorn.access",
         "message": "\"GET /v1/models\" 401"}]


def test_logs_json_with_no_server_and_no_log_is_a_json_error_exit_3(tmp_path):
    port = free_port()
    r = run_kit(tmp_path, "logs", "--json", "--port", str(port))
    assert r.returncode == 3, r.stderr
    error = json.loads(r.stdout)["error"]
    assert error["exit_code"] == 3 and error["type"] == "ServerNotRunningError"
    assert f"no mlx-kit server is running on port {port}" in error["message"]


def test_logs_follow_json_prints_a_record_for_a_line_written_after_it_started(tmp_path):
    port = free_port()
    log = log_dir(tmp_path) / f"server-{port}.log"
    log.parent.mkdir(parents=True)
    log.write_text("2026-12-01 10:00:00,000 INFO mlx_kit.serve: before\n")
    proc = subprocess.Popen([sys.executable, "-m", "kit", "logs", "-f", "--json", "-n", "5",
                             "--port", str(port)], env=clean_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader = Reader(proc)
    try:
        wait_until(lambda: "before" in reader.text(), timeout=30, what="the first record")
        with log.open("a") as f:
            f.write("2026-12-01 10:00:05,500 ERROR mlx_kit.engine: after\n")
        wait_until(lambda: "after" in reader.text(), timeout=30, what="the new record")
        records = [json.loads(line) for line in reader.text().splitlines()]
        assert [(r["level"], r["message"]) for r in records] == [
            ("INFO", "before"), ("ERROR", "after")]
    finally:
        reader.end()
