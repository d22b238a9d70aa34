"""The engine runs in its own process: what a user sees when either process dies or stops."""

from __future__ import annotations

import os
import signal
import time

import httpx
import psutil
import pytest

from tests.helpers import start_server, stop, wait_until

NO_EOS = {"0": -100, "1": -100, "2": -100}  # the starter's special tokens: it cannot stop
CHAT = {"model": "local", "messages": [{"role": "user", "content": "Count to fifty."}],
        "temperature": 0}


def _gone(pid: int, timeout: float = 20) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        return False
    return True


def _engine_cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


@pytest.fixture
def fresh(hf_home, tmp_path):
    """A server of this test's own: for the tests that kill, stop or pause its processes
    (the read-only ones use the session's ``server``)."""
    server = start_server(tmp_path, hf_home)
    yield server
    stop(server)


def test_health_names_the_engine_process(server):
    health = server.health()
    assert health["pid"] == server.proc.pid
    engine = psutil.Process(health["engine_pid"])
    assert engine.ppid() == server.proc.pid
    assert health["restarts"] == 0
    # the HTTP process never loads mlx (so it never holds the GIL decode needs)
    httpx.post(server.v1 + "/chat/completions", json={**CHAT, "max_tokens": 2}, timeout=60)
    httpx.post(server.v1 + "/messages/count_tokens", timeout=60, json={
        "model": "local", "messages": [{"role": "user", "content": "Hi"}]})
    httpx.get(server.v1 + "/models", timeout=60)
    maps = {m.path for m in psutil.Process(server.proc.pid).memory_maps()}
    assert not [m for m in maps if "libmlx" in m]
    assert [m for m in engine.memory_maps() if "libmlx" in m.path]


def test_compiled_cuda_kernels_are_kept_in_the_user_cache_not_the_temp_dir(server):
    # Regression (H200 run): mlx's CUDA build compiles each new kernel variant on first use
    # (~30 s for a quantized matmul) into the temp dir, so a reboot that empties /tmp made
    # an agent turn stall again. mlx reads MLX_PTX_CACHE_DIR in the engine process.
    from importlib.metadata import version

    env = psutil.Process(server.health()["engine_pid"]).environ()
    assert env["MLX_PTX_CACHE_DIR"] == str(
        server.home / ".cache" / "mlx-kit" / "ptx" / version("mlx"))


def test_kill_9_of_the_server_leaves_no_engine_process_holding_the_model(fresh):
    engine_pid = fresh.health()["engine_pid"]
    os.kill(fresh.proc.pid, signal.SIGKILL)
    fresh.proc.wait(10)
    assert _gone(engine_pid), "the engine process outlived its server"


def test_stopping_the_server_stops_the_engine_process(fresh):
    engine_pid = fresh.health()["engine_pid"]
    fresh.proc.send_signal(signal.SIGINT)  # Ctrl-C in the foreground
    assert fresh.proc.wait(20) == 0
    assert _gone(engine_pid, 5)
    assert "Traceback" not in fresh.log_text()


def test_a_dead_engine_fails_the_open_stream_and_the_server_restarts_it(fresh):
    engine_pid = fresh.health()["engine_pid"]
    lines = []
    with httpx.stream("POST", fresh.v1 + "/chat/completions", timeout=60,
                      json={**CHAT, "stream": True, "max_tokens": 2000}) as r:
        for line in r.iter_lines():
            lines.append(line)
            if len(lines) == 3:  # generation is under way: the engine dies mid-stream
                os.kill(engine_pid, signal.SIGKILL)
    # the stream ended (no hang) with an OpenAI error object naming the cause
    errors = [x for x in lines if "engine process exited unexpectedly" in x]
    assert errors and '"error"' in errors[0]

    # the server starts a new engine on its own (503 "restarting" naming the cause until
    # it is ready; the new one may already be up)
    health = httpx.get(fresh.root + "/health", timeout=5)
    if health.json()["status"] != "ok":
        assert health.status_code == 503 and health.json()["status"] == "restarting"
        assert "exited unexpectedly" in health.json()["error"]

    r = httpx.post(fresh.v1 + "/chat/completions", timeout=120,
                   json={**CHAT, "max_tokens": 5})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 5
    health = fresh.health()
    assert health["status"] == "ok" and health["restarts"] == 1
    assert health["requests_served"] == 1  # counted across engines (the killed one: 0)
    assert health["engine_pid"] != engine_pid and health["error"] is None


def test_ctrl_c_while_the_engine_restarts_leaves_no_traceback(fresh):
    # Regression (new-user try): Ctrl-C that reached a just-spawned engine before it
    # ignored SIGINT printed a KeyboardInterrupt traceback from its imports. (The server
    # restarts the killed engine on its own; no request waits on it, since one still
    # waiting after uvicorn's 5 s grace would be cancelled with uvicorn's own traceback.)
    old = fresh.health()["engine_pid"]
    os.kill(old, signal.SIGKILL)
    assert _gone(old, 10)
    new = old
    for _ in range(500):
        new = httpx.get(fresh.root + "/health", timeout=5).json()["engine_pid"]
        if new != old:
            break
        time.sleep(0.01)
    assert new != old
    for pid in (new, fresh.proc.pid):  # what a terminal's Ctrl-C does: the whole group
        os.kill(pid, signal.SIGINT)
    assert fresh.proc.wait(30) == 0
    assert _gone(new, 10)
    log = fresh.log_text()
    assert "KeyboardInterrupt" not in log and "Traceback" not in log


def test_stopping_with_a_request_in_flight_stops_its_generation(fresh):
    # Regression (new-user try): at shutdown uvicorn cancelled a non-streamed request's
    # handler but generation went on to max_tokens, and the engine had to be terminated.
    import threading

    engine_pid = fresh.health()["engine_pid"]
    idle = _engine_cpu_seconds(engine_pid)
    threading.Thread(target=lambda: httpx.post(fresh.v1 + "/chat/completions", timeout=60,
                                               json={**CHAT, "max_tokens": 1500,
                                                     "logit_bias": NO_EOS}),
                     daemon=True).start()
    # generating now: the idle engine spends no CPU; half a second of it is past the
    # prefill of this short prompt (milliseconds) and into the 1,500-token decode
    wait_until(lambda: _engine_cpu_seconds(engine_pid) > idle + 0.5, 60,
               what="the engine decoding the request")
    t0 = time.monotonic()
    fresh.proc.terminate()
    assert fresh.proc.wait(30) == 0  # a stop asked for and done (kit.cli.serve._stop_once)
    assert time.monotonic() - t0 < 12  # uvicorn's 5 s grace, then the engine stops at once
    log = fresh.log_text()
    assert ", cancelled" in log and "did not stop" not in log
