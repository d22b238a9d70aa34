"""The server's HTTP process stays light: it never imports mlx (the starter is built in a
child process, the model runs in the engine process), and its event loop keeps streaming
while the model catalog is rescanned."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import start_server, stop
from tests.helpers import needs_proc

pytestmark = pytest.mark.slow


def mlx_libraries(pid: int) -> set[str]:
    """The mlx shared objects (``libmlx*.so``, ``mlx/core*.so``) mapped into process ``pid``:
    importing ``mlx.core`` (which ``mlx_lm`` does too) maps both, visible from outside."""
    needs_proc("a process's memory maps")
    found = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[5] if len(line.split(maxsplit=5)) == 6 else ""
        name = Path(path).name
        if name.startswith("libmlx") or ("/mlx/" in path and name.startswith("core.")):
            found.add(path)
    return found


def assert_http_process_has_no_mlx(server) -> None:
    health = server.health()
    assert health["status"] == "ok"
    assert health["pid"] == server.proc.pid != health["engine_pid"]
    assert mlx_libraries(server.proc.pid) == set()
    # the same check sees mlx where it is: in the engine process
    assert mlx_libraries(health["engine_pid"])


def test_http_process_has_no_mlx_on_a_normal_run(server):
    assert_http_process_has_no_mlx(server)


@pytest.mark.model  # builds the starter itself, from an empty HF_HOME
def test_first_run_builds_the_starter_outside_the_http_process(tmp_path):
    """An empty HF_HOME: the starter is converted and verified (with mlx) in a child
    process; its progress still reaches the server's log, where `launch` shows it."""
    hf_home = tmp_path / "hf-empty"
    (tmp_path / "home").mkdir()
    s = start_server(tmp_path / "home", hf_home)
    try:
        assert_http_process_has_no_mlx(s)
        log = s.log_text()
        for step in ("converting SmolLM2-135M-Instruct.Q4_1.gguf", "verifying the converted",
                     "registering mlx-kit/SmolLM2-135M-Instruct"):
            assert step in log
        assert (hf_home / "hub" / "models--mlx-kit--SmolLM2-135M-Instruct" / "refs"
                / "main").is_file()
    finally:
        stop(s)


def hub_with_the_starters(hf_home: Path, root: Path) -> Path:
    """A fresh HF_HOME whose hub cache links the session's built starters (no copy)."""
    hub = root / "hub"
    hub.mkdir(parents=True)
    for repo in (hf_home / "hub").glob("models--mlx-kit--*"):
        (hub / repo.name).symlink_to(repo, target_is_directory=True)
    return root


def fake_model(hub: Path, repo_id: str) -> Path:
    """A model in the hub cache layout that the catalog lists as loadable (never loaded):
    its config.json is left for the caller to write (it may be a FIFO)."""
    org, name = repo_id.split("/")
    repo = hub / f"models--{org}--{name}"
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    (snap / "model.safetensors").write_bytes(b"")
    (snap / "tokenizer.json").write_text('{"added_tokens": [], "normalizer": null}')
    return snap


def threads(pid: int) -> int:
    needs_proc("a process's thread count")
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("Threads:")))


def holds_open(pid: int, path: Path) -> bool:
    needs_proc("a process's open files")
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            if Path(os.readlink(fd)) == path:
                return True
        except OSError:  # closed meanwhile
            pass
    return False


