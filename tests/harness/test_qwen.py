"""Qwen Code's spec and template, without the binary: our keys merge into the user's own
~/.qwen/settings.json and come out by key, whether or not Qwen rewrote the file in between
(it adds "$version", reformats, and keeps the previous bytes in settings.json.orig).
tests/e2e/test_qwen.py runs the real qwen."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from kit.errors import HarnessError
from kit.harness import install as hi
from kit.harness import manifest
from kit.harness.render import API_KEY_ENV, context, render
from kit.harness.spec import parse_spec
from kit.harness.spec_loader import load_spec
from kit.paths import harnesses_dir
from kit.urls import parse_url

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: A user's settings.json as Qwen Code 0.15.10 leaves it: 2-space JSON, "$version": 4, no
#: newline at the end; their own OpenAI-compatible and Anthropic providers, their model and
#: auth type, a key in the env block, UI settings.
USER_SETTINGS = json.dumps({
    "modelProviders": {
        "openai": [{
            "id": "qwen3-coder-plus",
            "name": "Qwen3 Coder Plus (DashScope)",
            "envKey": "DASHSCOPE_API_KEY",
            "baseUrl": "https://dashscope.aliyuncs.com/compatible-mode/v1",
            "generationConfig": {"contextWindowSize": 1000000},
        }],
        "anthropic": [{"id": "claude-sonnet-4", "envKey": "ANTHROPIC_API_KEY",
                       "baseUrl": "https://api.anthropic.com"}],
    },
    "security": {"auth": {"selectedType": "qwen-oauth"}},
    "model": {"name": "qwen3-coder-plus", "chatCompression": {"contextPercentageThreshold": 0.6}},
    "env": {"DASHSCOPE_API_KEY": "sk-the-users-own"},
    "ui": {"theme": "GitHub", "hideTips": True},
    "general": {"vimMode": True, "outputLanguage": "English"},
    "$version": 4,
}, indent=2, ensure_ascii=False)

MODELS = [{"id": "local", "name": "local", "model": "org/My-Model-4bit", "context_window": 32768,
           "max_tokens": 4096, "capabilities": {"tools": True, "reasoning": False,
                                                "vision": False}}]
OUR_KEYS = {"modelProviders.openai[id=local]", "security.auth.selectedType", "model.name",
            f"env.{API_KEY_ENV}"}


@pytest.fixture
def qwen(monkeypatch):
    monkeypatch.setattr(hi, "baked_models", lambda url: (MODELS, "test models"))
    return load_spec("qwen")


@pytest.fixture
def settings(home) -> Path:
    return home / ".qwen" / "settings.json"


def ours(doc: dict) -> dict:
    [entry] = [e for e in doc["modelProviders"]["openai"] if e["id"] == "local"]
    return entry


def qwen_rewrites(path: Path) -> None:
    """What Qwen Code 0.15.10 does to a settings.json without "$version" when it starts:
    the old bytes go to settings.json.orig, the file is written again (2-space JSON, no
    final newline) with "$version": 4 added at the end."""
    data = json.loads(path.read_text())
    shutil.copyfile(path, path.with_name(path.name + ".orig"))
    data.setdefault("$version", 4)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False))


def test_render_takes_the_window_and_output_cap_from_the_server_and_keeps_names_as_data():
    hostile = 'x", "envKey": "EVIL\n\u2028</script>'
    models = [dict(MODELS[0], model=hostile)]
    text = render(load_spec("qwen"), context("http://127.0.0.1:8090/v1", models, "t"))
    doc = json.loads(text["settings.json"])
    [entry] = doc["modelProviders"]["openai"]
    assert entry["id"] == "local" and entry["envKey"] == API_KEY_ENV
    assert entry["baseUrl"] == "http://127.0.0.1:8090/v1"
    assert entry["generationConfig"] == {"contextWindowSize": 32768,
                                         "samplingParams": {"max_tokens": 4096}}
    assert hostile in entry["name"]  # data, not structure
    assert doc["security"] == {"auth": {"selectedType": "openai"}}
    assert doc["model"] == {"name": "local"} and doc["env"] == {API_KEY_ENV: "mlx-kit"}


def test_install_merges_our_keys_and_remove_gives_back_the_exact_bytes(qwen, home, settings,
                                                                       dead_url):
    settings.parent.mkdir()
    settings.write_text(USER_SETTINGS)
    user = json.loads(USER_SETTINGS)

    result = hi.install(qwen, parse_url(dead_url))

    assert result.written == [settings]
    doc = json.loads(settings.read_text())
    assert ours(doc)["baseUrl"] == f"{dead_url}/v1"
    assert doc["modelProviders"]["openai"][0] == user["modelProviders"]["openai"][0]
    assert doc["modelProviders"]["anthropic"] == user["modelProviders"]["anthropic"]
    assert doc["security"]["auth"]["selectedType"] == "openai"
    assert doc["model"] == {"name": "local", "chatCompression": {"contextPercentageThreshold": 0.6}}
    assert doc["env"] == {"DASHSCOPE_API_KEY": "sk-the-users-own", API_KEY_ENV: "mlx-kit"}
    assert {k: doc[k] for k in ("ui", "general", "$version")} == \
        {k: user[k] for k in ("ui", "general", "$version")}
    [entry] = manifest.read()["agents"]["qwen"]["files"]
    assert set(entry["owned"]["entries"]) == OUR_KEYS
    assert hi.status(qwen).installed and hi.status(qwen).drift == ()

    assert hi.remove(qwen).unmerged == [settings]
    assert settings.read_text() == USER_SETTINGS  # byte-identical: Qwen did not rewrite it


COMMENTED_SETTINGS = """{
  // my Qwen settings -- mlx-kit must keep these comments
  "modelProviders": {
    "openai": [
      { "id": "qwen3-coder-plus", "envKey": "DASHSCOPE_API_KEY", }, // trailing comma
    ],
  },
  /* auth I use at work */
  "security": { "auth": { "selectedType": "qwen-oauth" } },
  "model": { "name": "qwen3-coder-plus" },
}
"""


def test_a_settings_file_with_comments_gets_our_keys_and_comes_back_byte_identical(
        qwen, home, settings, dead_url):
    # Qwen Code reads settings.json with comments; the merge edits it in place (jsonc).
    settings.parent.mkdir()
    settings.write_text(COMMENTED_SETTINGS)
    hi.install(qwen, parse_url(dead_url))
    text = settings.read_text()
    assert "// my Qwen settings" in text and "/* auth I use at work */" in text
    assert '"local"' in text and '"openai"' in text
    assert hi.remove(qwen).unmerged == [settings]
    assert settings.read_text() == COMMENTED_SETTINGS


@pytest.mark.parametrize("user_file", [True, False], ids=["users-file", "no-file"])
def test_installing_again_as_every_launch_does_still_removes_everything(
        qwen, home, settings, dead_url, monkeypatch, user_file):
    """Regression: a second install recorded our own values as "the user's previous" and
    forgot the parents the first one created, so removal put our keys back (llm too)."""
    if user_file:
        settings.parent.mkdir()
        settings.write_text(USER_SETTINGS)
    hi.install(qwen, parse_url(dead_url))
    other = [dict(MODELS[0], context_window=16384)]
    monkeypatch.setattr(hi, "baked_models", lambda url: (other, "test models"))
    assert hi.install(qwen, parse_url(dead_url.replace("127.0.0.1", "localhost"))).written == [settings]
    hi.install(qwen, parse_url(dead_url.replace("127.0.0.1", "localhost")))

    hi.remove(qwen)

    if user_file:
        assert settings.read_text() == USER_SETTINGS
    else:
        assert not (home / ".qwen").exists()


def test_remove_after_qwen_rewrote_the_file_takes_out_only_our_keys(qwen, home, settings,
                                                                     dead_url):
    """The user's file had no "$version" and other formatting; Qwen rewrote it after
    install. Removal finds our keys by key and puts the user's replaced values back."""
    user = json.loads(USER_SETTINGS)
    del user["$version"]
    compact = json.dumps(user) + "\n"
    settings.parent.mkdir()
    settings.write_text(compact)
    hi.install(qwen, parse_url(dead_url))
    qwen_rewrites(settings)

    assert hi.remove(qwen).unmerged == [settings]

    after = json.loads(settings.read_text())
    assert after == {**user, "$version": 4}  # every key of the user's, and Qwen's own
    assert list(after) == [*user, "$version"]  # in their order
    assert "local" not in json.dumps(after["modelProviders"])
    assert API_KEY_ENV not in after["env"]
    assert "qwen" not in manifest.read()["agents"]
    # Qwen's own backup (the file as it was when Qwen started) is Qwen's, left alone
    assert settings.with_name("settings.json.orig").is_file()


