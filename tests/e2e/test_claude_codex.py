"""Claude Code (Anthropic Messages) and Codex (OpenAI Responses), real binaries, through
`mlx-kit launch`: each answers with text our server generated, and the server saw the
request on the agent's own wire API. Against the keyed server: `launch` hands each the
key (MLX_KIT_API_KEY), and no request of theirs goes without it."""

from __future__ import annotations

import json
import re
import subprocess

from tests.helpers import (TEST_KEY, assert_served, clean_env, refusals, require_binary,
                           requests_served, run_kit)
from tests.e2e.relay import Relay
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


#: What Claude Code prints when its own token estimate stops a turn (compaction, its
#: pre-send refusal, the interactive one).
CLAUDE_REFUSALS = re.compile(r"compact|Prompt is too long|Context limit", re.IGNORECASE)
GENERATION = re.compile(r"prompt (\d+) tokens \((\d+) cached\)")


def test_claude_code_holds_a_conversation_from_the_prompt_cache(server, tmp_path):
    """Two headless turns (`-p`, then `-c -p`) with Claude Code's full prompt (~4,000
    starter tokens) on the starter's 8,192-token window: both answered, no compaction or
    pre-send refusal, no billing-header block (it changes with the first message and would
    defeat the cache), and the second turn's prompt mostly served from the prompt cache."""
    require_binary("claude")
    project = tmp_path / "project"
    project.mkdir()
    # No MLX_KIT_API_KEY: launch rightly refuses to hand a key to the relay's port (not
    # the server's), and the shared server needs none.
    env = clean_env(tmp_path)
    with Relay(server.root) as relay:
        turns = []
        for args in (["-p", "What is the capital of France?"],
                     ["-c", "-p", "And what is the capital of Germany?"]):
            log_start = len(server.log_text())
            r = run_kit(env, "launch", "claude", "--url", relay.url + "/v1", "--", *args,
                        cwd=project, timeout=600, stdin=subprocess.DEVNULL)
            out = r.stdout + r.stderr
            assert r.returncode == 0, out[-2000:]
            assert r.stdout.strip(), out[-2000:]
            assert not CLAUDE_REFUSALS.search(out), out[-2000:]
            assert_no_config_warnings("claude", r.stdout, r.stderr)
            turns.append([tuple(map(int, m)) for m in
                          GENERATION.findall(server.log_text()[log_start:])])
        messages = relay.bodies("/v1/messages")
    settings = json.loads((tmp_path / ".claude" / "mlx-kit.settings.json").read_text())
    assert settings["env"]["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    assert messages and all(turns), (len(messages), turns)
    systems = [b.get("system") for b in messages if isinstance(b, dict)]
    texts = [blk.get("text", "") for sys in systems if isinstance(sys, list) for blk in sys]
    assert texts and not any(t.startswith("x-anthropic-billing-header") for t in texts)
    # One generation in turn 2: its answer, no summary request first (auto-compaction sent
    # one of 5,364 tokens before answering under the 8,192 window's old settings).
    assert len(turns[1]) == 1, turns
    (first, _), (second, cached) = max(turns[0]), max(turns[1])
    assert second > first, (turns)  # the second turn resent the first
    assert cached >= 0.9 * first, f"turn 2 reused {cached} of turn 1's {first} tokens"


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
