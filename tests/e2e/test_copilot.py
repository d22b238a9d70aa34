"""GitHub Copilot CLI (real binary) through `mlx-kit launch copilot -- -p "..."`: launch
sets Copilot's bring-your-own-key variables (COPILOT_PROVIDER_BASE_URL and the others, the
key among them, never on the command line) and COPILOT_OFFLINE=true, so Copilot answers
through our server's Responses route with no GitHub login, in a throwaway HOME.

Why the test passes `--available-tools=none`: Copilot counts its static context (system
prompt plus tool schemas) before it sends anything, and with its 17 built-in tools that is
~10,300 tokens, over the starter's 8,192-token window: it sends no request and prints "No
response was returned" (its session log: compaction_static_context_blocked). Its own
`--available-tools` flag keeps only the tools it names; naming none that exists leaves no
tools, and the system prompt shrinks with them (~1,800 tokens sent). See
docs/agents/copilot.md.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.e2e.warnings import assert_no_config_warnings
from tests.helpers import assert_served, clean_env, require_binary, requests_served, run_kit


QUESTION = "What is the capital of France?"
#: Copilot's own headless switches: -p (one prompt, then exit), -s (the answer only),
#: --allow-all (no permission prompts; required without a terminal), and no tools.
HEADLESS = ["-p", QUESTION, "-s", "--allow-all", "--available-tools=none"]


def copilot_env(home: Path) -> dict[str, str]:
    """A throwaway HOME, and none of the caller's Copilot or GitHub settings (a token
    there would make Copilot try its GitHub login)."""
    env = clean_env(home)
    for key in list(env):
        if key.startswith(("COPILOT_", "GH_", "GITHUB_")):
            del env[key]
    return env


def test_copilot_answers_through_our_server(server, tmp_path):
    require_binary("copilot")
    env = copilot_env(tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    before, log_start = requests_served(server), len(server.log_text())

    r = run_kit(env, "launch", "copilot", "--url", server.v1, "--", *HEADLESS, cwd=project,
                timeout=400, stdin=subprocess.DEVNULL)

    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert_no_config_warnings("copilot", r.stdout, r.stderr)
    answer = r.stdout.strip()
    assert "Paris" in answer  # the starter, greedy, said "The capital of France is Paris."
    assert_served(server, before, answer, at_least=True)
    # the wire API launch chose; mlx-kit wrote no file (Copilot has none for a provider)
    assert '"POST /v1/responses HTTP/1.1" 200' in server.log_text()[log_start:]
    assert "configured copilot" not in r.stderr