def test_streams_and_model_list_answer_while_a_catalog_rescan_is_stuck(hf_home, tmp_path):
    """Regression (review U9/F10): the catalog scan ran on the event loop, so a slow scan
    (every tokenizer.json read in full) stalled every open stream. Here a rescan is held
    for as long as the test likes: a model's config.json is a FIFO that the scan blocks
    on until the test writes it. Streams and /v1/models must not notice."""
    home = tmp_path / "home"
    home.mkdir()
    hf = hub_with_the_starters(hf_home, tmp_path / "hf")
    s = start_server(home, hf, "--temperature", "0")
    writer = None
    try:
        assert "org/slow" not in ids(s)  # the first scan (before listening) is done
        snap = fake_model(hf / "hub", "org/slow")
        fifo = snap / "config.json"
        os.mkfifo(fifo)
        writer = os.open(fifo, os.O_RDWR)  # the scan's open() succeeds, its read() waits
        deadline = time.monotonic() + 60
        while not holds_open(s.proc.pid, fifo):  # a rescan starts within 10 s of a read
            assert time.monotonic() < deadline, "no rescan started"
            assert "org/slow" not in ids(s)
            time.sleep(0.2)
        # the rescan is stuck in read(): the event loop must still stream and list
        text = ""
        with httpx.stream("POST", s.v1 + "/chat/completions", timeout=60, json={
                "model": "local", "max_tokens": 20, "stream": True,
                "messages": [{"role": "user", "content": "Count to ten."}]}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    for c in json.loads(line[6:])["choices"]:
                        text += c["delta"].get("content") or ""
                    if len(text) == 1:  # mid-stream: the list answers from the snapshot
                        assert "org/slow" not in ids(s)
        assert text.strip()
        assert holds_open(s.proc.pid, fifo)  # still stuck all along
        config = json.dumps({"model_type": "llama", "max_position_embeddings": 1024})
        (snap / "config.real").write_text(config)
        os.replace(snap / "config.real", fifo)  # later opens (the catalog reads it twice)
        os.write(writer, config.encode())       # the stuck read gets it, then end-of-file
        os.close(writer)
        writer = None
        deadline = time.monotonic() + 60
        while "org/slow" not in ids(s):  # the rescan ends; a later read serves its result
            assert time.monotonic() < deadline, "the rescan's result was never served"
            time.sleep(0.2)
        entry = next(m for m in httpx.get(s.v1 + "/models", timeout=10).json()["data"]
                     if m["id"] == "org/slow")
        assert entry["context_window"] == 1024 and not entry["loaded"]
    finally:
        if writer is not None:
            os.close(writer)
        stop(s)


def ids(server) -> list[str]:
    r = httpx.get(server.v1 + "/models", timeout=10)
    assert r.status_code == 200
    return [m["id"] for m in r.json()["data"]]


def test_requests_waiting_on_a_stuck_engine_hold_no_worker_thread_and_health_answers(
        hf_home, tmp_path):
    """Two regressions, one stopped engine (SIGSTOP): each count_tokens held one of the
    event loop's worker threads for up to 30 s while the engine process did not answer
    (review U9), and a few such calls took every worker thread, so /health, which used one
    too, hung (new-user try)."""
    home = tmp_path / "home"
    home.mkdir()
    s = start_server(home, hf_home)
    engine_pid = s.health()["engine_pid"]
    body = {"model": "local", "messages": [{"role": "user", "content": "Hi"}]}
    answers: list[httpx.Response] = []
    before = threads(s.proc.pid)
    os.kill(engine_pid, signal.SIGSTOP)
    try:
        clients = [threading.Thread(target=lambda: answers.append(httpx.post(
            s.v1 + "/messages/count_tokens", json=body, timeout=60)), daemon=True)
            for _ in range(12)]
        for t in clients:
            t.start()
        server = psutil.Process(s.proc.pid)
        deadline = time.monotonic() + 30
        while sum(c.status == psutil.CONN_ESTABLISHED and c.laddr.port == s.port
                  for c in server.net_connections("tcp")) < len(clients):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        most = before
        for _ in range(20):  # 2 s: a worker thread per waiting request would show at once
            most = max(most, threads(s.proc.pid))
            time.sleep(0.1)
        assert most <= before + 1, f"{most - before} threads more while 12 requests wait"
        assert answers == []  # all 12 still waiting on the stopped engine
        t0 = time.monotonic()
        health = httpx.get(s.root + "/health", timeout=15)
        assert health.status_code == 200 and time.monotonic() - t0 < 5
        assert health.json()["memory"]["weights_bytes"]  # the last values it reported
    finally:
        os.kill(engine_pid, signal.SIGCONT)
    try:
        for t in clients:
            t.join(60)
        assert [r.status_code for r in answers] == [200] * len(clients)
        assert {r.json()["input_tokens"] for r in answers} == {
            httpx.post(s.v1 + "/messages/count_tokens", json=body, timeout=60)
            .json()["input_tokens"]}
    finally:
        stop(s)
