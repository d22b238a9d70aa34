"""Image input in each agent's generated config follows ``local.capabilities.vision``
(the server's /v1/models entry): declared for a vision model, and for a text model left
out (the field absent where we add it only then, false where the agent needs a value).
Agents whose config has no such field render the same either way. Where each field comes
from: docs/agents/<agent>.md."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import json5
import pytest

from kit.harness.formats import loads
from kit.harness.render import context, render
from kit.harness.spec_loader import load_spec


def _models(vision: bool, tools: bool = True) -> list[dict]:
    caps = {"tools": tools, "reasoning": False, "vision": vision, "tool_format": None,
            "reasoning_format": None}
    return [{"id": "local", "name": "org/m (mlx-kit)", "model": "org/m",
             "context_window": 32768, "max_tokens": 4096, "capabilities": caps}]


def _files(agent: str, vision: bool, tools: bool = True) -> dict[str, str]:
    """``{file name: text}`` of the agent's rendered files (names without folders)."""
    out = render(load_spec(agent), context("http://127.0.0.1:8090/v1", _models(vision, tools),
                                           "test"))
    return {path.rsplit("/", 1)[-1]: text for path, text in out.items()}


def _opencode_model(files: dict[str, str]) -> dict:
    return json5.loads(files["mlx-kit.jsonc"])["provider"]["mlx-kit"]["models"]["local"]


def _continue_model(files: dict[str, str]) -> dict:
    return loads("yaml", files["mlx-kit.yaml"], "continue")["models"][0]


def _qwen_generation(files: dict[str, str]) -> dict:
    return json.loads(files["settings.json"])["modelProviders"]["openai"][0][
        "generationConfig"]


def _aider_metadata(files: dict[str, str]) -> dict:
    return json.loads(files["model.metadata.json"])["openai/local"]


def _codex_entry(files: dict[str, str]) -> dict:
    return json.loads(files["mlx-kit.models.json"])["models"][0]


#: agent -> whether its rendered files declare image input
DECLARES_IMAGES: dict[str, Callable[[dict[str, str]], Any]] = {
    "opencode": lambda f: _opencode_model(f).get("attachment") is True
    and "image" in _opencode_model(f).get("modalities", {}).get("input", []),
    "kilo": lambda f: _opencode_model(f).get("attachment") is True
    and "image" in _opencode_model(f).get("modalities", {}).get("input", []),
    "continue": lambda f: "image_input" in _continue_model(f).get("capabilities", []),
    "qwen": lambda f: _qwen_generation(f).get("modalities", {}).get("image") is True,
    "aider": lambda f: _aider_metadata(f).get("supports_vision") is True,
    "codex": lambda f: "image" in _codex_entry(f)["input_modalities"],
    "llm": lambda f: loads("yaml", f["extra-openai-models.yaml"], "llm")[0]["vision"],
    "droid": lambda f: not json.loads(f["settings.json"])["customModels"][0]["noImageSupport"],
    "crush": lambda f: json.loads(f["crush.json"])["providers"]["mlx-kit"]["models"][0][
        "supports_attachments"],
    "zed": lambda f: json.loads(f["settings.json"])["language_models"]["openai_compatible"][
        "mlx-kit"]["available_models"][0]["capabilities"]["images"],
}

#: agents whose config has no field for the model's image input (docs/agents/<agent>.md)
NO_FIELD = ("goose", "claude", "gemini", "copilot", "cline")


@pytest.mark.parametrize("agent", sorted(DECLARES_IMAGES))
@pytest.mark.parametrize("tools", [True, False], ids=["tools", "no-tools"])
def test_image_input_is_declared_exactly_for_a_vision_model(agent, tools):
    assert DECLARES_IMAGES[agent](_files(agent, vision=True, tools=tools)) is True
    assert DECLARES_IMAGES[agent](_files(agent, vision=False, tools=tools)) is False


@pytest.mark.parametrize("agent, absent", [
    ("opencode", lambda f: {"attachment", "modalities"} & set(_opencode_model(f))),
    ("kilo", lambda f: {"attachment", "modalities"} & set(_opencode_model(f))),
    ("qwen", lambda f: {"modalities"} & set(_qwen_generation(f))),
    ("aider", lambda f: {"supports_vision"} & set(_aider_metadata(f))),
], ids=["opencode", "kilo", "qwen", "aider"])
def test_a_text_models_config_has_no_image_field_at_all(agent, absent):
    """The keys added for vision are absent for a text model (not false), so the files of
    existing installs on text models stay as they were."""
    assert absent(_files(agent, vision=False)) == set()


def test_continue_lists_image_input_next_to_tool_use():
    """Continue reads its capabilities list as an override of its own guess by name: both
    or either, and no list at all for a model with neither (as before)."""
    def capabilities(vision: bool, tools: bool) -> list[str] | None:
        return _continue_model(_files("continue", vision, tools)).get("capabilities")

    assert capabilities(True, True) == ["tool_use", "image_input"]
    assert capabilities(True, False) == ["image_input"]
    assert capabilities(False, True) == ["tool_use"]
    assert capabilities(False, False) is None


def test_opencode_gets_its_modalities_shape():
    """opencode's schema: modalities.input and .output are both required lists; text stays
    in input (opencode reads a missing "text" as a model that takes no text)."""
    model = _opencode_model(_files("opencode", vision=True))
    assert model["modalities"] == {"input": ["text", "image"], "output": ["text"]}


@pytest.mark.parametrize("agent", NO_FIELD)
def test_an_agent_without_an_image_field_renders_the_same_for_both(agent):
    assert _files(agent, vision=True) == _files(agent, vision=False)
