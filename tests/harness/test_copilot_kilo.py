"""GitHub Copilot CLI's and Kilo Code CLI's specs, without the binaries.

Copilot takes its provider from the environment only, so its spec writes no file: install
changes nothing in HOME and says so, `harness list` shows it as configured "-", and the
launch carries every setting, the key in the environment, never in argv. Kilo (an opencode
fork) gets a drop-in file next to the user's own kilo.jsonc, which install and remove
leave byte for byte. tests/e2e/test_copilot.py and test_kilo.py run the real agents."""

from __future__ import annotations

import json
from pathlib import Path

import json5
import pytest

from kit.harness import install as hi
from kit.harness.spec_loader import load_spec
from kit.urls import parse_url
from tests.helpers import run_kit, table_rows

MODELS = [{"id": "local", "name": "local", "model": "org/My-Model-4bit", "context_window": 32768,
           "max_tokens": 4096, "capabilities": {"tools": True, "reasoning": False,
                                                "vision": False}}]
ROOT = "http://127.0.0.1:8090"

#: A user's own Kilo config, with a comment and a provider of theirs.
USER_KILO = """{
  // my Kilo settings -- mlx-kit must keep this file as it is
  "$schema": "https://app.kilo.ai/config.json",
  "model": "anthropic/claude-sonnet-4",
  "provider": { "anthropic": { "options": { "timeout": 300000 } } },
  "autoupdate": false,
}
"""


@pytest.fixture
def baked(monkeypatch):
    monkeypatch.setattr(hi, "baked_models", lambda url: (MODELS, "test models"))


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_copilots_launch_sets_its_byok_variables_and_keeps_the_key_out_of_argv():
    spec = load_spec("copilot")
    argv, env = spec.launch_command("/bin/copilot", ["-p", "hi"], local=MODELS[0],
                                    root_url=ROOT, environ={"MLX_KIT_API_KEY": "s3cret"})
    assert argv == ["/bin/copilot", "-p", "hi"]
    assert env == {"COPILOT_PROVIDER_BASE_URL": ROOT + "/v1",
                   "COPILOT_PROVIDER_TYPE": "openai",
                   "COPILOT_PROVIDER_WIRE_API": "responses",
                   "COPILOT_PROVIDER_API_KEY": "s3cret",
                   "COPILOT_MODEL": "local",
                   "COPILOT_PROVIDER_MAX_PROMPT_TOKENS": "32768",
                   "COPILOT_PROVIDER_MAX_OUTPUT_TOKENS": "4096",
                   "COPILOT_OFFLINE": "true"}
    assert spec.api == "openai-responses" and spec.uses_model_limits
    # a keyless server still gets a placeholder (Copilot sends it as a Bearer token), and
    # the user's own COPILOT_OFFLINE (false: they want GitHub features too) is kept
    _, env = spec.launch_command("/bin/copilot", [], local=MODELS[0], root_url=ROOT,
                                 environ={"COPILOT_OFFLINE": "false"})
    assert env["COPILOT_PROVIDER_API_KEY"] == "mlx-kit" and "COPILOT_OFFLINE" not in env


def test_copilot_install_writes_nothing_and_says_launch_sets_its_environment(home, dead_url):
    before = files_under(home)
    r = run_kit(home, "harness", "install", "copilot", "--url", dead_url)
    assert r.returncode == 0, r.stderr
    assert "copilot has no config file for mlx-kit to write" in r.stdout
    assert "`mlx-kit launch copilot` sets its environment" in r.stdout
    state = home / ".local" / "share" / "mlx-kit"  # the manifest is mlx-kit's own
    assert {k: v for k, v in files_under(home).items()
            if not (home / k).is_relative_to(state)} == before
    assert not (home / ".copilot").exists()
    r = run_kit(home, "harness", "remove", "copilot")
    assert r.returncode == 0, r.stderr


def test_harness_list_shows_both_agents(home):
    r = run_kit(home, "harness", "list", PATH="/nonexistent")
    assert r.returncode == 0, r.stderr
    rows = table_rows(r.stdout)
    assert rows["copilot"][1:4] == ["-", "/v1/responses", "missing"]
    assert rows["kilo"][1:4] == ["no", "/v1/chat/completions", "missing"]
    lines = [" ".join(ln.split()) for ln in r.stdout.splitlines()]
    assert ("copilot mlx-kit harness install-agent copilot, or: npm install -g "
            "@github/copilot@1.0.102") in lines
    listed = json.loads(run_kit(home, "harness", "list", "--json").stdout)["agents"]
    by_name = {a["name"]: a for a in listed}
    assert by_name["copilot"]["paths"] == [] and by_name["kilo"]["api"] == "/v1/chat/completions"


def test_kilo_config_dir_follows_xdg_config_home(tmp_path):
    assert load_spec("kilo").config_dir({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "kilo"


@pytest.mark.parametrize("user", [USER_KILO, None], ids=["users-file", "no-file"])
def test_kilo_drop_in_leaves_the_users_own_config_byte_for_byte(baked, home, dead_url, user):
    spec = load_spec("kilo")
    folder = home / ".config" / "kilo"
    users = folder / "kilo.jsonc"
    if user is not None:
        folder.mkdir(parents=True)
        users.write_text(user)

    result = hi.install(spec, parse_url(dead_url))

    ours = folder / "mlx-kit.jsonc"
    assert result.written == [ours]
    doc = json5.loads(ours.read_text())
    assert doc["model"] == doc["small_model"] == "mlx-kit/local"
    provider = doc["provider"]["mlx-kit"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": dead_url + "/v1",
                                   "apiKey": "{env:MLX_KIT_API_KEY}"}
    assert provider["models"]["local"]["limit"] == {"context": 32768, "output": 4096}
    argv, env = spec.launch_command("/bin/kilo", ["run", "hi"], environ={})
    assert argv == ["/bin/kilo", "run", "hi"] and env == {"KILO_CONFIG": str(ours)}
    assert (users.read_text() if user is not None else None) == user
    assert hi.status(spec).installed

    hi.remove(spec)
    assert not ours.exists()
    if user is not None:
        assert users.read_text() == user
    else:
        assert not folder.exists()
