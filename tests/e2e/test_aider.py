"""aider (real binary, its own venv) through `mlx-kit launch aider -- --message ...`: the
three drop-in files reach aider through flags, aider knows the context window (no
"Unknown context window" warning), sends its request to our server and prints its text.
Against the keyed server: `launch` hands aider the key (MLX_KIT_API_KEY), no request of
aider's goes without it."""

from __future__ import annotations

import re
import subprocess

from tests.helpers import TEST_KEY, assert_served, clean_env, generated_texts, refusals
from tests.helpers import require_binary, requests_served, run_kit
from tests.e2e.warnings import assert_no_config_warnings


def test_aider_answers_through_our_server(keyed_server, tmp_path):
    require_binary("aider")
    server = keyed_server
    env = clean_env(tmp_path, MLX_KIT_LOG_LEVEL="debug", MLX_KIT_API_KEY=TEST_KEY)
    project = tmp_path / "project"
    project.mkdir()
    before, refused = requests_served(server), refusals(server)
    r = run_kit(env, "launch", "aider", "--url", server.v1, "--",
                "--message", "What is the capital of France?", "--yes-always",
                "--no-git", "--no-pretty", "--no-stream",
                cwd=project, timeout=400, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-2000:]
    assert_no_config_warnings("aider", r.stdout, r.stderr)
    out = r.stdout + r.stderr
    assert "Model: openai/local" in out
    assert "Unknown context window" not in out and "unknown" not in out.lower().split("model:")[0]
    # aider exits 0 even when a request fails: the server must have answered it
    assert_served(server, before)
    assert refusals(server) == refused, "a request of aider's went without the key"
    texts = generated_texts(server.log_text())
    assert texts and texts[-1].strip() and texts[-1].strip()[:20] in out
    assert re.search(r"Tokens: \d+ sent, \d+ received", out)

    r = run_kit(env, "harness", "remove", "aider", timeout=60)
    assert r.returncode == 0
    assert not (tmp_path / ".config" / "mlx-kit").exists()  # only our folder, now empty, goes
