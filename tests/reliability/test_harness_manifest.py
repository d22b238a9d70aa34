"""Issue 11, item 1 (and issue 13's litter): a damaged harness manifest never costs the user
a byte and never blocks a command. Each test runs the real CLI (``python -m kit``) on a
throwaway HOME against the agents' real file layouts; no agent binary is needed except a
stand-in ``pi`` for launch (a shell script: the real pi is not what is under test).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import agentless_path, clean_env, free_port, run_kit, table_rows

QWEN_SETTINGS = """{
  "ui": {"theme": "Dracula"},
  "mcpServers": {
    "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem"]}
  },
  "model": {"name": "qwen3-coder-plus"}
}
"""
ZED_SETTINGS = """// Zed settings
{
  "theme": "One Dark", // mine
  "language_models": {
    "openai_compatible": {
      "Together AI": {"api_url": "https://api.together.xyz/v1", "available_models": []},
    },
  },
}
"""
CRUSH_SETTINGS = '{\n  "options": {"debug": true},\n  "providers": {\n    "openrouter": {"api_key": "$OR_KEY"}\n  }\n}\n'
#: Cline's providers.json as Cline 3.0.65 writes it (JSON, 2 spaces, a newline at the end):
#: the user's own Anthropic key and their own OpenAI-compatible provider, which ours
#: replaces (Cline keeps one entry per provider id) and removal puts back.
CLINE_PROVIDERS = """{
  "version": 1,
  "lastUsedProvider": "anthropic",
  "modes": {},
  "providers": {
    "anthropic": {
      "settings": {
        "provider": "anthropic",
        "apiKey": "sk-ant-the-users-own",
        "model": "claude-sonnet-4-6"
      },
      "updatedAt": "2026-11-30T09:12:44.118Z",
      "tokenSource": "manual"
    },
    "openai-compatible": {
      "settings": {
        "provider": "openai-compatible",
        "model": "qwen3-coder",
        "baseUrl": "http://gpu-box:1234/v1"
      },
      "updatedAt": "2026-11-29T17:02:10.004Z",
      "tokenSource": "manual"
    }
  }
}
"""
#: Droid's settings.json with the user's own custom model and preferences.
DROID_SETTINGS = """{
  "diffMode": "unified",
  "cloudSessionSync": false,
  "customModels": [
    {
      "model": "qwen3-coder:30b",
      "displayName": "Ollama Qwen3 Coder",
      "baseUrl": "http://localhost:11434/v1",
      "apiKey": "${OLLAMA_KEY}",
      "provider": "generic-chat-completion-api",
      "maxOutputTokens": 16384
    }
  ]
}
"""
LLM_MODELS = "# my models\n- model_id: gpt-local\n  model_name: gpt-4o-mini\n  api_base: http://mine:8000/v1\n"

#: agent -> (its shared file below HOME, the user's own content)
USER_FILES = {
    "qwen": (".qwen/settings.json", QWEN_SETTINGS),
    "zed": (".config/zed/settings.json", ZED_SETTINGS),
    "crush": (".config/crush/crush.json", CRUSH_SETTINGS),
    "llm": (".config/io.datasette.llm/extra-openai-models.yaml", LLM_MODELS),
    "cline": (".cline/data/settings/providers.json", CLINE_PROVIDERS),
    "droid": (".factory/settings.json", DROID_SETTINGS),
}


def kit(home: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
    """:func:`run_kit` with an empty HF home and a wide table (one line per agent); no
    agent binary on PATH but ``path``'s (:func:`tests.helpers.agentless_path`)."""
    env = clean_env(home, home / "hf", COLUMNS="250", PATH=path or agentless_path())
    return run_kit(env, *args)


def data_dir(home: Path) -> Path:
    return home / ".local" / "share" / "mlx-kit"


def manifest(home: Path) -> Path:
    return data_dir(home) / "manifest.json"


