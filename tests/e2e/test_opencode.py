"""opencode (real binary) through `mlx-kit launch opencode -- run "..."`: the drop-in
config reaches opencode through OPENCODE_CONFIG, opencode answers with our server's text,
and removal leaves the user's own opencode config untouched."""

from __future__ import annotations

import json
import re

from tests.helpers import assert_served, clean_env, require_binary, requests_served, run_kit
from tests.e2e.warnings import assert_no_config_warnings


USER_CONFIG = '{\n  // my own opencode settings\n  "theme": "tokyonight",\n  "autoupdate": false\n}\n'


def test_opencode_answers_through_our_server(server, tmp_path):
    require_binary("opencode")
    env = clean_env(tmp_path, MLX_KIT_LOG_LEVEL="debug")
    user_config = tmp_path / ".config" / "opencode" / "opencode.jsonc"
    user_config.parent.mkdir(parents=True)
    user_config.write_text(USER_CONFIG)
    project = tmp_path / "project"
    project.mkdir()
    before = requests_served(server)

    r = run_kit(env, "launch", "opencode", "--url", server.v1, "--", "run",
                "What is the capital of France?", cwd=project, timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    assert_no_config_warnings("opencode", r.stdout, r.stderr)
    assert "Paris" in r.stdout
    # opencode sent its main request (and a title request) to our server
    assert_served(server, before, at_least=True)
    ours = tmp_path / ".config" / "opencode" / "mlx-kit.jsonc"
    config = json.loads("\n".join(ours.read_text().splitlines()[3:]))
    assert config["model"] == "mlx-kit/local"
    assert config["provider"]["mlx-kit"]["options"]["baseURL"] == server.v1
    assert config["provider"]["mlx-kit"]["models"]["local"]["limit"] == {"context": 8192,
                                                                         "output": 2048}

    # opencode itself adds "$schema" to the user's file; mlx-kit never touches it
    before_remove = user_config.read_text()
    assert "// my own opencode settings" in before_remove and '"tokyonight"' in before_remove
    r = run_kit(env, "harness", "remove", "opencode", timeout=60)
    assert r.returncode == 0 and re.search(r"removed .*mlx-kit\.jsonc", r.stdout)
    assert not ours.exists()
    assert user_config.read_text() == before_remove
