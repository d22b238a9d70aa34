"""Claude Code (Anthropic Messages) and Codex (OpenAI Responses), real binaries, through
`mlx-kit launch`: each answers with text our server generated, and the server saw the
request on the agent's own wire API. Against the keyed server: `launch` hands each the
key (MLX_KIT_API_KEY), and no request of theirs goes without it."""

from __future__ import annotations

import json
import subprocess

from tests.helpers import (TEST_KEY, assert_served, clean_env, refusals, require_binary,
                           requests_served, run_kit)
from tests.e2e.warnings import assert_no_config_warnings


# Claude Code's own flags for a small prompt (~4,000 starter tokens without them): on this
# 2-core CPU its full first request takes 45 s to prefill, and under load Claude Code gave
# up on it with "Prompt is too long" (seen twice in one loaded run; cause not established).
CLAUDE_SLIM = ("--tools", "", "--system-prompt", "You are a helpful assistant. Answer briefly.")


def launch(server, tmp_path, agent: str, *args: str) -> subprocess.CompletedProcess:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    return run_kit(clean_env(tmp_path, MLX_KIT_API_KEY=TEST_KEY), "launch", agent, "--url",
                   server.v1, "--", *args, cwd=project, timeout=500, stdin=subprocess.DEVNULL)


def test_claude_code_answers_through_messages(keyed_server, tmp_path):
    require_binary("claude")
    server = keyed_server
    before, refused = requests_served(server), refusals(server)
    r = launch(server, tmp_path, "claude", *CLAUDE_SLIM, "-p", "What is the capital of France?")
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    # Claude Code >= 2.1.3xx warns that it "assumes a context window of 1m tokens" for a
    # model it does not know, unless the settings' env block names the real window.
    assert_no_config_warnings("claude", r.stdout, r.stderr)
    settings = json.loads((tmp_path / ".claude" / "mlx-kit.settings.json").read_text())
    assert settings["env"]["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "8192"
    assert "Paris" in r.stdout
    assert_served(server, before, r.stdout, at_least=True)
    assert "POST /v1/messages?beta=true" in server.log_text()
    assert refusals(server) == refused, "a request of Claude Code's went without the key"


def test_codex_answers_through_responses(keyed_server, tmp_path):
    require_binary("codex")
    server = keyed_server
    before, refused = requests_served(server), refusals(server)
    r = launch(server, tmp_path, "codex", "exec", "--skip-git-repo-check",
               "What is the capital of France?")
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert_no_config_warnings("codex", r.stdout, r.stderr)  # e.g. "... is ignored"
    assert "Paris" in r.stdout
    assert_served(server, before, at_least=True)
    assert "POST /v1/responses" in server.log_text()
    assert refusals(server) == refused, "a request of Codex's went without the key"
