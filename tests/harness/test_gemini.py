"""Gemini CLI's spec and template, without the binary: our keys merge into the user's own
~/.gemini/settings.json (comments and every other byte kept) and come out by key, giving
back the exact bytes; the launch points Gemini CLI at the server root. tests/e2e/test_gemini.py
runs the real gemini."""

from __future__ import annotations

import json
from pathlib import Path

import json5
import pytest

from kit.harness import install as hi
from kit.harness import manifest
from kit.harness.render import context, render
from kit.harness.spec_loader import load_spec
from kit.urls import parse_url

MODELS = [{"id": "local", "name": "local", "model": "org/My-Model-4bit", "context_window": 32768,
           "max_tokens": 4096, "capabilities": {"tools": True, "reasoning": False,
                                                "vision": False}}]
OUR_KEYS = {"security.auth.selectedType", "model.name", "privacy.usageStatisticsEnabled"}

#: A user's settings.json with comments (Gemini CLI strips them when it reads the file).
USER_SETTINGS = """{
  // my Gemini CLI settings -- mlx-kit must keep this comment
  "security": { "auth": { "selectedType": "oauth-personal" } },
  "model": { "name": "gemini-2.5-pro", "maxSessionTurns": 40 },
  "ui": { "theme": "GitHub" },
  "general": { "vimMode": true },
}
"""


@pytest.fixture
def gemini(monkeypatch):
    monkeypatch.setattr(hi, "baked_models", lambda url: (MODELS, "test models"))
    return load_spec("gemini")


@pytest.fixture
def settings(home) -> Path:
    return home / ".gemini" / "settings.json"


def test_render_selects_the_api_key_auth_type_and_the_local_model():
    text = render(load_spec("gemini"), context("http://127.0.0.1:8090/v1", MODELS, "t"))
    assert json.loads(text["settings.json"]) == {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "model": {"name": "local"}, "privacy": {"usageStatisticsEnabled": False}}


def test_launch_sets_the_server_root_and_a_key_only_where_the_user_has_none():
    spec = load_spec("gemini")
    argv, env = spec.launch_command("/bin/gemini", ["-p", "hi"],
                                    root_url="http://127.0.0.1:8090", environ={})
    assert argv == ["/bin/gemini", "-m", "local", "-p", "hi"]
    assert env == {"GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:8090",  # the root, no /v1
                   "GEMINI_API_KEY": "mlx-kit"}
    _, env = spec.launch_command("/bin/gemini", [], root_url="http://127.0.0.1:8090",
                                 environ={"GEMINI_API_KEY": "the-servers-key"})
    assert env == {"GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:8090"}


def test_gemini_cli_home_moves_the_config_dir(tmp_path):
    spec = load_spec("gemini")
    assert spec.config_dir({"GEMINI_CLI_HOME": str(tmp_path)}) == tmp_path / ".gemini"


@pytest.mark.parametrize("user", [USER_SETTINGS, None], ids=["users-file", "no-file"])
def test_install_merges_our_keys_and_remove_gives_back_the_exact_bytes(gemini, home, settings,
                                                                       dead_url, user):
    if user is not None:
        settings.parent.mkdir()
        settings.write_text(user)

    result = hi.install(gemini, parse_url(dead_url))

    assert result.written == [settings]
    text = settings.read_text()
    doc = json5.loads(text)  # JSON with comments, as Gemini CLI reads it
    assert doc["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert doc["model"]["name"] == "local"
    assert doc["privacy"] == {"usageStatisticsEnabled": False}
    if user is not None:
        assert "// my Gemini CLI settings" in text and '"theme": "GitHub"' in text
        assert doc["model"]["maxSessionTurns"] == 40
    [entry] = manifest.read()["agents"]["gemini"]["files"]
    assert set(entry["owned"]["entries"]) == OUR_KEYS
    assert hi.status(gemini).installed and hi.status(gemini).drift == ()

    hi.remove(gemini)
    if user is not None:
        assert settings.read_text() == user  # byte-identical
    else:
        assert not settings.exists()
