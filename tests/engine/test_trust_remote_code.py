"""``--trust-remote-code``: a checkpoint's own Python code (a tokenizer named by ``auto_map``,
as Kimi's are) runs only when the user asks for it, and a load that needs it says so."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest


from kit.config import EngineConfig
from kit.engine.decode.engine import Engine
from kit.engine.decode.slot import ModelSlot
from kit.models.model_config import remote_code
from kit.errors import ModelError
from kit.models.resolve import ModelInfo
from tests.helpers import clean_env, free_port, spawn_server, stop

# The tokenizer a checkpoint ships as code: the starter's own fast tokenizer, subclassed, and
# importing it leaves a file behind, so a test can tell whether the model's code ran.
CUSTOM_TOKENIZER = '''
import os
from pathlib import Path

from transformers import PreTrainedTokenizerFast

Path(os.environ["HOME"], "the-models-code-ran").touch()


class CustomTokenizer(PreTrainedTokenizerFast):
    pass
'''


def _info(folder: Path) -> ModelInfo:
    return ModelInfo(id="org/custom", path=folder, context_window=2048)


@pytest.mark.parametrize("trust", [False, True])
def test_the_option_reaches_mlx_lms_load(tmp_path, monkeypatch, trust):
    # mlx-lm's load is replaced by a recorder: what is tested is the arguments it gets,
    # and no checkpoint that needs remote code can be downloaded here
    import mlx_lm

    calls = []

    def load(path, **kwargs):
        calls.append((path, kwargs))
        raise RuntimeError("recorded")

    monkeypatch.setattr(mlx_lm, "load", load)
    engine = Engine(_info(tmp_path), EngineConfig(trust_remote_code=trust))  # what the engine child builds
    with pytest.raises(ModelError):
        engine.slot.load(_info(tmp_path), replacing=0)
    assert calls == [(str(tmp_path), {"tokenizer_config": {"trust_remote_code": trust},
                                      "trust_remote_code": trust})]


def test_remote_code_names_what_in_the_folder_is_code(tmp_path):
    assert remote_code(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_file": "arch.py"}))
    assert remote_code(tmp_path) == "its architecture (arch.py, model_file in config.json)"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}}))
    assert remote_code(tmp_path) == ("its tokenizer (tokenization_kimi.TikTokenTokenizer, "
                                     "auto_map in tokenizer_config.json)")
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    assert remote_code(tmp_path) == "its architecture (arch.py, model_file in config.json)"


def _custom_tokenizer_model(hf_home: Path, folder: Path) -> Path:
    """The starter's weights behind a tokenizer that is code in the model's folder."""
    from huggingface_hub import snapshot_download

    from kit.models.starter import STARTER_ID

    src = Path(snapshot_download(STARTER_ID, cache_dir=hf_home / "hub", local_files_only=True))
    folder.mkdir(parents=True)
    for f in src.iterdir():
        if not f.name.startswith(".") and f.name != "tokenizer_config.json":
            (folder / f.name).symlink_to(f.resolve())
    config = json.loads((src / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "CustomTokenizer"
    config["auto_map"] = {"AutoTokenizer": [None, "tokenization_custom.CustomTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "tokenization_custom.py").write_text(CUSTOM_TOKENIZER)
    return folder


def _settled_health(server, timeout: float = 120) -> dict:
    """/health once the first load ended (ok or failed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.proc.poll() is None, server.log.read_text()[-2000:]
        try:
            body = httpx.get(server.root + "/health", timeout=2).json()
            if body.get("model_state") not in ("loading", None):
                return body
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    raise TimeoutError(server.log.read_text()[-2000:])


def test_a_tokenizer_shipped_as_code_loads_only_with_trust_remote_code(hf_home, tmp_path):
    model = _custom_tokenizer_model(hf_home, tmp_path / "custom-model")
    home = tmp_path / "home"
    home.mkdir()
    server = spawn_server(home, hf_home, "--model", str(model))
    try:
        health = _settled_health(server)
    finally:
        stop(server)
    assert health["status"] == "failed"
    assert "--trust-remote-code" in health["error"]
    assert "its tokenizer (tokenization_custom.CustomTokenizer, auto_map in " \
           "tokenizer_config.json) is Python code shipped with the model" in health["error"]
    assert not (home / "the-models-code-ran").exists()  # refused, and nothing of it ran

    server = spawn_server(home, hf_home, "--model", str(model), "--trust-remote-code",
                          "--temperature", "0")
    try:
        assert _settled_health(server)["status"] == "ok"
        r = httpx.post(server.v1 + "/chat/completions", timeout=120, json={
            "model": "local", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    finally:
        stop(server)
    assert (home / "the-models-code-ran").exists()


def test_the_server_launch_starts_gets_trust_remote_code(hf_home, tmp_path):
    # launch starts its server through kit.daemon.ensure_server, with serve_args
    model = _custom_tokenizer_model(hf_home, tmp_path / "custom-model")
    home = tmp_path / "home"
    home.mkdir()
    env, url = clean_env(home, hf_home), f"http://127.0.0.1:{free_port()}"
    code = ("from kit.daemon import ensure_server; from kit.urls import parse_url; "
            f"p, started = ensure_server(parse_url({url!r}), {str(model)!r}, 120, "
            "serve_args=['--trust-remote-code']); print(started, p.health.status)")
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=180)
        assert out.stdout.split() == ["True", "ok"], out.stderr[-2000:]
    finally:
        subprocess.run([sys.executable, "-m", "kit", "stop", "--url", url], env=env,
                       capture_output=True, timeout=60)
    assert (home / "the-models-code-ran").exists()