def user_file(home: Path, agent: str) -> Path:
    rel, text = USER_FILES[agent]
    path = home / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def damage(home: Path, how: str) -> None:
    path = manifest(home)
    if how == "corrupt":
        path.write_text('{"agents": {"qwen": ')
    elif how == "moved-aside":  # what the old error's own hint said to do
        os.replace(path, path.with_name("manifest.json.mine"))
        path.with_name("manifest.json.prev").unlink(missing_ok=True)
    elif how == "garbage":
        path.write_bytes(b"\x00\xff garbage \x89PNG")
        path.with_name("manifest.json.prev").unlink(missing_ok=True)


@pytest.mark.parametrize("how", ["corrupt", "moved-aside", "garbage"])
def test_remove_with_a_broken_manifest_restores_the_users_qwen_settings(tmp_path, dead_url,
                                                                         how):
    home = tmp_path
    settings = user_file(home, "qwen")
    assert kit(home, "harness", "install", "qwen", "--url", dead_url).returncode == 0
    assert "mlx-kit" in settings.read_text()
    damage(home, how)

    r = kit(home, "harness", "remove", "qwen")

    assert r.returncode == 0, r.stderr
    assert settings.read_text() == QWEN_SETTINGS  # the theme and MCP servers: every byte
    assert f"removed mlx-kit's entries from {settings}" in r.stdout  # says what it did
    assert "nothing of mlx-kit's" not in r.stdout


@pytest.mark.parametrize("agent", ["crush", "zed", "llm", "cline", "droid"])
def test_remove_with_a_corrupt_manifest_takes_our_entries_out_of_the_users_file(
        tmp_path, dead_url, agent):
    home = tmp_path
    path = user_file(home, agent)
    assert kit(home, "harness", "install", agent, "--url", dead_url).returncode == 0
    assert dead_url in path.read_text()
    damage(home, "garbage")

    r = kit(home, "harness", "remove", agent)

    assert r.returncode == 0, r.stderr
    assert path.read_text() == USER_FILES[agent][1]
    assert f"removed mlx-kit's entries from {path}" in r.stdout
    assert "corrupt" in r.stderr  # warned, and went on


def test_remove_with_a_corrupt_manifest_keeps_a_file_the_user_had_at_our_path(tmp_path,
                                                                              dead_url):
    """A forced install replaced the user's own codex profile: with the manifest gone, the
    marked file is ours (deleted) and the user's original comes back from the backup."""
    home = tmp_path
    profile = home / ".codex" / "mlx-kit.config.toml"
    profile.parent.mkdir(parents=True)
    profile.write_text('model = "mine"\n')
    assert kit(home, "harness", "install", "codex", "--url", dead_url,
               "--force").returncode == 0
    damage(home, "moved-aside")

    r = kit(home, "harness", "remove", "codex")

    assert r.returncode == 0, r.stderr
    assert profile.read_text() == 'model = "mine"\n'
    assert f"restored your own {profile}" in r.stdout


def test_remove_with_a_manifest_from_an_earlier_install_keeps_the_users_later_values(
        tmp_path, dead_url):
    """A stale manifest (copied back from before a remove and reinstall) names values the
    user has since changed: it is not trusted, and the user's current values survive."""
    home = tmp_path
    settings = user_file(home, "qwen")
    assert kit(home, "harness", "install", "qwen", "--url", dead_url).returncode == 0
    old = manifest(home).read_bytes()
    assert kit(home, "harness", "remove", "qwen").returncode == 0
    later = QWEN_SETTINGS.replace("qwen3-coder-plus", "qwen3-max")
    settings.write_text(later)
    assert kit(home, "harness", "install", "qwen", "--url", dead_url).returncode == 0
    manifest(home).write_bytes(old)

    r = kit(home, "harness", "remove", "qwen")

    assert r.returncode == 0, r.stderr
    assert settings.read_text() == later


