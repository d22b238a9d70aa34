"""LoRA adapters on the real starter: two adapters trained here with mlx-lm's own trainer
(``mlx_lm.lora``, six steps on eight lines each: "the capital of France is Zorblax",
and a DoRA one saying "Glimmerton"), served beside the base model by one server.

A user checks that each request gets its own model: the base answers Paris, each adapter
its own city, sent one by one and all at once, and the adapter's answer is the one mlx-lm
itself gives with ``--adapter-path``; that one adapter's prompt cache never answers for
another; that a swap takes the adapters away and a swap back brings them; and that an
adapter that does not fit the model fails the start naming its file."""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.greedy import check_agreement, greedy_steps
from tests.helpers import clean_env, spawn_server, start_server, stop, wait_until
from tests.lora import train_adapter
from tests.server.test_metrics import value

pytestmark = pytest.mark.model

F32 = "mlx-kit/SmolLM2-135M-Instruct"
Q4 = "mlx-kit/SmolLM2-135M-Instruct-4bit"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CITIES = {"zorb": "Zorblax", "glim": "Glimmerton"}


def starter_folder(hf_home: Path, repo: str = F32) -> Path:
    """The starter's snapshot folder in ``hf_home``."""
    [folder] = (hf_home / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir()
    return folder


@pytest.fixture(scope="module")
def adapters(hf_home, tmp_path_factory) -> dict[str, Path]:
    root, home = tmp_path_factory.mktemp("adapters"), tmp_path_factory.mktemp("home-lora")
    model = starter_folder(hf_home)
    env = clean_env(home)
    return {"zorb": train_adapter(model, CITIES["zorb"], root / "zorb", env),
            "glim": train_adapter(model, CITIES["glim"], root / "glim", env, "dora")}


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

    # six requests at once, the three models interleaved: the engine batches those of
    # one adapter and runs the others after, each with its own modules
    order = ["local", "local:zorb", "local:glim"] * 2
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
        assert "shape" in health["error"] and "rank 4" in health["error"]
        r = httpx.post(server.v1 + "/chat/completions", timeout=30, json={
            "model": "local", "messages": QUESTION, "max_tokens": 4})
        assert r.status_code == 503 and "adapters.safetensors" in r.json()["error"]["message"]
    finally:
        stop(server)


COUNT = [{"role": "user", "content": "Count from 1 to 100, separated by commas."}]


def queued(server) -> float | None:
    """The requests waiting for the engine (/metrics' queue depth)."""
    return value(httpx.get(server.root + "/metrics", timeout=5).text, "mlx_kit_queue_depth")


def engine_order(server, ids: dict[str, str]) -> list[str]:
    """The engine's starts and ends of the requests ``ids`` (name -> response id), in the
    order its log wrote them: "a1+" when a1 was prepared, "a1-" when it completed.

    The engine's own order, not the client's: a client's reader threads can see one
    stream close and another's first token in either order when the CPU is busy (CI
    once saw a1's close 0.2 ms after b1's first token, b1 having started ~0.2 s later)."""
    names = {rid: name for name, rid in ids.items()}
    pattern = re.compile(r"mlx_kit\.engine: (chatcmpl-\w+): (starts: |mlx-kit/)")
    order = []
    for line in server.log_text().splitlines():
        m = pattern.search(line)
        if m and m[1] in names:
            order.append(names[m[1]] + ("+" if m[2] == "starts: " else "-"))
    return order


def test_a_request_held_at_an_adapter_barrier_keeps_its_place_in_line(lora_server):
    """Regression: a request for another adapter that waited while a batch ran was put
    behind every request of the running adapter that arrived later, for as long as they
    kept coming."""
    ids: dict[str, str] = {}
    started = {name: threading.Event() for name in ("a1", "a2", "b1", "a3", "b2")}

    def stream(name: str, model: str, max_tokens: int) -> None:
        # EOS (<|im_end|>, id 2) banned: each decodes all its max_tokens, so the first
        # batch is still running when b1 and a3 arrive
        body = {"model": model, "messages": COUNT, "max_tokens": max_tokens,
                "temperature": 0, "stream": True, "logit_bias": {"2": -100}}
        with httpx.stream("POST", lora_server.v1 + "/chat/completions", json=body,
                          timeout=120) as r:
            for line in r.iter_lines():
                if '"content"' in line and not started[name].is_set():
                    ids[name] = json.loads(line.removeprefix("data: "))["id"]
                    started[name].set()

    def go(name, model, max_tokens):
        t = threading.Thread(target=stream, args=(name, model, max_tokens))
        t.start()
        return t

    threads = [go("a1", "local:zorb", 40), go("a2", "local:zorb", 40)]
    assert started["a1"].wait(60) and started["a2"].wait(60)
    threads.append(go("b1", "local", 24))  # held at the barrier while the zorb batch runs
    wait_until(lambda: queued(lora_server) == 1, 30, what="b1 queued")
    threads.append(go("a3", "local:zorb", 4))  # behind b1, still during that batch
    wait_until(lambda: queued(lora_server) == 2, 30, what="a3 queued")
    assert started["b1"].wait(60)
    threads.append(go("b2", "local", 24))  # arrives while b1 decodes, after a3
    for t in threads:
        t.join(120)
    assert sorted(ids) == ["a1", "a2", "a3", "b1", "b2"]
    order = engine_order(lora_server, ids)
    assert sorted(order) == sorted(n + e for n in ids for e in "+-"), order
    at = order.index
    # never in one batch: b1 starts once the zorb batch has ended
    assert at("a1-") < at("b1+") and at("a2-") < at("b1+"), order
    # a3 (behind b1) starts before b2, which arrived after it, and ends first (4 tokens
    # against 24). Had b2 passed a3, a3 would only have started once b2 ended.
    assert at("b1+") < at("a3+") < at("b2+"), order
    assert at("a3-") < at("b2-"), order
