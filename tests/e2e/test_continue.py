"""Continue's cn (real binary) through `mlx-kit launch continue -- -p ...`: the drop-in
config reaches cn through --config and cn prints the text our server generated; the IDE's
own ~/.continue/config.yaml is untouched."""

from __future__ import annotations

import subprocess
import sys

import httpx
from ruamel.yaml import YAML

from tests.conftest import clean_env, generated_texts, require_binary
from tests.e2e.warnings import assert_no_config_warnings


USER_CONFIG = "# my IDE config\nname: mine\nversion: 0.0.1\nschema: v1\nmodels: []\n"


def test_continue_cli_answers_through_our_server(server, tmp_path):
    require_binary("cn")
    env = clean_env(tmp_path)
    own = tmp_path / ".continue" / "config.yaml"
    own.parent.mkdir()
    own.write_text(USER_CONFIG)
    before = httpx.get(server.root + "/health").json()["requests_served"]
    r = subprocess.run([sys.executable, "-m", "kit", "launch", "continue", "--url", server.v1,
                        "--", "-p", "What is the capital of France?"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=400, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-2000:]
    assert_no_config_warnings("continue", r.stdout, r.stderr)
    assert "Paris" in r.stdout
    assert httpx.get(server.root + "/health").json()["requests_served"] == before + 1
    assert r.stdout.strip() in [t.strip() for t in generated_texts(server.log_text())]

    ours = tmp_path / ".continue" / "mlx-kit.yaml"
    config = YAML(typ="safe").load(ours.read_text())
    assert config["schema"] == "v1"
    [model] = config["models"]
    assert model["apiBase"] == server.v1 and model["model"] == "local"
    assert model["defaultCompletionOptions"] == {"contextLength": 8192, "maxTokens": 2048}

    assert subprocess.run([sys.executable, "-m", "kit", "harness", "remove", "continue"],
                          env=env, capture_output=True, timeout=60).returncode == 0
    assert not ours.exists() and own.read_text() == USER_CONFIG