def test_a_truncated_manifest_falls_back_to_its_previous_generation(tmp_path, dead_url):
    home = tmp_path
    assert kit(home, "harness", "install", "pi", "--url", dead_url).returncode == 0
    assert kit(home, "harness", "install", "codex", "--url", dead_url).returncode == 0
    body = manifest(home).read_bytes()
    manifest(home).write_bytes(body[:len(body) // 2])

    r = kit(home, "harness", "list")

    assert r.returncode == 0
    assert "previous generation" in r.stderr
    assert table_rows(r.stdout)["pi"][1] == "yes"


def test_read_commands_with_a_corrupt_manifest_warn_and_exit_0(tmp_path, dead_url):
    home = tmp_path
    assert kit(home, "harness", "install", "pi", "--url", dead_url).returncode == 0
    damage(home, "garbage")
    for args in (["harness", "list"], ["harness", "status"], ["harness", "show", "pi"]):
        r = kit(home, *args, "--url", dead_url) if args[1] != "list" else kit(home, *args)
        assert r.returncode == 0, (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert manifest(home).read_bytes() == b"\x00\xff garbage \x89PNG"  # reads change nothing


def test_harness_list_with_a_corrupt_manifest_still_sees_a_merged_agent(tmp_path, dead_url):
    home = tmp_path
    user_file(home, "qwen")
    assert kit(home, "harness", "install", "qwen", "--url", dead_url).returncode == 0
    damage(home, "garbage")

    r = kit(home, "harness", "list")

    assert r.returncode == 0 and "corrupt" in r.stderr
    assert table_rows(r.stdout)["qwen"][1] == "yes"


def test_launch_with_a_corrupt_manifest_warns_and_runs_the_agent(tmp_path, server):
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_pi = bin_dir / "pi"
    fake_pi.write_text("#!/bin/sh\necho fake pi ran \"$@\"\n")
    fake_pi.chmod(0o755)
    manifest(home).parent.mkdir(parents=True)
    manifest(home).write_text("{not json")

    r = kit(home, "launch", "pi", "--url", server.root,
            path=f"{bin_dir}:{os.environ['PATH']}")

    assert r.returncode == 0, r.stderr
    assert "fake pi ran --provider mlx-kit --model local" in r.stdout
    assert "corrupt" in r.stderr and "kept as" in r.stderr
    [aside] = manifest(home).parent.glob("manifest.json.broken-*")
    assert aside.read_text() == "{not json"  # the user's evidence, kept
    assert (home / ".pi" / "agent" / "extensions" / "mlx-kit.ts").is_file()
    assert "pi" in json.loads(manifest(home).read_text())["agents"]


def test_remove_of_the_last_agent_leaves_no_litter(tmp_path, dead_url):
    home = tmp_path
    user_file(home, "qwen")
    for agent in ("pi", "qwen", "codex"):
        assert kit(home, "harness", "install", agent, "--url", dead_url).returncode == 0
    assert (data_dir(home) / "backups").is_dir()

    assert kit(home, "harness", "remove", "--all").returncode == 0

    left = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert not [p for p in left if "mlx-kit" in p], left  # no manifest, lock, backups
    assert (home / ".qwen" / "settings.json").read_text() == QWEN_SETTINGS


def test_remove_all_with_a_corrupt_manifest_finds_every_agent_by_its_marks(tmp_path,
                                                                           dead_url):
    home = tmp_path
    settings = user_file(home, "qwen")
    for agent in ("pi", "qwen"):
        assert kit(home, "harness", "install", agent, "--url", dead_url).returncode == 0
    damage(home, "garbage")

    r = kit(home, "harness", "remove", "--all")

    assert r.returncode == 0, r.stderr
    assert settings.read_text() == QWEN_SETTINGS
    assert not (home / ".pi" / "agent" / "extensions" / "mlx-kit.ts").exists()


def test_a_marked_entry_the_user_kept_after_removal_is_not_removed_again(tmp_path, dead_url):
    """After a removal, a copy of our llm entry the user put back (marker and all) is theirs:
    with no receipt of an install, removal leaves it and says why; --force removes it."""
    home = tmp_path
    path = user_file(home, "llm")
    assert kit(home, "harness", "install", "llm", "--url", dead_url).returncode == 0
    ours = path.read_text()
    assert kit(home, "harness", "remove", "llm").returncode == 0
    path.write_text(ours)  # the user keeps our entry on purpose

    r = kit(home, "harness", "remove", "llm")

    assert r.returncode == 0
    assert path.read_text() == ours
    assert "no record of installing them" in r.stdout and "--force" in r.stdout
    assert kit(home, "harness", "remove", "llm", "--force").returncode == 0
    assert "model_id: local" not in path.read_text() and "gpt-local" in path.read_text()
