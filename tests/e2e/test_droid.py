"""Factory Droid (real binary) through `mlx-kit launch droid -- exec -m custom:mlx-kit-local-0
-o json "..."` against the keyed server, with a throwaway HOME holding the user's own
~/.factory/settings.json: launch merges our custom model in, Droid expands the entry's
"${MLX_KIT_API_KEY}" from its environment (the key is never in the file or on a command
line), answers with the text our server generated, and `harness remove droid` gives back
the user's exact bytes.

Droid runs custom ("bring your own key") models without a Factory account: no login, no
FACTORY_API_KEY. Its first request is ~2,980 starter tokens (system prompt and question;
the tool schemas are not rendered by the starter's template), inside the 8,192-token
window, so nothing is slimmed; Droid has no switch that replaces its system prompt
(--append-system-prompt only adds). See docs/agents/droid.md.
"""

from __future__ import annotations

import json
import subprocess

from tests.helpers import (TEST_KEY, assert_served, clean_env, refusals, require_binary,
                           requests_served, run_kit)
from tests.e2e.warnings import assert_no_config_warnings
from tests.reliability.test_harness_manifest import DROID_SETTINGS

#: Droid's headless run on our custom model, one JSON result (it names the session).
DROID_EXEC = ("exec", "-m", "custom:mlx-kit-local-0", "-o", "json")


def test_droid_answers_through_our_server_and_remove_restores_the_file(keyed_server, tmp_path):
    require_binary("droid")
    server = keyed_server
    env = clean_env(tmp_path, MLX_KIT_API_KEY=TEST_KEY)
    for key in list(env):
        if key.startswith("FACTORY_"):  # no Factory account or settings of the caller's
            del env[key]
    settings = tmp_path / ".factory" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(DROID_SETTINGS)
    project = tmp_path / "project"
    project.mkdir()
    before, refused = requests_served(server), refusals(server)

    r = run_kit(env, "launch", "droid", "--url", server.v1, "--", *DROID_EXEC,
                "What is the capital of France?",
                cwd=project, timeout=600, stdin=subprocess.DEVNULL)

    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    assert_no_config_warnings("droid", r.stdout, r.stderr)
    [result] = [json.loads(line) for line in r.stdout.splitlines()
                if line.startswith("{") and json.loads(line).get("type") == "result"]
    # Whether the starter (135M) says "Paris" under Droid's large prompt is not stable: the
    # same Droid, server and flags answered "#France #Amsterdam" on 2026-12-05 after
    # passing before (Droid's prompt has per-run text). What is asserted is that the
    # answer is the server's text, not that it is right.
    assert result["is_error"] is False and result["result"].strip()
    assert_served(server, before, result["result"])
    assert refusals(server) == refused, "a request of Droid's went without the key"
    [mine, ours] = json.loads(settings.read_text())["customModels"]
    assert ours["baseUrl"] == server.v1 and ours["apiKey"] == "${MLX_KIT_API_KEY}"

    r = run_kit(env, "harness", "remove", "droid", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "removed mlx-kit's entries" in r.stdout
    assert settings.read_text() == DROID_SETTINGS  # byte-identical
