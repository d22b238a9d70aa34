"""The server's HTTP process stays light: it never imports mlx (the starter is built in a
child process, the model runs in the engine process), and its event loop keeps streaming
while the model catalog is rescanned."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import start_server, stop

pytestmark = pytest.mark.slow


def mlx_libraries(pid: int) -> set[str]:
    """The mlx shared objects (``libmlx*.so``, ``mlx/core*.so``) mapped into process ``pid``:
    importing ``mlx.core`` (which ``mlx_lm`` does too) maps both, visible from outside."""
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
