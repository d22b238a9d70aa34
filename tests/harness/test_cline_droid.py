"""Cline CLI's and Factory Droid's specs and templates, without the binaries: our entry
merges into the user's own Cline providers.json / Droid settings.json and comes out by
key, also after Cline wrote the file again (it stamps the entry's updatedAt, reorders its
keys and rewrites the whole file on every run); no API key ever goes into either file or
onto a command line. tests/e2e/test_cline.py and test_droid.py run the real binaries.

The shapes checked here are the agents' own schemas, read in their bundled code: Cline
3.0.65's providers file ({version: 1, lastUsedProvider?, modes?, providers: {<id>:
{settings, updatedAt (ISO time), tokenSource: manual|oauth|migration}}}; a file that
does not match is read as empty, and Cline's next save would then drop the user's other
providers) and Droid 0.215.0's customModels entries ({model, displayName, baseUrl,
apiKey, provider in its enum, maxContextLimit, maxOutputTokens, noImageSupport,
extraHeaders}).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kit.errors import HarnessError
from kit.harness import install as hi
from kit.harness import manifest
from kit.harness.render import API_KEY_ENV, MARKER, context, render
from kit.harness.spec import parse_spec
from kit.harness.spec_loader import load_spec
from kit.urls import parse_url
from tests.helpers import edited_spec
from tests.reliability.test_harness_manifest import CLINE_PROVIDERS, DROID_SETTINGS

MODELS = [{"id": "local", "name": "local", "model": "org/My-Model-4bit", "context_window": 32768,
           "max_tokens": 4096, "capabilities": {"tools": True, "reasoning": False,
                                                "vision": False}}]
ISO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")  # zod's .datetime()
#: Droid 0.215.0's provider enum for a custom model.
DROID_PROVIDERS = {"anthropic", "openai", "generic-chat-completion-api", "factory", "google",
                   "xai", "voyage", "bedrock-converse"}


@pytest.fixture
def models(monkeypatch):
    monkeypatch.setattr(hi, "baked_models", lambda url: (MODELS, "test models"))


def _rendered(agent: str, path: str) -> dict:
    return json.loads(render(load_spec(agent), context("http://127.0.0.1:8090/v1", MODELS,
                                                       "t"))[path])


def cline_rewrites(path: Path, when: str = "2026-12-04T18:26:49.429Z") -> None:
    """What Cline 3.0.65 does to providers.json on every run: it saves the selected
    provider again (settings keys in its own order, updatedAt stamped, lastUsedProvider
    set) and writes the whole file as JSON.stringify(doc, null, 2) plus a newline."""
    doc = json.loads(path.read_text())
    entry = doc["providers"]["openai-compatible"]
    order = ["provider", "apiKey", "model", "maxTokens", "contextWindow", "baseUrl", "headers"]
    entry["settings"] = {k: entry["settings"][k] for k in order if k in entry["settings"]}
    entry["updatedAt"] = when
    doc["lastUsedProvider"] = "openai-compatible"
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


# --- Cline -------------------------------------------------------------------------------

def test_cline_entry_has_the_shape_cline_reads_and_no_key():
    doc = _rendered("cline", "providers.json")
    assert doc["version"] == 1 and doc["lastUsedProvider"] == "openai-compatible"
    entry = doc["providers"]["openai-compatible"]
    assert set(entry) == {"settings", "updatedAt", "tokenSource"}
    assert ISO_TIME.match(entry["updatedAt"]) and entry["tokenSource"] == "manual"
    settings = entry["settings"]
    assert settings["provider"] == "openai-compatible" and settings["model"] == "local"
    assert settings["baseUrl"] == "http://127.0.0.1:8090/v1"
    assert (settings["contextWindow"], settings["maxTokens"]) == (32768, 4096)
    assert "apiKey" not in settings  # the key comes from $OPENAI_API_KEY at launch
    assert MARKER in settings["headers"]["X-Mlx-Kit"]  # how recovery knows it is ours


def test_cline_launch_passes_the_key_in_the_environment_only(monkeypatch):
    spec = load_spec("cline")
    argv, extra = spec.launch_command("/bin/cline", ["--json", "hi"], local=MODELS[0],
                                      environ={API_KEY_ENV: "sekret"})
    assert argv == ["/bin/cline", "--provider", "openai-compatible", "--model", "local",
                    "--json", "hi"]
    assert extra == {"OPENAI_API_KEY": "sekret"} and "sekret" not in " ".join(argv)


def test_cline_config_dir_follows_its_variables(home, monkeypatch, tmp_path):
    path = lambda: load_spec("cline").file_paths()[0][1]  # noqa: E731
    assert path() == home / ".cline" / "data" / "settings" / "providers.json"
    monkeypatch.setenv("CLINE_DIR", str(tmp_path / "cd"))
    assert path() == tmp_path / "cd" / "data" / "settings" / "providers.json"
    monkeypatch.setenv("CLINE_DATA_DIR", str(tmp_path / "data"))  # the data dir wins
    assert path() == tmp_path / "data" / "settings" / "providers.json"


def test_cline_remove_gives_back_the_bytes_after_cline_rewrote_the_file(
        models, home, dead_url):
    spec = load_spec("cline")
    path = home / ".cline" / "data" / "settings" / "providers.json"
    path.parent.mkdir(parents=True)
    path.write_text(CLINE_PROVIDERS)
    user = json.loads(CLINE_PROVIDERS)

    hi.install(spec, parse_url(dead_url))
    doc = json.loads(path.read_text())
    assert doc["providers"]["anthropic"] == user["providers"]["anthropic"]
    assert doc["providers"]["openai-compatible"]["settings"]["baseUrl"] == f"{dead_url}/v1"
    assert doc["lastUsedProvider"] == "openai-compatible" and doc["modes"] == {}

    cline_rewrites(path)  # a `cline` run: our entry's updatedAt is stamped
    assert hi.status(spec).drift == ()  # a stamp is not an edit of ours
    hi.install(spec, parse_url(dead_url))  # the next `mlx-kit launch cline`
    cline_rewrites(path, "2026-12-05T08:00:00.000Z")

    assert hi.remove(spec).unmerged == [path]
    assert path.read_text() == CLINE_PROVIDERS  # their own provider, key and choice: every byte
    assert "cline" not in manifest.read()["agents"]


def test_cline_an_edit_of_our_entry_still_blocks_removal(models, home, dead_url):
    spec = load_spec("cline")
    hi.install(spec, parse_url(dead_url))
    path = spec.file_paths()[0][1]
    doc = json.loads(path.read_text())
    doc["providers"]["openai-compatible"]["settings"]["model"] = "my-other-model"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    assert hi.status(spec).drift == (path,)
    with pytest.raises(HarnessError) as exc:
        hi.remove(spec)
    assert "providers.openai-compatible" in exc.value.message and "edited" in exc.value.message


def test_stamped_keys_must_lie_inside_an_owned_key():
    data, where = edited_spec("cline", lambda t: t.replace(
        'stamped = ["providers.openai-compatible.updatedAt"]', 'stamped = ["updatedAt"]'))
    with pytest.raises(HarnessError) as exc:
        parse_spec(data, where)
    assert "stamped" in exc.value.message


# --- Droid -------------------------------------------------------------------------------

def test_droid_entry_has_the_shape_droid_reads_and_a_key_reference_only(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "sekret")
    [entry] = _rendered("droid", "settings.json")["customModels"]
    assert entry["provider"] in DROID_PROVIDERS
    assert entry["provider"] == "generic-chat-completion-api"  # Chat Completions
    assert (entry["model"], entry["displayName"]) == ("local", "mlx-kit local")
    assert entry["baseUrl"] == "http://127.0.0.1:8090/v1"
    assert entry["apiKey"] == "${" + API_KEY_ENV + "}"  # Droid expands it from the env
    assert (entry["maxContextLimit"], entry["maxOutputTokens"]) == (32768, 4096)
    assert entry["noImageSupport"] is True
    assert MARKER in entry["extraHeaders"]["X-Mlx-Kit"]


def test_droid_launch_gives_the_key_variable_a_placeholder_only_when_unset():
    spec = load_spec("droid")
    argv, extra = spec.launch_command("/bin/droid", ["exec", "-m", "custom:mlx-kit-local-0",
                                                     "hi"], local=MODELS[0], environ={})
    assert argv == ["/bin/droid", "exec", "-m", "custom:mlx-kit-local-0", "hi"]
    assert extra == {API_KEY_ENV: "mlx-kit"}
    _, extra = spec.launch_command("/bin/droid", [], local=MODELS[0],
                                   environ={API_KEY_ENV: "sekret"})
    assert extra == {}  # the user's own key stays theirs


def test_droid_install_appends_our_model_and_remove_gives_back_the_bytes(models, home,
                                                                         dead_url):
    spec = load_spec("droid")
    path = home / ".factory" / "settings.json"
    path.parent.mkdir()
    path.write_text(DROID_SETTINGS)

    hi.install(spec, parse_url(dead_url))
    doc = json.loads(path.read_text())
    mine, ours = doc["customModels"]
    assert mine == json.loads(DROID_SETTINGS)["customModels"][0]
    assert ours["displayName"] == "mlx-kit local" and ours["baseUrl"] == f"{dead_url}/v1"
    assert (doc["diffMode"], doc["cloudSessionSync"]) == ("unified", False)

    assert hi.remove(spec).unmerged == [path]
    assert path.read_text() == DROID_SETTINGS


def test_droid_config_dir_follows_factory_home_override(home, monkeypatch, tmp_path):
    assert load_spec("droid").file_paths()[0][1] == home / ".factory" / "settings.json"
    monkeypatch.setenv("FACTORY_HOME_OVERRIDE", str(tmp_path / "fh"))
    assert load_spec("droid").file_paths()[0][1] == tmp_path / "fh" / ".factory" / "settings.json"
