"""Goose, Zed and Crush: their files render to what each agent's own loader requires (checked
field by field against the agents' source: none of the three installs here), hostile model
names stay data, and install -> remove on a throwaway HOME that already holds the user's
real config leaves that config byte for byte as it was."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import json5
import pytest

from kit.errors import HarnessError
from kit.harness import install as hi
from kit.harness.formats import loads
from kit.harness.render import MARKER, context, render, shell_literal
from kit.harness.spec import parse_spec
from kit.harness.spec_loader import load_spec
from kit.urls import parse_url
from tests.harness.test_render import EVERYTHING
from tests.helpers import edited_spec, snapshot

CAPS = {"tools": True, "reasoning": False, "vision": False}
MODELS = [
    {"id": "local", "name": "local", "model": "mlx-community/Qwen3-4B-4bit",
     "context_window": 40960, "max_tokens": 8192, "capabilities": CAPS},
    {"id": "mlx-community/Qwen3-4B-4bit", "name": "mlx-community/Qwen3-4B-4bit",
     "model": "mlx-community/Qwen3-4B-4bit", "context_window": 40960, "max_tokens": 8192,
     "capabilities": CAPS},
]
AGENT_ENV = ("GOOSE_PATH_ROOT", "FLATPAK_XDG_CONFIG_HOME", "CRUSH_GLOBAL_CONFIG",
             "GOOSE_PROVIDER", "GOOSE_MODEL")


@pytest.fixture
def env(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The throwaway HOME, no agent variables set, and a known model behind local."""
    for var in AGENT_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hi, "baked_models", lambda url: (MODELS, "test entries"))
    return home


def _render(agent: str, models=MODELS, url: str = "http://127.0.0.1:8090/v1") -> str:
    spec = load_spec(agent)
    [text] = render(spec, context(url, models, "test")).values()
    return text


# --- what each agent's loader requires ------------------------------------------------------
# Field names and types from the agents' source: Goose's DeclarativeProviderConfig and
# ModelInfo (goose 1.50), Zed's OpenAiCompatibleSettingsContent / AvailableModel /
# ModelCapabilities, Crush's ProviderConfig and catwalk.Model (its schema.json).

def _types(obj: dict, fields: dict[str, type | tuple], where: str, required=()) -> None:
    for name in required:
        assert name in obj, f"{where}: {name} is required"
    for name, kind in fields.items():
        if name in obj:
            value = obj[name]
            assert isinstance(value, kind) and not (kind is int and isinstance(value, bool)), \
                f"{where}: {name} must be {kind}, is {value!r}"


def check_goose(provider: dict) -> None:
    """One invalid file stops Goose from loading every custom provider: check ours like
    serde would (required fields, types, the engine's spelling)."""
    _types(provider, {"name": str, "display_name": str, "description": str,
                      "api_key_env": str, "base_url": str, "models": list,
                      "supports_streaming": bool, "requires_auth": bool,
                      "timeout_seconds": int, "dynamic_models": bool,
                      "skip_canonical_filtering": bool},
           "goose", required=("name", "engine", "display_name", "base_url", "models"))
    assert provider["engine"] in ("openai", "anthropic", "ollama")
    assert re.fullmatch(r"[a-z0-9_][a-z0-9_-]*", provider["name"])  # Goose's id rule
    assert provider.get("timeout_seconds", 0) >= 0
    if provider.get("dynamic_models") is False:
        assert provider["models"], "dynamic_models false needs a model list"
    for model in provider["models"]:
        _types(model, {"name": str, "context_limit": int}, "goose model",
               required=("name", "context_limit"))
        assert model["context_limit"] >= 0
    assert "auth" not in provider  # exclusive with api_key_env


def check_zed(entry: dict) -> None:
    _types(entry, {"api_url": str, "available_models": list}, "zed",
           required=("api_url", "available_models"))
    for model in entry["available_models"]:
        _types(model, {"name": str, "display_name": str, "max_tokens": int,
                       "max_output_tokens": int, "capabilities": dict}, "zed model",
               required=("name", "max_tokens"))
        assert 0 < model["max_output_tokens"] <= model["max_tokens"]
        _types(model["capabilities"], dict.fromkeys(
            ("tools", "images", "parallel_tool_calls", "prompt_cache_key", "chat_completions"),
            bool), "zed capabilities",
            required=("tools", "images", "parallel_tool_calls", "prompt_cache_key"))


CRUSH_TYPES = ("openai", "openai-compat", "openrouter", "vercel", "anthropic", "google",
               "azure", "bedrock", "google-vertex", "hyper", "litellm", "llamacpp", "lmstudio",
               "ollama", "omlx")


