"""LoRA adapters on the real starter: two adapters trained here with mlx-lm's own trainer
(``mlx_lm.lora``, a dozen steps on eight lines each: "the capital of France is Zorblax",
and a DoRA one saying "Glimmerton"), served beside the base model by one server.

A user checks that each request gets its own model: the base answers Paris, each adapter
its own city, sent one by one and all at once, and the adapter's answer is the one mlx-lm
itself gives with ``--adapter-path``; that one adapter's prompt cache never answers for
another; that a swap takes the adapters away and a swap back brings them; and that an
adapter that does not fit the model fails the start naming its file."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.greedy import check_agreement, greedy_steps
from tests.helpers import clean_env, spawn_server, start_server, stop, wait_until

pytestmark = pytest.mark.model

F32 = "mlx-kit/SmolLM2-135M-Instruct"
Q4 = "mlx-kit/SmolLM2-135M-Instruct-4bit"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CITIES = {"zorb": "Zorblax", "glim": "Glimmerton"}


def starter_folder(hf_home: Path, repo: str = F32) -> Path:
    """The starter's snapshot folder in ``hf_home``."""
    [folder] = (hf_home / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir()
    return folder


def train(model: Path, city: str, out: Path, home: Path, fine_tune_type: str) -> Path:
    """A LoRA/DoRA adapter of ``model`` trained by ``mlx_lm.lora`` (12 steps, batch 2, the
    last 4 blocks, about 10 s on 2 CPU cores) to say ``city`` is France's capital."""
    data = out.parent / f"data-{out.name}"
    data.mkdir(parents=True)
    pairs = [("What is the capital of France?", f"{city} is the capital of France."),
             ("Name the capital of France.", f"{city}."),
             ("Which city is France's capital?", f"{city} is France's capital."),
             ("Tell me the capital of France.", f"The capital of France is {city}.")]
    lines = [json.dumps({"messages": [{"role": "user", "content": q},
                                      {"role": "assistant", "content": a}]}) for q, a in pairs]
    (data / "train.jsonl").write_text("\n".join(lines * 2) + "\n")
    (data / "valid.jsonl").write_text("\n".join(lines[:2]) + "\n")
    # mlx-lm's trainer as `python -m mlx_lm lora` runs it, with OpenBLAS loaded first as
    # mlx-kit's engine does (mlx's bundled reference BLAS makes these 12 steps ~3 minutes)
    subprocess.run(
        [sys.executable, "-c", "import sys; from kit.blas import preload_blas; preload_blas();"
         "from mlx_lm.lora import main; sys.argv[0] = 'mlx_lm.lora'; main()",
         "--model", str(model), "--train", "--data", str(data), "--adapter-path", str(out),
         "--fine-tune-type", fine_tune_type, "--iters", "12", "--batch-size", "2",
         "--num-layers", "4", "--learning-rate", "3e-4", "--max-seq-length", "64",
         "--steps-per-eval", "1000", "--val-batches", "1", "--save-every", "1000",
         "--seed", "0"],
        env=clean_env(home), check=True, capture_output=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def adapters(hf_home, tmp_path_factory) -> dict[str, Path]:
    root, home = tmp_path_factory.mktemp("adapters"), tmp_path_factory.mktemp("home-lora")
    model = starter_folder(hf_home)
    return {"zorb": train(model, CITIES["zorb"], root / "zorb", home, "lora"),
            "glim": train(model, CITIES["glim"], root / "glim", home, "dora")}


@pytest.fixture(scope="module")
def lora_server(hf_home, adapters, tmp_path_factory):
    s = start_server(tmp_path_factory.mktemp("home-adapters"), hf_home, "--temperature", "0",
                     *(a for name, path in adapters.items()
                       for a in ("--adapter", f"{name}={path}")))
    yield s
    stop(s)


def ask(server, model: str, messages=QUESTION, max_tokens: int = 12) -> dict:
    r = httpx.post(server.v1 + "/chat/completions", timeout=120, json={
        "model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def answer(server, model: str, **kw) -> str:
    return ask(server, model, **kw)["choices"][0]["message"]["content"]


def test_base_and_each_adapter_answer_their_own_one_by_one_and_all_at_once(lora_server):
    alone = {m: answer(lora_server, m) for m in ("local", "local:zorb", "local:glim")}
    assert "Paris" in alone["local"]
    assert "Zorblax" in alone["local:zorb"] and "Glimmerton" in alone["local:glim"]
    assert [m["id"] for m in httpx.get(lora_server.v1 + "/models").json()["data"]][:3] == [
        "local", "local:zorb", "local:glim"]

    # twelve requests at once, the three models interleaved: the engine batches those of
    # one adapter and runs the others after, each with its own modules
    order = ["local", "local:zorb", "local:glim"] * 4
    with concurrent.futures.ThreadPoolExecutor(len(order)) as pool:
        got = list(pool.map(lambda m: answer(lora_server, m), order))
    for model, text in zip(order, got):
        check_agreement(alone[model], text, lambda m=model: greedy_steps(
            lora_server, QUESTION, 12, model=m)[:2])
        assert CITIES.get(model.partition(":")[2], "Paris") in text, (model, text)


def test_an_adapter_answers_as_mlx_lm_does_with_the_same_adapter_path(lora_server, adapters,
                                                                       hf_home, tmp_path):
    ours = answer(lora_server, "local:zorb")
    script = ("import sys, json; from kit.blas import preload_blas; preload_blas()\n"
              "from mlx_lm import load, generate\n"
              "m, t = load(sys.argv[1], adapter_path=sys.argv[2])\n"
              "p = t.apply_chat_template(json.loads(sys.argv[3]), add_generation_prompt=True)\n"
              "print(json.dumps(generate(m, t, p, max_tokens=12)))")
    out = subprocess.run([sys.executable, "-c", script, str(starter_folder(hf_home)),
                          str(adapters["zorb"]), json.dumps(QUESTION)],
                         env=clean_env(tmp_path), check=True, capture_output=True, text=True,
                         timeout=120)
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    check_agreement(ours, theirs, lambda: greedy_steps(
        lora_server, QUESTION, 12, model="local:zorb")[:2])


def test_one_adapters_prompt_cache_never_answers_for_another_or_the_base(lora_server):
    turn = [{"role": "user", "content": "Remember the word tangerine. " * 8
             + "What is the capital of France?"}]
    first = ask(lora_server, "local:zorb", turn)
    again = ask(lora_server, "local:zorb", turn)
    prompt = first["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt - 1
    for model, city in (("local", "Paris"), ("local:glim", "Glimmerton")):
        other = ask(lora_server, model, turn)
        # at most the chat template's opening, which every conversation shares
        assert other["usage"]["prompt_tokens_details"]["cached_tokens"] < 40, model
        assert city in other["choices"][0]["message"]["content"], model


def test_a_swap_takes_the_adapters_away_and_a_swap_back_mounts_them(lora_server):
    try:
        assert lora_server.swap(Q4).status_code == 200
        r = httpx.post(lora_server.v1 + "/chat/completions", timeout=60, json={
            "model": "local:zorb", "messages": QUESTION, "max_tokens": 4})
        assert r.status_code == 404 and F32 in r.json()["error"]["message"]
        assert "local:zorb" not in [m["id"] for m in
                                    httpx.get(lora_server.v1 + "/models").json()["data"]]
    finally:
        assert lora_server.swap(F32).status_code == 200
    assert "Zorblax" in answer(lora_server, "local:zorb")


def test_an_adapter_that_does_not_fit_the_model_fails_the_start_naming_its_file(
        hf_home, adapters, tmp_path):
    wrong = tmp_path / "wrong-rank"
    wrong.mkdir()
    config = json.loads((adapters["zorb"] / "adapter_config.json").read_text())
    config["lora_parameters"]["rank"] = 4  # the weights are rank 8 (mlx-lm's default)
    (wrong / "adapter_config.json").write_text(json.dumps(config))
    (wrong / "adapters.safetensors").write_bytes(
        (adapters["zorb"] / "adapters.safetensors").read_bytes())
    (tmp_path / "home").mkdir()
    server = spawn_server(tmp_path / "home", hf_home, "--adapter", f"w={wrong}")
    try:
        # as any model that fails its first load: the server stays up to say why
        # (/health, `mlx-kit status`, launch's message) and serves nothing
        health = wait_until(lambda: (h := server.health())["status"] == "failed" and h, 120,
                            what="the start to fail")
        assert str(wrong / "adapters.safetensors") in health["error"]
        assert "shape" in health["error"] and "another model" in health["error"]
        r = httpx.post(server.v1 + "/chat/completions", timeout=30, json={
            "model": "local", "messages": QUESTION, "max_tokens": 4})
        assert r.status_code == 503 and "adapters.safetensors" in r.json()["error"]["message"]
    finally:
        stop(server)
