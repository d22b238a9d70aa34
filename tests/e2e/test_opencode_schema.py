"""Our opencode config validated by opencode itself, offline. The JSON schema that
"$schema" names (opencode.ai/config.json) is published from opencode's own config
validator, which the binary carries: `opencode debug config` loads the user's config plus
OPENCODE_CONFIG, validates it and prints the resolved config, or exits 1 with
"Configuration is invalid" and the field. It drops keys it does not know without a word,
so the check also compares the resolved config with ours: a key of ours missing there is a
key opencode does not know (a typo, or a field renamed in a later opencode).

Both halves are shown to bite: a wrong type is refused, a misspelt key is seen as dropped."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import json5
import pytest

from kit.harness.render import context, render
from kit.harness.spec_loader import load_spec
from tests.helpers import clean_env, free_port, require_binary, run_kit


CAPS = {"tools": True, "reasoning": False, "vision": False}
MODELS = [{"id": "local", "name": "local", "model": "mlx-community/Qwen3-4B-4bit",
           "context_window": 40960, "max_tokens": 8192, "capabilities": CAPS}]
#: Masked by `debug config` (the value of our {env:MLX_KIT_API_KEY}).
SECRET = "***"


def parse_jsonc(text: str) -> Any:
    """Our file as opencode reads it: JSON with comments, and a character beyond U+FFFF
    (written as a surrogate-pair escape) as one character, which json5 leaves in halves."""
    def joined(value: Any) -> Any:
        if isinstance(value, str):
            return value.encode("utf-16", "surrogatepass").decode("utf-16")
        if isinstance(value, dict):
            return {joined(k): joined(v) for k, v in value.items()}
        return [joined(v) for v in value] if isinstance(value, list) else value
    return joined(json5.loads(text))


def resolved(opencode: str, config: Path, home: Path) -> subprocess.CompletedProcess:
    """`opencode debug config` with OPENCODE_CONFIG=config, in a throwaway HOME and an empty
    project folder (no config of the user's or of a project is read)."""
    project = home / "project"
    project.mkdir(exist_ok=True)
    return subprocess.run([opencode, "debug", "config"],
                          env=clean_env(home, OPENCODE_CONFIG=str(config)), cwd=project,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def dropped(ours: Any, theirs: Any, where: str = "") -> list[str]:
    """The keys of ours that opencode's resolved config lacks or holds another value for."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return [miss for key, value in ours.items()
                for miss in ([f"{where}{key}"] if key not in theirs else
                             dropped(value, theirs[key], f"{where}{key}."))]
    if ours != theirs and theirs != SECRET:
        return [f"{where.rstrip('.')}: {ours!r} -> {theirs!r}"]
    return []


def validate(opencode: str, text: str, home: Path) -> tuple[dict, dict]:
    """Write ``text`` as the config; return (ours parsed, opencode's resolved config)."""
    config = home / "mlx-kit.jsonc"
    config.write_text(text)
    r = resolved(opencode, config, home)
    assert r.returncode == 0, r.stderr[-2000:]
    return parse_jsonc(text), json.loads(r.stdout)


def _render(models=MODELS, url: str = "http://127.0.0.1:8090/v1") -> str:
    [text] = render(load_spec("opencode"), context(url, models, "test")).values()
    return text


def test_the_installed_config_passes_opencodes_validation_and_keeps_every_key(tmp_path):
    """Installed as a user would (no server running: the baked fallback list), then
    loaded by opencode exactly as `mlx-kit launch opencode` points it at the file."""
    opencode = require_binary("opencode")
    env = clean_env(tmp_path)
    r = run_kit(env, "harness", "install", "opencode", "--url", f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 0, r.stderr[-2000:]
    installed = tmp_path / ".config" / "opencode" / "mlx-kit.jsonc"

    r = resolved(opencode, installed, tmp_path)

    assert r.returncode == 0, r.stderr[-2000:]
    ours, theirs = parse_jsonc(installed.read_text()), json.loads(r.stdout)
    assert dropped(ours, theirs) == []
    assert theirs["model"] == "mlx-kit/local"


def test_a_model_name_with_quotes_newlines_and_references_stays_literal(tmp_path):
    """Quotes, backslashes, newlines, U+2028, emoji, and opencode's own {env:...} and
    {file:...} references (which opencode substitutes in the raw text: a {file:} that does
    not exist made it refuse the whole config) reach opencode as plain text."""
    opencode = require_binary("opencode")
    name = 'a "quoted" \\ back\nslash\u2028 🦙 {env:HOME} {file:/nonexistent} ${HOME} {{x}}'
    url = "http://127.0.0.1:8090/{env:PATH}/v1"
    ours, theirs = validate(opencode, _render([dict(MODELS[0], model=name)], url), tmp_path)
    assert dropped(ours, theirs) == []
    provider = theirs["provider"]["mlx-kit"]
    assert provider["models"]["local"]["name"] == f"local ({name})"
    assert provider["options"]["baseURL"] == url


def test_a_vision_models_image_input_passes_validation_and_is_kept(tmp_path):
    """For a vision model the file adds attachment and modalities: opencode's validator
    accepts them and its resolved config keeps them (what makes it send images)."""
    opencode = require_binary("opencode")
    caps = dict(CAPS, vision=True)
    ours, theirs = validate(opencode, _render([dict(MODELS[0], capabilities=caps)]), tmp_path)
    assert dropped(ours, theirs) == []
    local = theirs["provider"]["mlx-kit"]["models"]["local"]
    assert local["attachment"] is True
    assert local["modalities"] == {"input": ["text", "image"], "output": ["text"]}


@pytest.mark.parametrize("edit, message", [
    (('"context": 40960', '"context": "big"'),
     'Expected number, got "big" provider.mlx-kit.models.local.limit.context'),
    (('"tool_call": true', '"tool_call": "yes"'), "provider.mlx-kit.models.local.tool_call"),
    (('"model": "mlx-kit/local"', '"model": 5'), "model"),
    (('"npm": "@ai-sdk/openai-compatible"', '"npm": ["x"]'), "provider.mlx-kit.npm"),
], ids=["context-not-a-number", "tool-call-not-a-bool", "model-not-a-string", "npm-not-a-string"])
def test_opencode_refuses_a_config_with_a_wrong_type(tmp_path, edit, message):
    """The validator bites: the same file with one value of the wrong type is refused,
    naming the field."""
    opencode = require_binary("opencode")
    text = _render()
    assert edit[0] in text
    config = tmp_path / "mlx-kit.jsonc"
    config.write_text(text.replace(*edit))

    r = resolved(opencode, config, tmp_path)

    assert r.returncode != 0
    error = re.sub(r"\x1b\[[0-9;]*m", "", r.stderr)
    assert "Configuration is invalid" in error and message in error, error[-2000:]


@pytest.mark.parametrize("edit, missing", [
    (('"tool_call": true', '"tool_calls": true'), "provider.mlx-kit.models.local.tool_calls"),
    (('"small_model"', '"smallModel"'), "smallModel"),
    (('"limit": {', '"limits": {'), "provider.mlx-kit.models.local.limits"),
], ids=["misspelt-model-field", "misspelt-top-level-key", "misspelt-limit"])
def test_a_key_opencode_does_not_know_is_seen_as_dropped(tmp_path, edit, missing):
    """opencode accepts the file but silently drops an unknown key: the comparison with the
    resolved config is what catches it."""
    opencode = require_binary("opencode")
    text = _render()
    assert edit[0] in text
    ours, theirs = validate(opencode, text.replace(*edit), tmp_path)
    assert missing in dropped(ours, theirs)