def test_a_settings_file_install_created_is_deleted_with_its_folder(qwen, home, settings,
                                                                    dead_url):
    hi.install(qwen, parse_url(dead_url))
    assert json.loads(settings.read_text())["model"] == {"name": "local"}

    assert hi.remove(qwen).removed == [settings, settings.parent]
    assert not (home / ".qwen").exists()


def test_a_file_install_created_and_qwen_then_rewrote_keeps_only_qwens_key(qwen, home,
                                                                          settings, dead_url):
    hi.install(qwen, parse_url(dead_url))
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "$version": 4}))

    hi.remove(qwen)

    assert json.loads(settings.read_text()) == {"$version": 4}


def test_a_model_picked_inside_qwen_after_install_is_kept_on_removal(qwen, home, settings,
                                                                     dead_url):
    """/model and /auth in Qwen write model.name and security.auth.selectedType: those are
    the user's choices now, neither refused nor reverted by remove."""
    settings.parent.mkdir()
    settings.write_text(USER_SETTINGS)
    hi.install(qwen, parse_url(dead_url))
    doc = json.loads(settings.read_text())
    doc["model"]["name"] = "claude-sonnet-4"
    doc["security"]["auth"]["selectedType"] = "anthropic"
    settings.write_text(json.dumps(doc, indent=2))
    assert hi.status(qwen).drift == (settings,)

    hi.remove(qwen)

    after = json.loads(settings.read_text())
    assert after["model"]["name"] == "claude-sonnet-4"
    assert after["security"]["auth"]["selectedType"] == "anthropic"
    assert [e["id"] for e in after["modelProviders"]["openai"]] == ["qwen3-coder-plus"]
    assert API_KEY_ENV not in after["env"]


