"""Qwen Code (real binary) against the real server, with a throwaway HOME holding a user's
own ~/.qwen/settings.json: `mlx-kit launch qwen` merges our keys in and qwen answers through
our server; `harness remove qwen` gives the file back. An over-window prompt shows qwen's
error for the server's 400, and removal still works after qwen rewrote the file.

Why the answering test slims Qwen's prompt: its first request carries ~8,700 system-prompt
tokens (plus ~7,000 of tool schemas, which the starter's template does not render), over
the starter's 8,192-token window, and with it ~5,400 more tokens in a background
"auto-memory" request after each answer. With Qwen's own switches the request is ~2.2 KB
(0.24.4; 30 KB with 0.15.10's switches alone): `--system-prompt` replaces the built-in
prompt, `--exclude-tools` drops every tool (the starter cannot call them anyway), and the
project's .qwen/settings.json sets memory.enableManagedAutoMemory = false (no CLI flag does
that; `--bare` would, but it also ignores the settings we write) and disables Qwen's
bundled skills, whose ~7,100-character reminder excluding the `skill` tool leaves in
(`--safe-mode` leaves it too, and prints a banner). See docs/agents/qwen.md.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

from tests.helpers import assert_served, clean_env, require_binary, requests_served, run_kit
from tests.e2e.warnings import assert_no_config_warnings


#: The user's own settings, as Qwen 0.15.10 writes them ("$version": 4, so qwen leaves the
#: file alone and removal can give back the exact bytes).
USER_SETTINGS = json.dumps({
    "modelProviders": {"openai": [{
        "id": "qwen3-coder-plus", "name": "Qwen3 Coder Plus", "envKey": "DASHSCOPE_API_KEY",
        "baseUrl": "https://dashscope.aliyuncs.com/compatible-mode/v1"}]},
    "security": {"auth": {"selectedType": "qwen-oauth"}},
    "model": {"name": "qwen3-coder-plus"},
    "env": {"DASHSCOPE_API_KEY": "sk-the-users-own"},
    "ui": {"theme": "GitHub"},
    "$version": 4,
}, indent=2)

#: Every tool Qwen Code offers in a headless run: 0.15.10's (the last two are "deferred"),
#: then those 0.24.4 added. Unknown names are ignored silently, so one list fits both.
QWEN_TOOLS = ["tool_search", "agent", "task_stop", "send_message", "skill", "list_directory",
              "read_file", "grep_search", "glob", "todo_write", "web_fetch",
              "ask_user_question", "exit_plan_mode",
              "cron_create", "cron_delete", "cron_list", "enter_worktree", "exit_worktree",
              "get_goal", "list_agents", "loop_wakeup", "read_mcp_resource", "record_artifact",
              "report_findings", "tool_call", "update_goal"]
#: The skills Qwen Code 0.24.4 bundles (its package's bundled/ folder).
QWEN_SKILLS = ["batch", "browser-use", "computer-use", "coordinate", "dataviz",
               "extension-creator", "goal-draft", "loop", "new-app", "qc-helper", "review",
               "simplify", "stuck", "workflow-authoring", "workflow-creator",
               "zvec-grep-install"]
SLIM = ["--system-prompt", "You are a helpful assistant. Answer in one sentence.",
        "--exclude-tools", ",".join(QWEN_TOOLS)]
QUESTION = "What is the capital of France?"
GENERATION = re.compile(r"prompt (\d+) tokens \((\d+) cached\)")


def qwen_env(home: Path) -> dict[str, str]:
    """A throwaway HOME, and none of the caller's Qwen or OpenAI settings."""
    env = clean_env(home)
    for key in list(env):
        if key.startswith(("QWEN_", "OPENAI_", "DASHSCOPE_")):
            del env[key]
    return env


#: `python -m kit` with no terminal on stdin (so neither kit nor qwen waits on one).
kit = functools.partial(run_kit, stdin=subprocess.DEVNULL)


