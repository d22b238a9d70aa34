"""Kilo Code CLI (real binary) through `mlx-kit launch kilo -- run --auto "..."`: the
drop-in config reaches Kilo through KILO_CONFIG, Kilo answers with our server's text, it
found nothing to complain about in our file (`kilo debug config` resolves it with every key
of ours kept), and removal leaves the user's own Kilo config untouched.

Why the test runs an agent of the project's own (`--agent answer`): with Kilo's default
agent ("code") the first request is ~3,100 starter tokens (its system prompt; the starter's
template does not render the tool schemas), inside the 8,192-token window, but the starter
does not stop after it: it was still writing 673 tokens later, towards the 2,048 of
`limit.output`, ~30 minutes on 2 CPU cores. Kilo's own switch for this is an agent file,
`.kilo/agent/<name>.md` in the project (a system prompt of its own, `permission` "*": deny
so it gets no tools) chosen with `--agent`: a ~580-token request answered in one sentence.
See docs/agents/kilo.md."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import json5

from tests.e2e.warnings import assert_no_config_warnings
from tests.helpers import assert_served, clean_env, require_binary, requests_served, run_kit


USER_CONFIG = '{\n  // my own kilo settings\n  "autoupdate": false,\n  "snapshot": false\n}\n'
#: The project's agent: a one-sentence answerer with no tools (Kilo's agent-file format).
ANSWER_AGENT = """---
description: Answers a question in one sentence, with no tools
mode: primary
permission:
  "*": deny
---
You are a helpful assistant. Answer in one sentence.
"""


def kilo_env(home: Path) -> dict[str, str]:
    """A throwaway HOME, and none of the caller's Kilo or opencode settings."""
    env = clean_env(home, MLX_KIT_LOG_LEVEL="debug")
    for key in list(env):
        if key.startswith(("KILO_", "KILOCODE_", "OPENCODE_")):
            del env[key]
    return env


def test_kilo_answers_through_our_server(server, tmp_path):
    kilo = require_binary("kilo")
    env = kilo_env(tmp_path)
    user_config = tmp_path / ".config" / "kilo" / "kilo.jsonc"
    user_config.parent.mkdir(parents=True)
    user_config.write_text(USER_CONFIG)
    project = tmp_path / "project"
    (project / ".kilo" / "agent").mkdir(parents=True)
    (project / ".kilo" / "agent" / "answer.md").write_text(ANSWER_AGENT)
    before = requests_served(server)

    # Kilo takes the project folder (where it finds .kilo/) from $PWD, as a shell sets it,
    # not from its working directory: with pytest's PWD it found no "answer" agent
    env["PWD"] = str(project)
    r = run_kit(env, "launch", "kilo", "--url", server.v1, "--", "run", "--auto",
                "--agent", "answer", "What is the capital of France?", cwd=project,
                timeout=500, stdin=subprocess.DEVNULL)

    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert_no_config_warnings("kilo", r.stdout, r.stderr)
    assert "Paris" in r.stdout
    assert_served(server, before, at_least=True)  # (one request here: no title request)
    ours = tmp_path / ".config" / "kilo" / "mlx-kit.jsonc"
    config = json5.loads(ours.read_text())
    assert config["model"] == "mlx-kit/local"
    assert config["provider"]["mlx-kit"]["options"]["baseURL"] == server.v1
    assert config["provider"]["mlx-kit"]["models"]["local"]["limit"] == {"context": 8192,
                                                                         "output": 2048}

    # Kilo's own view of the file (its validator; no model call): loaded, every key kept
    shown = subprocess.run([kilo, "debug", "config"], env={**env, "KILO_CONFIG": str(ours)},
                           cwd=project, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
    assert shown.returncode == 0, shown.stderr[-2000:]
    resolved = json.loads(shown.stdout[shown.stdout.index("{"):])
    # Kilo drops keys it does not know without a word: ours must all be there, as written
    # (the key's {env:MLX_KIT_API_KEY} resolved: unset here, so empty)
    config["provider"]["mlx-kit"]["options"]["apiKey"] = ""
    assert resolved["provider"] == config["provider"]
    assert (resolved["model"], resolved["small_model"]) == ("mlx-kit/local",) * 2
    assert resolved["snapshot"] is False  # the user's own config still applies

    before_remove = user_config.read_text()
    # (Kilo itself may add to the user's file: 7.7.7 adds a bash permission on first run)
    assert "// my own kilo settings" in before_remove and '"snapshot"' in before_remove
    r = run_kit(env, "harness", "remove", "kilo", timeout=60)
    assert r.returncode == 0 and re.search(r"removed .*mlx-kit\.jsonc", r.stdout)
    assert not ours.exists()
    assert user_config.read_text() == before_remove
