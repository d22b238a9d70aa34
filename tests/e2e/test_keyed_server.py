"""The real agents against a server that requires a key (MLX_KIT_API_KEY, as a user who
keeps other local accounts out runs it): with MLX_KIT_API_KEY set, `mlx-kit launch AGENT`
gets an answer, and the server saw no request without the key (no 401 in its log).

Claude Code, Codex, Continue, aider, Cline and Droid are checked so in their own tests
(test_claude_codex, test_continue, test_aider, test_cline, test_droid run them against this
keyed server: each agent runs once), pi in test_pi; llm's own test drives `llm` itself after `harness install`, so its `launch` is
here."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from tests.helpers import TEST_KEY as KEY
from tests.helpers import (assert_served, clean_env, refusals, require_binary,
                           requests_served, run_kit)


Q = "What is the capital of France?"
HEADLESS = {
    "llm": ("llm", ["--no-log", Q]),
}


def test_the_keyed_server_refuses_requests_without_the_key(keyed_server):
    r = httpx.get(keyed_server.v1 + "/models", timeout=10)
    assert r.status_code == 401
    r = httpx.get(keyed_server.v1 + "/models", timeout=10,
                  headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200


@pytest.mark.parametrize("agent", sorted(HEADLESS))
def test_launch_passes_the_key_to_the_agent(agent, keyed_server, tmp_path):
    binary, args = HEADLESS[agent]
    require_binary(binary)
    env = clean_env(tmp_path, MLX_KIT_API_KEY=KEY, LLM_USER_PATH=str(tmp_path / "llm"))
    project = tmp_path / "project"
    project.mkdir()
    before = requests_served(keyed_server)
    refused = refusals(keyed_server)
    r = run_kit(env, "launch", agent, "--url", keyed_server.v1, "--", *args, cwd=project,
                timeout=500, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert_served(keyed_server, before, at_least=True)
    assert refusals(keyed_server) == refused, "a request of the agent went without the key"