def check_crush(provider: dict) -> None:
    _types(provider, {"name": str, "base_url": str, "type": str, "api_key": str,
                      "discover_models": bool, "models": list}, "crush",
           required=("base_url", "models"))
    assert provider["type"] in CRUSH_TYPES
    number = (int, float)
    for model in provider["models"]:
        _types(model, {"id": str, "name": str, "cost_per_1m_in": number, "cost_per_1m_out": number,
                       "cost_per_1m_in_cached": number, "cost_per_1m_out_cached": number,
                       "context_window": int, "default_max_tokens": int, "can_reason": bool,
                       "supports_attachments": bool}, "crush model",
               required=("id", "name", "cost_per_1m_in", "cost_per_1m_out",
                         "cost_per_1m_in_cached", "cost_per_1m_out_cached", "context_window",
                         "default_max_tokens", "can_reason", "supports_attachments"))
        assert 0 < model["default_max_tokens"] <= model["context_window"]


def _strings(value):
    """Every string in a parsed document."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def parse_goose(text: str) -> dict:
    return json.loads(text)  # Goose reads it with serde_json: strict JSON


def parse_zed(text: str) -> dict:
    """Zed reads settings.json leniently (comments, trailing commas): our JSONC loader."""
    return loads("jsonc", text, "settings.json")["language_models"]["openai_compatible"][
        "mlx-kit"].copy()


def parse_crush(text: str) -> dict:
    return json.loads(text)["providers"]["mlx-kit"]  # Crush checks json.Valid: strict JSON


PARSE = {"goose": parse_goose, "zed": parse_zed, "crush": parse_crush}
CHECK = {"goose": check_goose, "zed": check_zed, "crush": check_crush}


@pytest.mark.parametrize("agent", ["goose", "zed", "crush"])
def test_rendered_file_has_what_the_agent_requires(agent):
    entry = PARSE[agent](_render(agent))
    CHECK[agent](entry)
    text = json.dumps(entry)
    assert "40960" in text  # the context window...
    if agent == "goose":  # ...and the output limit: Goose's file has no field for it, so
        # it comes with the launch environment (GOOSE_MAX_TOKENS), next to the window
        env = load_spec("goose").launch_command("goose", [], local=MODELS[0], environ={})[1]
        assert (env["GOOSE_MAX_TOKENS"], env["GOOSE_CONTEXT_LIMIT"]) == ("8192", "40960")
    else:
        assert "8192" in text


def test_the_values_each_agent_reads():
    goose = parse_goose(_render("goose"))
    assert (goose["name"], goose["engine"], goose["api_key_env"]) == \
        ("mlx-kit", "openai", "MLX_KIT_API_KEY")
    assert goose["base_url"] == "http://127.0.0.1:8090/v1"  # Goose appends chat/completions
    assert goose["models"] == [{"name": "local", "context_limit": 40960}]
    assert MARKER in _render("goose")[:300]  # drop-in: remove checks the marker

    [zed] = parse_zed(_render("zed"))["available_models"]
    assert (zed["name"], zed["max_tokens"], zed["max_output_tokens"]) == ("local", 40960, 8192)
    assert zed["capabilities"]["tools"] is True and zed["capabilities"]["images"] is False

    crush = parse_crush(_render("crush"))
    assert crush["type"] == "openai-compat" and crush["api_key"] == "$MLX_KIT_API_KEY"
    assert crush["models"][0]["id"] == "local"


@pytest.mark.parametrize("agent", ["goose", "zed", "crush"])
def test_hostile_model_names_and_urls_stay_data(agent):
    models = [dict(m, model=EVERYTHING, name=EVERYTHING) for m in MODELS]
    url = 'http://127.0.0.1:1/v1"; $(touch /tmp/pwned) `id` \\ //\n'
    text = _render(agent, models, url)
    entry = PARSE[agent](text)
    CHECK[agent](entry)
    assert any(EVERYTHING in value for value in _strings(entry))
    got = entry.get("base_url") or entry.get("api_url")
    if agent == "crush":  # Crush shell-expands base_url: ours is escaped, so it stays literal
        assert got == shell_literal(url)
        assert re.sub(r"\\(.)", r"\1", got) == url
    else:
        assert got == url
    assert "\u2028" not in text and "\x00" not in text


# --- Goose --------------------------------------------------------------------------------

GOOSE_CONFIG = """\
GOOSE_PROVIDER: openai
GOOSE_MODEL: gpt-4o
extensions:
  developer:
    enabled: true
    name: developer
    type: builtin
