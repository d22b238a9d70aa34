"""Cline CLI (real binary) through `mlx-kit launch cline -- --json "..."` against the keyed
server, with a throwaway HOME holding the user's own ~/.cline/data/settings/providers.json:
launch merges our provider in and hands Cline the key in its environment ($OPENAI_API_KEY,
never on the command line, never in the file), Cline answers with the text our server
generated, and `harness remove cline` gives back the user's exact bytes although Cline
wrote the whole file again during the run (it stamps the entry's updatedAt each time).

Cline's first request fits the starter's 8,192-token window as it is (915 starter tokens
of system prompt and question; its tool schemas, which the starter's template does not
render, are not counted), so no switch slims it. The test runs Cline with
CLINE_SESSION_BACKEND_MODE=local: by default Cline starts a background "hub" daemon that
outlives the run (a test must leave no process behind), and CLINE_NO_AUTO_UPDATE=1 (no
update check against npm). See docs/agents/cline.md.
"""

from __future__ import annotations

import json
import subprocess

from tests.helpers import (TEST_KEY, assert_served, clean_env, refusals, require_binary,
                           requests_served, run_kit)
from tests.e2e.warnings import assert_no_config_warnings
from tests.reliability.test_harness_manifest import CLINE_PROVIDERS


#: Cline in one process (no hub daemon left behind) and no update check (module docstring).
CLINE_RUN_ENV = {"CLINE_SESSION_BACKEND_MODE": "local", "CLINE_NO_AUTO_UPDATE": "1"}


def cline_env(home) -> dict[str, str]:
    """A throwaway HOME, the server's key, and none of the caller's Cline/OpenAI settings."""
    env = clean_env(home, MLX_KIT_API_KEY=TEST_KEY)
    for key in list(env):
        if key.startswith(("CLINE_", "OPENAI_")):
            del env[key]
    env.update(CLINE_RUN_ENV)
    return env


def test_cline_answers_through_our_server_and_remove_restores_the_file(keyed_server, tmp_path):
    require_binary("cline")
    server = keyed_server
    env = cline_env(tmp_path)
    providers = tmp_path / ".cline" / "data" / "settings" / "providers.json"
    providers.parent.mkdir(parents=True)
    providers.write_text(CLINE_PROVIDERS)
    project = tmp_path / "project"
    project.mkdir()
    before, refused = requests_served(server), refusals(server)

    r = run_kit(env, "launch", "cline", "--url", server.v1, "--", "--json",
                "What is the capital of France?", cwd=project, timeout=600,
                stdin=subprocess.DEVNULL)

    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert_no_config_warnings("cline", r.stdout, r.stderr)
    events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    [result] = [e for e in events if e.get("type") == "run_result"]
    assert result["finishReason"] == "completed"
    assert result["model"]["id"] == "local" and result["model"]["provider"] == "openai-compatible"
    assert result["model"]["info"]["contextWindow"] == 8192  # the window we wrote
    assert "Paris" in result["text"]
    assert_served(server, before, result["text"])
    assert refusals(server) == refused, "a request of Cline's went without the key"
    written = providers.read_text()
    assert TEST_KEY not in written  # Cline kept the key out of the file too
    entry = json.loads(written)["providers"]["openai-compatible"]
    assert entry["settings"]["baseUrl"] == server.v1
    assert entry["updatedAt"] != "2026-01-01T00:00:00.000Z"  # Cline stamped it

    r = run_kit(env, "harness", "remove", "cline", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "removed mlx-kit's entries" in r.stdout
    assert providers.read_text() == CLINE_PROVIDERS  # byte-identical
