"""/v1/embeddings with a real model: all-MiniLM-L6-v2 (the ``minilm`` fixture) served by
``serve --embed-model`` beside the starter, asked through the official OpenAI SDK.

Its vectors are checked against an independent numpy forward of the same weights
(tests/embed/reference_bert.py), and against what a user would check: a cat is nearer a
kitten than stock prices."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import numpy as np
import pytest

from ruamel.yaml import YAML

from tests.e2e.warnings import assert_no_config_warnings
from tests.helpers import (clean_env, free_port, openai_for, require_binary, run_kit,
                           start_server, stop, wait_until)

pytestmark = pytest.mark.model

SENTENCES = ["a cat sits on the mat", "a kitten rests on a rug",
             "stock prices fell sharply today", "The capital of France is Paris.",
             "def add(a, b):\n    return a + b", "Ünïcödé text, emoji 🐈 and CJK 猫"]


@pytest.fixture(scope="module")
def embed_server(hf_home, minilm, tmp_path_factory):
    """Its own server (a test here kills its embedding process): greedy starter + MiniLM."""
    home = tmp_path_factory.mktemp("embed-home")
    server = start_server(home, hf_home, "--temperature", "0", "--embed-model", str(minilm))
    yield server
    stop(server)


def vectors(server, inputs, **options) -> np.ndarray:
    out = openai_for(server).embeddings.create(model="local-embed", input=inputs, **options)
    return np.array([d.embedding for d in out.data], dtype=np.float32)


def test_vectors_match_an_independent_forward_of_the_same_weights(embed_server, minilm):
    from tests.embed import reference_bert

    ours = vectors(embed_server, SENTENCES)  # the SDK asks for base64 by default
    ref = reference_bert.embed(minilm, SENTENCES)
    cosines = (ours * ref).sum(axis=1) / (np.linalg.norm(ours, axis=1)
                                          * np.linalg.norm(ref, axis=1))
    assert ours.shape == (len(SENTENCES), 384)
    assert cosines.min() >= 0.999, cosines


def test_a_cat_is_nearer_a_kitten_than_stock_prices(embed_server):
    cat, kitten, stock = vectors(embed_server, SENTENCES[:3])
    assert cat @ kitten > 0.5 > 0.2 > cat @ stock


def test_a_batch_of_mixed_lengths_gives_each_input_its_lone_vector(embed_server):
    texts = [f"{SENTENCES[i % 6]} " + "more words " * (i % 17) for i in range(40)]
    batched = vectors(embed_server, texts)
    alone = np.concatenate([vectors(embed_server, [t]) for t in texts[:6]])
    assert (batched[:6] * alone).sum(axis=1).min() >= 0.9999
    assert np.allclose(np.linalg.norm(batched, axis=1), 1, atol=1e-5)


def test_token_ids_embed_like_their_text(embed_server, minilm):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm / "tokenizer.json"))
    tokenizer.no_padding()  # its tokenizer.json pads to 128: padding sent is input
    ids = tokenizer.encode(SENTENCES[0]).ids
    by_ids, by_text = vectors(embed_server, [ids]), vectors(embed_server, [SENTENCES[0]])
    assert float(by_ids[0] @ by_text[0]) >= 0.9999


def test_long_inputs_are_cut_to_the_window_unless_truncate_is_false(embed_server):
    long = "the quick brown fox jumps over the lazy dog " * 60  # ~540 tokens
    r = httpx.post(embed_server.root + "/v1/embeddings",
                   json={"model": "local-embed", "input": long}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 256
    r = httpx.post(embed_server.root + "/v1/embeddings", timeout=60,
                   json={"model": "local-embed", "input": ["ok", long], "truncate": False})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "input.1"
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_chat_and_embeddings_are_served_side_by_side(embed_server):
    client = openai_for(embed_server)
    chat = client.chat.completions.create(model="local", max_tokens=8, messages=[
        {"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in chat.choices[0].message.content
    models = [m.id for m in client.models.list().data]
    assert models[0] == "local" and models[-1] == "local-embed"
    health = embed_server.health()["embeddings"]
    assert health["state"] == "ready" and health["dims"] == 384 and health["window"] == 256
    assert health["pooling"] == "mean" and health["requests_served"] >= 1


@pytest.mark.agent
def test_continue_gets_the_embedding_model_and_pi_leaves_it_out_of_its_chat_models(
        embed_server, tmp_path):
    """The generated configs, with the real binaries: Continue's gains an ``embed`` model
    (its codebase index) that cn loads without a warning; pi's extension lists the
    server's models at start and keeps ``local-embed`` out of the ones it chats with."""
    require_binary("cn")
    pi = require_binary("pi")
    env = clean_env(tmp_path)
    r = run_kit(env, "launch", "continue", "--url", embed_server.v1, "--", "-p",
                "What is the capital of France?", cwd=tmp_path, timeout=400,
                stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-2000:]
    assert_no_config_warnings("continue", r.stdout, r.stderr)
    assert "Paris" in r.stdout
    config = YAML(typ="safe").load((tmp_path / ".continue" / "mlx-kit.yaml").read_text())
    chat, embed = config["models"]
    assert chat["model"] == "local" and chat["roles"] == ["chat", "edit", "apply"]
    assert embed["model"] == "local-embed" and embed["roles"] == ["embed"]
    assert embed["apiBase"] == embed_server.v1 and embed["embedOptions"]["maxChunkSize"] == 256

    assert run_kit(env, "harness", "install", "pi", "--url", embed_server.v1,
                   timeout=60).returncode == 0
    listed = subprocess.run([pi, "--list-models"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert_no_config_warnings("pi", listed.stdout, listed.stderr)
    out = listed.stdout + listed.stderr
    assert "local" in out and "local-embed" not in out, out


def test_a_crashed_embedding_process_is_replaced_and_serves_again(embed_server):
    before = embed_server.health()["embeddings"]
    os.kill(before["pid"], signal.SIGKILL)  # the process this test's server started
    wait_until(lambda: embed_server.health()["embeddings"]["state"] == "failed", 10)
    first = httpx.post(embed_server.root + "/v1/embeddings", timeout=60,
                       json={"model": "local-embed", "input": "after the crash"})
    assert first.status_code == 503, first.text  # the restart is under way
    wait_until(lambda: embed_server.health()["embeddings"]["state"] == "ready", 60)
    after = embed_server.health()["embeddings"]
    assert after["restarts"] == before["restarts"] + 1 and after["pid"] != before["pid"]
    assert vectors(embed_server, ["after the crash"]).shape == (1, 384)
    assert embed_server.health()["status"] == "ok"  # the chat model never noticed


@pytest.mark.parametrize("make", ["missing", "not-an-embedding-model"])
def test_a_bad_embedding_model_stops_the_start_naming_it(make, hf_home, tmp_path):
    folder = tmp_path / make
    if make != "missing":
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "no-such-arch"}))
    proc = subprocess.run([sys.executable, "-m", "kit", "serve", "--port", str(free_port()),
                           "--embed-model", str(folder)], capture_output=True, text=True,
                          env=clean_env(tmp_path, hf_home), timeout=120)
    assert proc.returncode != 0
    assert str(folder) in proc.stderr.replace("\n", "") or make in proc.stderr
    assert "Traceback" not in proc.stderr


def test_fit_counts_the_embedding_model_beside_the_chat_model(hf_home, minilm, tmp_path):
    from kit.models.memory import weights_bytes

    def ceiling(*extra: str) -> int:
        r = run_kit(tmp_path, "fit", "mlx-kit/SmolLM2-135M-Instruct", "--json",
                    "--memory-budget", "8GiB", *extra, hf_home=hf_home)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["ceiling_bytes"]

    assert ceiling() - ceiling("--embed-model", str(minilm)) == weights_bytes(minilm)