def project(tmp_path: Path, memory: bool) -> Path:
    """A project folder; its .qwen/settings.json turns Qwen's auto-memory and bundled
    skills off unless asked."""
    folder = tmp_path / "project"
    (folder / ".qwen").mkdir(parents=True)
    if not memory:
        (folder / ".qwen" / "settings.json").write_text(json.dumps(
            {"memory": {"enableManagedAutoMemory": False},
             "skills": {"disabled": QWEN_SKILLS}, "$version": 4}, indent=2))
    return folder


def test_qwen_answers_through_our_server_and_remove_restores_the_file(server, tmp_path):
    require_binary("qwen")
    env = qwen_env(tmp_path)
    settings = tmp_path / ".qwen" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(USER_SETTINGS)
    cwd = project(tmp_path, memory=False)
    before, log_start = requests_served(server), len(server.log_text())

    r = kit(env, "launch", "qwen", "--url", server.v1, "--", *SLIM, "-p", QUESTION, cwd=cwd)

    assert r.returncode == 0, r.stderr[-2000:]
    assert_no_config_warnings("qwen", r.stdout, r.stderr)
    answer = r.stdout.strip()
    assert answer  # the starter, greedy, said "The capital of France is Paris." here
    assert_served(server, before, answer)
    # A resumed headless turn (a new qwen process) is served from the prompt cache: Qwen
    # moves its date reminder to the new question, the server puts it back where the
    # first process sent it (kit/server/stable_prompts.py; without: 448 of 519 reused).
    middle = len(server.log_text())
    r = kit(env, "launch", "qwen", "--url", server.v1, "--", *SLIM, "-c", "-p",
            "And of Germany?", cwd=cwd)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr[-2000:]
    [(first, _)] = GENERATION.findall(server.log_text()[log_start:middle])
    [(second, cached)] = GENERATION.findall(server.log_text()[middle:])
    assert int(second) > int(first) and int(cached) >= int(first), (first, second, cached)
    merged = json.loads(settings.read_text())
    [ours] = [e for e in merged["modelProviders"]["openai"] if e["id"] == "local"]
    assert ours["baseUrl"] == server.v1
    assert ours["generationConfig"] == {"contextWindowSize": 8192,
                                        "samplingParams": {"max_tokens": 2048}}
    assert not settings.with_name("settings.json.orig").exists()  # qwen did not rewrite it

    r = kit(env, "harness", "remove", "qwen")
    assert r.returncode == 0, r.stderr
    assert "removed mlx-kit's entries" in r.stdout
    assert settings.read_text() == USER_SETTINGS  # byte-identical


def test_qwen_shows_the_servers_context_error_and_remove_survives_its_rewrite(server, tmp_path):
    """Plain `qwen -p` (no flags: the merged settings alone select our server) with Qwen's
    full prompt: over the starter's window, the server answers 400 and qwen prints that
    error and fails. The user's file had no "$version", so qwen rewrote it; removal takes
    out our keys by key and puts back the user's model and auth type."""
    qwen = require_binary("qwen")
    env = qwen_env(tmp_path)
    user = json.loads(USER_SETTINGS)
    del user["$version"]
    settings = tmp_path / ".qwen" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps(user) + "\n")
    assert kit(env, "harness", "install", "qwen", "--url", server.v1).returncode == 0
    log_start = len(server.log_text())

    r = subprocess.run([qwen, "-p", QUESTION], env=env, cwd=project(tmp_path, memory=True),
                       text=True, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)

    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "API Error: 400 This model's maximum context length is 8192 tokens" in r.stderr
    assert '"POST /v1/chat/completions HTTP/1.1" 400' in server.log_text()[log_start:]
    rewritten = json.loads(settings.read_text())
    assert rewritten["$version"] == 4  # qwen migrated (rewrote) the file
    # 0.15.10 kept the file it migrated as settings.json.orig; 0.24.4 keeps none
    orig = settings.with_name("settings.json.orig")
    kept = orig.read_bytes() if orig.is_file() else None

    r = kit(env, "harness", "remove", "qwen")
    assert r.returncode == 0, r.stderr
    after = json.loads(settings.read_text())
    assert after == {**user, "$version": 4}
    assert (orig.read_bytes() if orig.is_file() else None) == kept  # qwen's, left alone
