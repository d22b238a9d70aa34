"""Pipeline parallelism (`serve --ranks 3 --pipeline`): each rank holds a third of the
layers, and greedy answers equal the single process's, alone and batched (up to a
near-tie: tests/greedy.py).

Llama has no pipeline mode in mlx-lm, so the test serves a llama as a qwen2 checkpoint:
qwen2 is llama with biases on q/k/v, and with those biases zero it computes what the llama
computes, and mlx-lm can split it by layers. The llama is the decisive tiny model with 3
layers (tests/helpers.py): clear greedy steps, ~100x the starter's speed on a world."""

from __future__ import annotations

import concurrent.futures
import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.greedy import check_agreement, greedy_steps
from tests.helpers import start_server, stop, tiny_world_model

pytestmark = pytest.mark.model

QUESTIONS = ["What is the capital of France?", "Name a primary color."]
#: tokens per answer (the tiny model never ends early)
TOKENS = 16


def qwen2_from_llama(llama: Path, out: Path) -> Path:
    """A llama checkpoint's weights as a qwen2 checkpoint (zero q/k/v biases, an index
    file)."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True)
    for f in llama.iterdir():
        if f.name not in ("config.json", "model.safetensors", "model.safetensors.index.json")\
                and not f.name.startswith("."):
            shutil.copy(f.resolve(), out / f.name)
    config = json.loads((llama / "config.json").read_text())
    config.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    (out / "config.json").write_text(json.dumps(config))
    weights = load_file(str((llama / "model.safetensors").resolve()))
    for name in list(weights):
        if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            weights[name[:-len("weight")] + "bias"] = np.zeros(weights[name].shape[0],
                                                               dtype=weights[name].dtype)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "mlx"})
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: "model.safetensors" for n in weights}}))
    return out


@pytest.fixture(scope="module")
def qwen2(hf_home, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("q2")
    llama = tiny_world_model(hf_home, folder / "llama", decisive=True, layers=3)
    return qwen2_from_llama(llama, folder / "qwen2-tiny")


def _ask(root: str, question: str, stream: bool = False) -> str:
    body = {"model": "local", "messages": [{"role": "user", "content": question}],
            "temperature": 0, "max_tokens": TOKENS, "stream": stream}
    if not stream:
        r = httpx.post(f"{root}/v1/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        return r.json()["choices"][0]["message"]["content"]
    text = []
    with httpx.stream("POST", f"{root}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices") or []:
                    text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


def _answers(root: str) -> dict:
    alone = {q: _ask(root, q) for q in QUESTIONS}
    streamed = _ask(root, QUESTIONS[0], stream=True)
    with concurrent.futures.ThreadPoolExecutor(len(QUESTIONS)) as pool:
        batched = dict(zip(QUESTIONS, pool.map(lambda q: _ask(root, q), QUESTIONS)))
    return {"alone": alone, "streamed": streamed, "batched": batched}


def _ready(server) -> dict:
    from tests.helpers import wait_until

    return wait_until(lambda: (h := httpx.get(server.root + "/health", timeout=5).json())
                      ["model_state"] != "loading" and h, timeout=300)


@pytest.fixture(scope="module")
def single(qwen2, tmp_path_factory) -> dict:
    """What a single process answers on ``qwen2`` (``_answers``), each question's greedy
    steps with their leads, and its weights' size; the server is stopped before any
    ranks start (two worlds at once would share 2 cores)."""
    server = start_server(tmp_path_factory.mktemp("one"), None, "--model", str(qwen2))
    try:
        assert _ready(server)["model_state"] == "ready"
        answers = _answers(server.root)
        steps = {q: greedy_steps(server, [{"role": "user", "content": q}], TOKENS)
                 for q in QUESTIONS}
        whole = httpx.get(server.root + "/health").json()["memory"]["weights_bytes"]
    finally:
        stop(server)
    assert all(answers["alone"].values())
    return {"answers": answers, "steps": steps, "whole": whole}


def agrees(single: dict, question: str, got: str) -> None:
    """``got`` is the single process's greedy answer to ``question`` (tests/greedy.py)."""
    text, steps, _ = single["steps"][question]
    check_agreement(single["answers"]["alone"][question], got, lambda: (text, steps))


def test_pipeline_ranks_answer_as_one_process_alone_streamed_and_batched(single, qwen2,
                                                                         tmp_path):
    whole = single["whole"]
    (tmp_path / "three").mkdir()
    ranks = start_server(tmp_path / "three", None, "--model", str(qwen2), "--ranks", "3",
                         "--pipeline")
    try:
        health = _ready(ranks)
        assert health["model_state"] == "ready", health.get("error")
        got = _answers(ranks.root)
        for q in QUESTIONS:
            agrees(single, q, got["alone"][q])
            agrees(single, q, got["batched"][q])
        agrees(single, QUESTIONS[0], got["streamed"])
        world = httpx.get(ranks.root + "/health").json()["distributed"]
    finally:
        stop(ranks)
    assert (world["world_size"], world["backend"], world["mode"]) == (3, "ring", "pipeline")
    # each rank holds 1 of the 3 layers (plus the embeddings every rank keeps)
    shares = [r["memory"]["weights_bytes"] for r in world["ranks"]]
    assert all(0 < s < whole for s in shares), (shares, whole)


def test_a_model_whose_heads_do_not_divide_is_split_by_layers_instead(single, qwen2,
                                                                       tmp_path):
    # 3 heads over 2 ranks: no tensor split, but qwen2 has a pipeline mode: serve picks it
    # and says why, instead of refusing
    (tmp_path / "two").mkdir()
    two = start_server(tmp_path / "two", None, "--model", str(qwen2), "--ranks", "2")
    try:
        health = _ready(two)
        assert health["model_state"] == "ready", health.get("error")
        agrees(single, QUESTIONS[0], _ask(two.root, QUESTIONS[0]))
        world = httpx.get(two.root + "/health").json()["distributed"]
    finally:
        stop(two)
    assert (world["world_size"], world["mode"]) == (2, "pipeline")
    assert ("num_attention_heads is 3, not divisible by 2 ranks; 3 ranks divide it: "
            "splitting") in " ".join(two.log.read_text().split())