"""
GOOSE_USER_PROVIDER = json.dumps({
    "name": "custom_my_box", "engine": "ollama", "display_name": "My box",
    "api_key_env": "", "base_url": "http://box:11434", "requires_auth": False,
    "models": [{"name": "qwen3:8b", "context_limit": 32768}]}, indent=2)


def test_goose_install_adds_one_provider_file_and_remove_leaves_the_rest(env, dead_url):
    goose = env / ".config" / "goose"
    (goose / "custom_providers").mkdir(parents=True)
    (goose / "config.yaml").write_text(GOOSE_CONFIG)
    (goose / "custom_providers" / "custom_my_box.json").write_text(GOOSE_USER_PROVIDER)
    before = snapshot(env / ".config", skip=("mlx-kit",))
    spec = load_spec("goose")

    result = hi.install(spec, parse_url(dead_url))
    target = goose / "custom_providers" / "mlx-kit.json"
    assert result.written == [target]
    # every file Goose will load from custom_providers/ is valid, ours included
    for path in sorted((goose / "custom_providers").glob("*.json")):
        check_goose(json.loads(path.read_text()))
    assert hi.status(spec).installed

    removal = hi.remove(spec)
    assert removal.removed == [target]
    assert snapshot(env / ".config", skip=("mlx-kit",)) == before


@pytest.mark.parametrize("variable, expected", [
    ("GOOSE_PATH_ROOT", "root/config/custom_providers/mlx-kit.json"),
    ("XDG_CONFIG_HOME", "root/goose/custom_providers/mlx-kit.json"),
])
def test_goose_config_dir_follows_its_variables(env, tmp_path, monkeypatch, variable, expected):
    monkeypatch.setenv(variable, str(tmp_path / "root"))
    [(_, path)] = load_spec("goose").file_paths()
    assert path == tmp_path / expected
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("GOOSE_PATH_ROOT", str(tmp_path / "gpr"))  # Goose's own var wins
    assert load_spec("goose").file_paths()[0][1] == \
        tmp_path / "gpr" / "config" / "custom_providers" / "mlx-kit.json"


def test_goose_launch_selects_the_provider_and_passes_the_limits(env):
    spec = load_spec("goose")
    assert spec.uses_model_limits  # so `launch` asks the server for them
    assert not load_spec("zed").uses_model_limits and not load_spec("pi").uses_model_limits
    argv, extra = spec.launch_command("/bin/goose", ["run", "-t", "hi"], local=MODELS[0],
                                      environ={})
    assert argv == ["/bin/goose", "run", "-t", "hi"]
    assert extra == {"GOOSE_PROVIDER": "mlx-kit", "GOOSE_MODEL": "local",
                     "GOOSE_CONTEXT_LIMIT": "40960", "GOOSE_MAX_TOKENS": "8192",
                     "MLX_KIT_API_KEY": "mlx-kit"}
    # the user's own key (a server started with --api-key) is never replaced
    _, extra = spec.launch_command("/bin/goose", [], local=MODELS[0],
                                   environ={"MLX_KIT_API_KEY": "secret"})
    assert "MLX_KIT_API_KEY" not in extra
    with pytest.raises(HarnessError) as exc:  # no limits reported: a clear error
        spec.launch_command("/bin/goose", [], local={"id": "local"}, environ={})
    assert "context_window" in exc.value.message or "max_tokens" in exc.value.message


# --- Zed ----------------------------------------------------------------------------------

ZED_SETTINGS = """\
// Zed settings
//
// For information on how to configure Zed, see the Zed
// documentation: https://zed.dev/docs/configuring-zed
//
// To see all of Zed's default settings without changing your
// custom settings, run `zed: open default settings` from the
// command palette (cmd-shift-p / ctrl-shift-p)
{
  "ui_font_size": 16,
  "buffer_font_size": 15,
  "theme": {
    "mode": "system",
    "light": "One Light",
    "dark": "One Dark", // a trailing comma follows
  },
  /* the agent panel */
  "agent": {
    "default_model": {"provider": "zed.dev", "model": "claude-sonnet-4"},
  },
  "language_models": {
    "openai_compatible": {
      // my own gateway
      "Together AI": {
        "api_url": "https://api.together.xyz/v1",
        "available_models": [
          {
            "name": "mistralai/Mixtral-8x7B-Instruct-v0.1",
            "display_name": "Together Mixtral",
            "max_tokens": 32768,
            "capabilities": {"tools": true, "images": false, "parallel_tool_calls": false,
                             "prompt_cache_key": false},
          },
        ],
      },
    },
    "ollama": {"api_url": "http://localhost:11434"},
  },
  "vim_mode": true,
}
"""


@pytest.fixture
def zed_settings(env: Path) -> Path:
    path = env / ".config" / "zed" / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text(ZED_SETTINGS)
    return path


def test_zed_merge_keeps_every_byte_of_the_users_settings(env, zed_settings, dead_url):
    before = snapshot(env / ".config", skip=("mlx-kit",))
    spec = load_spec("zed")

    result = hi.install(spec, parse_url(dead_url))
    assert result.written == [zed_settings]
    merged = zed_settings.read_text()
    check_zed(parse_zed(merged))
    data = json5.loads(merged)
    assert "Together AI" in data["language_models"]["openai_compatible"]  # theirs stays
    for line in ZED_SETTINGS.splitlines():  # comments, trailing commas, order: all there
        assert line in merged
    assert merged.count(",\n      \"mlx-kit\": {") == 1  # after the user's provider
    assert hi.status(spec).installed and not hi.status(spec).drift

    removal = hi.remove(spec)
    assert removal.unmerged == [zed_settings]
    assert snapshot(env / ".config", skip=("mlx-kit",)) == before


def test_zed_remove_keeps_the_users_later_edit_and_takes_out_ours(env, zed_settings, dead_url):
    spec = load_spec("zed")
    hi.install(spec, parse_url(dead_url))
    edited = zed_settings.read_text().replace('"ui_font_size": 16', '"ui_font_size": 18')
    zed_settings.write_text(edited)

    hi.remove(spec)
    assert zed_settings.read_text() == ZED_SETTINGS.replace('"ui_font_size": 16',
                                                            '"ui_font_size": 18')


def test_zed_an_edit_of_our_entry_is_drift_and_blocks_removal(env, zed_settings, dead_url):
    spec = load_spec("zed")
    hi.install(spec, parse_url(dead_url))
    zed_settings.write_text(zed_settings.read_text().replace('"max_output_tokens": 8192',
                                                             '"max_output_tokens": 100'))
    assert hi.status(spec).drift == (zed_settings,)
    with pytest.raises(HarnessError):
        hi.remove(spec)
    hi.remove(spec, force=True)
    assert json5.loads(zed_settings.read_text()) == json5.loads(ZED_SETTINGS)


def test_zed_the_users_own_mlx_kit_entry_comes_back(env, zed_settings, dead_url):
    """A provider of the user's named mlx-kit is replaced by ours and put back on removal:
    byte for byte when nothing else changed, else with the same content (reformatted)."""
    own = ZED_SETTINGS.replace('      // my own gateway\n',
                               '      "mlx-kit": {"api_url": "http://mine/v1", '
                               '"available_models": []},\n      // my own gateway\n')
    zed_settings.write_text(own)
    spec = load_spec("zed")
    hi.install(spec, parse_url(dead_url))
    assert parse_zed(zed_settings.read_text())["api_url"] == dead_url + "/v1"
    hi.remove(spec)
    assert zed_settings.read_text() == own

    hi.install(spec, parse_url(dead_url))
    zed_settings.write_text(zed_settings.read_text().replace('"vim_mode": true',
                                                             '"vim_mode": false'))
    hi.remove(spec)
    expected = own.replace('"vim_mode": true', '"vim_mode": false')
    back = zed_settings.read_text()
    assert json5.loads(back) == json5.loads(expected)
    assert parse_zed(back) == {"api_url": "http://mine/v1", "available_models": []}
    for line in expected.splitlines():  # all else as it was
        if "mlx-kit" not in line:
            assert line in back


def test_zed_settings_created_by_install_are_deleted_by_remove(env, dead_url):
    spec = load_spec("zed")
    hi.install(spec, parse_url(dead_url))
    path = env / ".config" / "zed" / "settings.json"
    check_zed(parse_zed(path.read_text()))
    hi.remove(spec)
    assert not (env / ".config").exists()


def test_zed_settings_that_do_not_parse_are_left_alone(env, zed_settings, dead_url):
    zed_settings.write_text(ZED_SETTINGS.replace('"vim_mode": true', '"vim_mode": '))
    with pytest.raises(HarnessError) as exc:
        hi.install(load_spec("zed"), parse_url(dead_url))
    assert "is not valid JSONC" in exc.value.message
    assert zed_settings.read_text() == ZED_SETTINGS.replace('"vim_mode": true', '"vim_mode": ')


def test_zed_config_dir(env, tmp_path, monkeypatch):
    spec = load_spec("zed")
    monkeypatch.setattr(sys, "platform", "linux")
    assert spec.config_dir() == env / ".config" / "zed"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert spec.config_dir() == tmp_path / "xdg" / "zed"
    monkeypatch.setenv("FLATPAK_XDG_CONFIG_HOME", str(tmp_path / "flatpak"))
    assert spec.config_dir() == tmp_path / "flatpak" / "zed"
    monkeypatch.setattr(sys, "platform", "darwin")  # Zed ignores XDG on macOS
    assert spec.config_dir() == env / ".config" / "zed"


def test_zed_launch_supplies_a_key_only_when_none_is_set(env):
    spec = load_spec("zed")
    assert spec.launch_command("/bin/zed", [], environ={})[1] == {"MLX_KIT_API_KEY": "mlx-kit"}
    assert spec.launch_command("/bin/zed", [], environ={"MLX_KIT_API_KEY": "k"})[1] == {}


# --- Crush --------------------------------------------------------------------------------

CRUSH_CONFIG = """\
{
    "$schema": "https://charm.land/crush.json",
    "providers": {
        "deepseek": {
            "type": "openai-compat",
            "base_url": "https://api.deepseek.com/v1",
            "api_key": "$DEEPSEEK_API_KEY",
            "models": [
                {
                    "id": "deepseek-chat",
                    "name": "Deepseek V3",
                    "cost_per_1m_in": 0.27,
                    "cost_per_1m_out": 1.1,
                    "cost_per_1m_in_cached": 0.07,
                    "cost_per_1m_out_cached": 1.1,
                    "context_window": 64000,
                    "default_max_tokens": 5000,
                    "can_reason": false,
                    "supports_attachments": false
                }
            ]
        }
    },
    "options": {"debug": false}
}
"""


def test_crush_merge_keeps_the_users_config_strict_json_and_byte_identical(env, dead_url):
    path = env / ".config" / "crush" / "crush.json"
    path.parent.mkdir(parents=True)
    path.write_text(CRUSH_CONFIG)
    (path.parent / "crushrc").write_text("# the user's shell config\n")
    before = snapshot(env / ".config", skip=("mlx-kit",))
    spec = load_spec("crush")

    hi.install(spec, parse_url(dead_url))
    merged = path.read_text()
    data = json.loads(merged)  # still strict JSON (Crush refuses anything else)
    check_crush(data["providers"]["mlx-kit"])
    check_crush(data["providers"]["deepseek"])
    assert '\n        "mlx-kit": {\n            "name"' in merged  # the file's 4-space indent
    for line in CRUSH_CONFIG.splitlines():
        assert line.replace(",", "") in merged.replace(",", "")

    hi.remove(spec)
    assert snapshot(env / ".config", skip=("mlx-kit",)) == before


def test_crush_config_dir_and_launch(env, tmp_path, monkeypatch):
    spec = load_spec("crush")
    assert spec.file_paths()[0][1] == env / ".config" / "crush" / "crush.json"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert spec.file_paths()[0][1] == tmp_path / "xdg" / "crush" / "crush.json"
    monkeypatch.setenv("CRUSH_GLOBAL_CONFIG", str(tmp_path / "g"))
    assert spec.file_paths()[0][1] == tmp_path / "g" / "crush.json"
    argv, extra = spec.launch_command("/bin/crush", ["hello"], environ={})
    assert argv == ["/bin/crush", "run", "--model", "mlx-kit/local", "hello"] and extra == {}


# --- the spec keys these agents brought ----------------------------------------------------

@pytest.mark.parametrize("agent, edit, message", [
    ("goose", lambda t: t.replace("{max_tokens}", "{max_token}"), "names {max_token}"),
    ("goose", lambda t: t.replace('args = []', 'args = ["{file1}"]'), "names {file1}"),
    ("goose", lambda t: t.replace('env_defaults =', 'colour = "x"\nenv_defaults ='),
     "launch.colour: unknown key"),
    ("zed", lambda t: t.replace('darwin_env = []', 'darwin_env = ["/abs"]'),
     "env must be a variable name or a list"),
    ("zed", lambda t: t.replace('darwin_env = []', 'darwin_env = []\ncolour = 1'),
     "config_dir.colour: unknown key"),
])
def test_malformed_new_spec_keys_are_refused(tmp_path, agent, edit, message):
    data, where = edited_spec(agent, edit)
    with pytest.raises(HarnessError) as exc:
        parse_spec(data, where)
    assert message in exc.value.message


def test_a_single_env_name_still_works(env, tmp_path, monkeypatch):
    spec = load_spec("codex")
    assert spec.config_dir_env == ("CODEX_HOME",)
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "cx"))
    assert spec.config_dir() == tmp_path / "cx"
