"""Gemini CLI (real binary, `gemini -p` headless) against the real server through
`mlx-kit launch gemini`, with a throwaway HOME holding a user's own ~/.gemini/settings.json:
our keys are merged in, gemini answers with text our server generated over the Gemini API
(POST /v1beta/models/local:streamGenerateContent?alt=sse), it prints no warning about our
config, and `harness remove gemini` gives the file back byte for byte.

Why the run is slimmed: Gemini CLI's own system prompt is ~6,600 starter tokens (minutes of
prefill on a shared 2-core CPU), so GEMINI_SYSTEM_MD points it at a one-line prompt (its
own switch). It sends temperature 1 and no maxOutputTokens, so the user's settings in this
test carry a model-config override for `local` (temperature 0, 24 output tokens): a
bounded, deterministic answer. `--skip-trust` is the headless run's own flag (without it,
or a trusted folder, gemini exits 55).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import (assert_served, clean_env, require_binary, requests_served, run_kit,
                           wait_until)


#: The user's own settings: Google login, their model, UI settings and a model-config
#: override for `local` (Gemini CLI's modelConfigs.customOverrides).
USER_SETTINGS = json.dumps({
    "security": {"auth": {"selectedType": "oauth-personal"}},
    "model": {"name": "gemini-2.5-pro"},
    "ui": {"theme": "GitHub"},
    "general": {"vimMode": True},
    "modelConfigs": {"customOverrides": [{"match": {"model": "local"}, "modelConfig": {
        "generateContentConfig": {"temperature": 0, "maxOutputTokens": 24}}}]},
}, indent=2)
QUESTION = "What is the capital of France?"

#: stderr lines that are about this machine (or mlx-kit's own progress), not our config.
ENVIRONMENT_LINES = ("256-color support not detected", "Ripgrep is not available",
                     "[STARTUP]", "configured gemini: ", "mlx-kit server ")
CONFIG_WARNING = re.compile(r"warn|error|invalid|unknown|deprecat|ignor|recogni|not "
                            r"supported|setting", re.I)


def gemini_env(home: Path, **extra: str) -> dict[str, str]:
    """A throwaway HOME and none of the caller's Gemini or Google settings."""
    env = clean_env(home, **extra)
    for key in list(env):
        if key.startswith(("GEMINI_", "GOOGLE_")) and key not in extra:
            del env[key]
    return env


def config_warnings(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if CONFIG_WARNING.search(ln)
            and not any(s in ln for s in ENVIRONMENT_LINES)]


def test_gemini_answers_through_our_server_and_remove_restores_the_file(server, tmp_path):
    require_binary("gemini")
    system_md = tmp_path / "system.md"
    system_md.write_text("You are a helpful assistant. Answer in one sentence.\n")
    env = gemini_env(tmp_path, GEMINI_SYSTEM_MD=str(system_md))
    settings = tmp_path / ".gemini" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(USER_SETTINGS)
    project = tmp_path / "project"
    project.mkdir()
    before = requests_served(server)
    log_start = len(server.log_text())

    r = run_kit(env, "launch", "gemini", "--url", server.v1, "--", "--skip-trust", "-p",
                QUESTION, cwd=project, timeout=300, stdin=subprocess.DEVNULL)

    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    answer = r.stdout.strip()
    assert answer
    assert_served(server, before, answer)
    # The access line is the HTTP process's, written apart from the engine's lines: wait
    # for it. Its path has been seen with the colon both encoded (%3A) and not, on the same
    # pinned Gemini CLI and uvicorn: either spelling is the request.
    streamed = re.compile(r"POST /v1beta/models/local(%3A|:)streamGenerateContent\?alt=sse")
    try:
        wait_until(lambda: streamed.search(server.log_text()[log_start:]), timeout=30,
                   what="the streamGenerateContent access line in the server's log")
    except TimeoutError:
        access = [ln for ln in server.log_text().splitlines() if "uvicorn.access" in ln]
        pytest.fail("no streamGenerateContent request in the server's access log; its last "
                    "access lines: " + "\n".join(access[-8:]))
    assert config_warnings(r.stderr) == [], r.stderr
    merged = json.loads(settings.read_text())
    assert merged["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert merged["model"]["name"] == "local" and merged["privacy"] == {
        "usageStatisticsEnabled": False}
    assert merged["ui"] == {"theme": "GitHub"} and merged["modelConfigs"] == json.loads(
        USER_SETTINGS)["modelConfigs"]  # the user's own keys stay

    r = run_kit(env, "harness", "remove", "gemini", timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert settings.read_text() == USER_SETTINGS  # byte-identical
