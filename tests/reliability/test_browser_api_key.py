"""An API key on loopback too (issue 11 item 3): every agent's config takes the server's key
from MLX_KIT_API_KEY, so `launch` with the variable set reaches a server started with
--api-key (the server that `launch` starts reads the same variable). Render level, for every
shipped spec but pi (its template is checked by its own tests); the real agents against a
keyed server are in tests/e2e/test_keyed_server.py."""

from __future__ import annotations

import pytest

from kit.harness.render import context, render
from kit.harness.spec_loader import all_specs

KEY = "sekret-key-0123"
CAPS = {"tools": True, "reasoning": False, "vision": False}
MODELS = [{"id": "local", "name": "local", "model": "m", "context_window": 8192,
           "max_tokens": 1024, "capabilities": CAPS}]
LOCAL = MODELS[0]
ROOT = "http://127.0.0.1:8090"  # {root_url} (Gemini CLI takes the server root from the env)


def _agents() -> list[str]:
    return sorted(name for name in all_specs() if name != "pi")


@pytest.mark.parametrize("agent", _agents())
def test_every_agent_takes_the_key_from_MLX_KIT_API_KEY(agent, monkeypatch, tmp_path):
    """One of: the launch passes the key's value (aider, claude, llm), the config names the
    variable the agent reads it from (opencode, qwen, crush, goose, codex, continue), or the
    agent derives that name itself and the launch only fills it in when unset (zed)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("MLX_KIT_API_KEY", KEY)
    spec = all_specs()[agent]
    files = render(spec, context("http://127.0.0.1:8090/v1", MODELS, "test"))
    _, env = spec.launch_command("/bin/" + agent, [], local=LOCAL, root_url=ROOT,
                                 environ={"MLX_KIT_API_KEY": KEY})
    passes_value = KEY in env.values()
    names_variable = any("MLX_KIT_API_KEY" in text for text in files.values())
    reads_variable = "MLX_KIT_API_KEY" in dict(spec.launch_env_defaults)
    assert passes_value or names_variable or reads_variable, agent
    # the key never lands in a file, and no launch value replaces it with another
    assert not any(KEY in text for text in files.values())
    keyish = {k: v for k, v in env.items() if k.endswith(("_KEY", "_TOKEN"))}
    assert set(keyish.values()) <= {KEY}, keyish


@pytest.mark.parametrize("agent", _agents())
def test_a_keyless_launch_still_gives_agents_a_placeholder_key(agent, monkeypatch, tmp_path):
    """Without MLX_KIT_API_KEY (a keyless server ignores keys) agents that refuse to run
    without one get "mlx-kit", and no config names a key it would then require."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("MLX_KIT_API_KEY", raising=False)
    spec = all_specs()[agent]
    files = render(spec, context("http://127.0.0.1:8090/v1", MODELS, "test"))
    _, env = spec.launch_command("/bin/" + agent, [], local=LOCAL, environ={},
                                 root_url=ROOT)
    for name in ("OPENAI_API_KEY", "ANTHROPIC_AUTH_TOKEN"):
        assert env.get(name, "mlx-kit") == "mlx-kit"
    assert not any("api_key_name" in text for text in files.values())