def test_an_edited_provider_entry_is_kept_unless_forced(qwen, home, settings, dead_url):
    settings.parent.mkdir()
    settings.write_text(USER_SETTINGS)
    hi.install(qwen, parse_url(dead_url))
    edited = settings.read_text().replace('"contextWindowSize": 32768',
                                          '"contextWindowSize": 16384')
    settings.write_text(edited)

    with pytest.raises(HarnessError) as exc:
        hi.remove(qwen)
    assert "the entry id=local of modelProviders.openai" in exc.value.message
    assert settings.read_text() == edited

    hi.remove(qwen, force=True)
    assert json.loads(settings.read_text()) == json.loads(USER_SETTINGS)


def test_a_user_entry_with_our_id_comes_back_on_removal(qwen, home, settings, dead_url):
    user = json.loads(USER_SETTINGS)
    mine = {"id": "local", "name": "my ollama", "envKey": "OLLAMA_KEY",
            "baseUrl": "http://127.0.0.1:11434/v1"}
    user["modelProviders"]["openai"].append(mine)
    settings.parent.mkdir()
    settings.write_text(json.dumps(user, indent=2))
    hi.install(qwen, parse_url(dead_url))
    assert [e.get("envKey") for e in json.loads(settings.read_text())["modelProviders"]
            ["openai"]] == ["DASHSCOPE_API_KEY", API_KEY_ENV]  # replaced in place

    hi.remove(qwen)

    assert json.loads(settings.read_text()) == user


def test_qwen_home_moves_the_settings(qwen, home, tmp_path, dead_url, monkeypatch):
    elsewhere = tmp_path / "qwen-home"
    monkeypatch.setenv("QWEN_HOME", str(elsewhere))

    assert hi.install(qwen, parse_url(dead_url)).written == [elsewhere / "settings.json"]
    assert not (home / ".qwen").exists()
    hi.remove(qwen)
    assert not elsewhere.exists()


def test_launch_selects_the_openai_auth_and_our_model():
    argv, env = load_spec("qwen").launch_command("/bin/qwen", ["-p", "hi"])
    assert argv == ["/bin/qwen", "--auth-type", "openai", "--model", "local", "-p", "hi"]
    assert env == {}


@pytest.mark.parametrize("owns, message", [
    (["modelProviders.openai[id"], "owns entry 'modelProviders.openai[id'"),
    (["modelProviders[openai].x"], "owns entry 'modelProviders[openai].x'"),
    ([1, 2], "owns[0]: must be a string (got 1)"),
    ("model.name", "owns: must be a list (got 'model.name')"),
], ids=["unclosed", "selector-not-last", "not-strings", "not-a-list"])
def test_a_malformed_owns_in_a_spec_is_refused(owns, message):
    data = tomllib.loads((harnesses_dir() / "qwen.toml").read_text())
    parse_spec(data, "qwen.toml")  # as shipped
    data["files"][0]["owns"] = owns
    with pytest.raises(HarnessError) as exc:
        parse_spec(data, "qwen.toml")
    assert exc.value.message.startswith("qwen.toml: files[0].owns")
    assert message in exc.value.message


def test_values_the_user_set_between_two_installs_are_what_removal_puts_back(
        qwen, home, settings, dead_url):
    # Regression (found by a new-user try): the second install (every launch installs)
    # kept the first install's record, so removal put back values the user had already
    # replaced by hand in between.
    settings.parent.mkdir()
    settings.write_text('{"model": {"name": "userA"}, "security": {"auth": '
                        '{"selectedType": "gemini"}}}')
    hi.install(qwen, parse_url(dead_url))
    newer = '{"model": {"name": "userB"}, "security": {"auth": {"selectedType": ' \
            '"qwen-oauth"}}, "other": 1}'
    settings.write_text(newer)  # the user rewrote the file: our keys are gone
    hi.install(qwen, parse_url(dead_url))
    hi.remove(qwen)
    assert json.loads(settings.read_text()) == json.loads(newer)


def test_a_second_install_over_our_untouched_keys_still_restores_the_first_values(
        qwen, home, settings, dead_url):
    settings.parent.mkdir()
    original = '{"model": {"name": "userA"}}'
    settings.write_text(original)
    hi.install(qwen, parse_url(dead_url))
    hi.install(qwen, parse_url(dead_url))
    hi.remove(qwen)
    assert settings.read_text() == original
