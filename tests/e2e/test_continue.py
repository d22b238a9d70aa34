"""Continue's cn (real binary) through `mlx-kit launch continue -- -p ...`: the drop-in
config reaches cn through --config and cn prints the text our server generated; the IDE's
own ~/.continue/config.yaml is untouched. Against the keyed server: `launch` hands cn the
key (MLX_KIT_API_KEY), and no request of cn's goes without it."""

from __future__ import annotations

import subprocess

from ruamel.yaml import YAML

from tests.helpers import (TEST_KEY, assert_served, clean_env, refusals, require_binary,
                           requests_served, run_kit)
from tests.e2e.warnings import assert_no_config_warnings


USER_CONFIG = "# my IDE config\nname: mine\nversion: 0.0.1\nschema: v1\nmodels: []\n"


def test_continue_cli_answers_through_our_server(keyed_server, tmp_path):
    require_binary("cn")
    server = keyed_server
    env = clean_env(tmp_path, MLX_KIT_API_KEY=TEST_KEY)
    own = tmp_path / ".continue" / "config.yaml"
    own.parent.mkdir()
    own.write_text(USER_CONFIG)
    before, refused = requests_served(server), refusals(server)
    r = run_kit(env, "launch", "continue", "--url", server.v1, "--", "-p",
                "What is the capital of France?", cwd=tmp_path, timeout=400,
                stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-2000:]
    assert_no_config_warnings("continue", r.stdout, r.stderr)
    assert "Paris" in r.stdout
    assert_served(server, before, r.stdout)
    assert refusals(server) == refused, "a request of cn's went without the key"

    ours = tmp_path / ".continue" / "mlx-kit.yaml"
    config = YAML(typ="safe").load(ours.read_text())
    assert config["schema"] == "v1"
    [model] = config["models"]
    assert model["apiBase"] == server.v1 and model["model"] == "local"
    assert model["defaultCompletionOptions"] == {"contextLength": 8192, "maxTokens": 2048}

    assert run_kit(env, "harness", "remove", "continue", timeout=60).returncode == 0
    assert not ours.exists() and own.read_text() == USER_CONFIG
