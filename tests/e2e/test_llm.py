"""llm (real binary, separate venv) against the real server: `harness install llm` merges
one entry into the user's own extra-openai-models.yaml, `llm -m local` answers through our
server, `harness remove llm` puts the file back byte for byte."""

from __future__ import annotations

import subprocess

from tests.helpers import assert_served, clean_env, require_binary, requests_served, run_kit
from tests.e2e.warnings import assert_no_config_warnings


USER_YAML = """\
# my own models -- mlx-kit must keep this comment
- model_id: my-gpt  # an entry of mine
  model_name: gpt-4o-mini
  api_base: "https://example.invalid/v1"
  aliases: ["g"]
"""


def test_llm_answers_through_our_server_and_remove_restores_the_file(server, tmp_path):
    llm = require_binary("llm")
    env = clean_env(tmp_path, LLM_USER_PATH=str(tmp_path / "llm-home"))
    config = tmp_path / "llm-home" / "extra-openai-models.yaml"
    config.parent.mkdir()
    config.write_text(USER_YAML)
    r = run_kit(env, "harness", "install", "llm", "--url", server.v1)
    assert r.returncode == 0, r.stderr
    merged = config.read_text()
    assert merged.startswith(USER_YAML)  # the user's entry, comments and all, first
    assert 'model_id: "local"' in merged and server.v1 in merged

    models = subprocess.run([llm, "models"], env=env, text=True, capture_output=True, timeout=120)
    assert "local" in models.stdout and "my-gpt" in models.stdout

    before = requests_served(server)
    answer = subprocess.run([llm, "-m", "local", "--no-log", "What is the capital of France?"],
                            env=env, text=True, capture_output=True, timeout=180)
    assert answer.returncode == 0, answer.stderr
    assert_no_config_warnings("llm", answer.stdout, answer.stderr, models.stderr)
    assert "Paris" in answer.stdout
    assert_served(server, before)

    r = run_kit(env, "harness", "remove", "llm")
    assert r.returncode == 0, r.stderr
    assert "removed mlx-kit's entries" in r.stdout
    assert config.read_text() == USER_YAML  # byte-identical


def test_llm_config_created_by_install_is_deleted_by_remove(tmp_path):
    env = clean_env(tmp_path, LLM_USER_PATH=str(tmp_path / "llm-home"))
    assert run_kit(env, "harness", "install", "llm", "--url", "http://127.0.0.1:9").returncode == 0
    config = tmp_path / "llm-home" / "extra-openai-models.yaml"
    assert config.is_file()
    assert run_kit(env, "harness", "remove", "llm").returncode == 0
    assert not (tmp_path / "llm-home").exists()
