"""Models behind `local`: hot swap between two real models (the f32 and 4-bit starters),
swap under load, failed swaps, aliases, swap on request, TTL unload/reload, the context
window, and the model commands (models, fit, pull, swap)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.helpers import clean_env, free_port, run_kit, start_server, stop, wait_until

F32 = "mlx-kit/SmolLM2-135M-Instruct"
Q4 = "mlx-kit/SmolLM2-135M-Instruct-4bit"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def chat(server, model="local", messages=QUESTION, **kw) -> httpx.Response:
    return httpx.post(server.v1 + "/chat/completions", timeout=180,
                      json={"model": model, "messages": messages, "max_tokens": 10, **kw})


@pytest.fixture(scope="module")
def f32_server(hf_home, tmp_path_factory):
    """One server on the f32 starter for the tests that leave it as it is (no swap
    succeeds on it): greedy, with an alias for the alias test."""
    s = start_server(tmp_path_factory.mktemp("home-f32"), hf_home, "--temperature", "0",
                     "--alias", "my-assistant=local")
    yield s
    stop(s)


@pytest.fixture(scope="module")
def swapping_server(hf_home, tmp_path_factory):
    """One greedy server for the tests that swap its model (each starts from whichever
    starter it finds loaded), with swap on request."""
    s = start_server(tmp_path_factory.mktemp("home-swapping"), hf_home, "--temperature",
                     "0", "--swap-on-request")
    yield s
    stop(s)


@pytest.fixture(scope="module")
def q4_budget_server(hf_home, tmp_path_factory):
    """A server on the 4-bit starter with a 600 MB memory budget (the f32 starter does not
    fit) and no --temperature (the model's own sampling defaults)."""
    s = start_server(tmp_path_factory.mktemp("home-q4"), hf_home, "--model", Q4,
                     "--memory-budget", "600MB")
    yield s
    stop(s)


def other_starter(server) -> str:
    """The starter ``server`` has not loaded."""
    return Q4 if server.health()["model"] == F32 else F32


def test_swap_under_load_fails_no_request_and_keeps_one_model(swapping_server):
    s = swapping_server
    if s.health()["model"] != F32:
        assert s.swap(F32).status_code == 200
    swaps = s.health()["swaps"]
    long_stream: dict = {"models": set(), "text": "", "lines": []}
    first_token = threading.Event()

    def stream_on_a():
        with httpx.stream("POST", s.v1 + "/chat/completions", timeout=180, json={
                "model": "local", "max_tokens": 80, "stream": True,
                "messages": [{"role": "user", "content": "Write a long story about a dragon."}]}) as r:
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                long_stream["lines"].append(line)
                if line != "data: [DONE]":
                    chunk = json.loads(line[5:])
                    long_stream["models"].add(chunk["model"])
                    for c in chunk["choices"]:
                        long_stream["text"] += c["delta"].get("content") or ""
                        if c["delta"].get("content"):
                            first_token.set()

    a = threading.Thread(target=stream_on_a)
    a.start()
    assert first_token.wait(60)
    swap_result: dict = {}
    w = threading.Thread(target=lambda: swap_result.update(r=s.swap(Q4)))
    w.start()
    # the swap is queued behind A (the engine has it); these 5 queue behind the swap
    wait_until(lambda: s.health()["swaps_pending"] == 1, 60, what="the swap being queued")
    results: list = [None] * 5
    during = [threading.Thread(target=lambda i=i: results.__setitem__(i, chat(s)))
              for i in range(5)]
    for t in during:
        t.start()
    for t in [a, w, *during]:
        t.join(180)

    # A's stream completed intact, on the old model
    assert long_stream["lines"][-1] == "data: [DONE]"
    assert long_stream["models"] == {F32} and len(long_stream["text"]) > 20
    # the swap succeeded, and every request sent during it ran on the new model
    assert swap_result["r"].status_code == 200, swap_result["r"].text
    assert swap_result["r"].json()["model"] == Q4 and swap_result["r"].json()["previous"] == F32
    assert [r.status_code for r in results] == [200] * 5
    assert {r.json()["model"] for r in results} == {Q4}
    # exactly one resident model: the 4-bit weights (~115 MB), not also the f32 (~538 MB)
    h = s.health()
    assert h["model"] == Q4 and h["swaps"] == swaps + 1
    mem = h["memory"]
    assert mem["weights_bytes"] < 150e6
    assert mem["active_bytes"] < mem["weights_bytes"] + 60e6
    # /v1/models names the new model behind local
    data = httpx.get(s.v1 + "/models").json()["data"]
    assert data[0]["id"] == "local" and data[0]["model"] == Q4


def test_failed_swap_leaves_the_old_model_serving(f32_server):
    r = f32_server.swap("nobody/no-such-model")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and F32 in err["message"]
    ok = chat(f32_server)
    assert ok.status_code == 200 and ok.json()["model"] == F32


def test_swap_to_the_loaded_model_changes_nothing(f32_server):
    r = f32_server.swap(F32)
    assert r.status_code == 200 and r.json()["changed"] is False
    assert f32_server.health()["swaps"] == 0


def test_a_model_that_does_not_fit_is_refused_with_numbers(q4_budget_server, hf_home):
    s = q4_budget_server
    r = s.swap(F32)
    assert r.status_code == 507
    err = r.json()["error"]
    assert err["code"] == "insufficient_memory"
    assert "513.13 MiB" in err["message"] and "KV cache" in err["message"]  # the numbers
    cli = run_kit(clean_env(s.home, hf_home), "swap", F32, "--url", s.root)
    assert cli.returncode == 5 and "513.13 MiB" in cli.stderr  # 5: does not fit
    ok = chat(s)
    assert ok.status_code == 200 and ok.json()["model"] == Q4


def test_real_id_not_loaded_is_404_unless_swap_on_request(f32_server, swapping_server):
    r = chat(f32_server, model=Q4)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    s = swapping_server
    other = other_starter(s)
    swaps = s.health()["swaps"]
    r = chat(s, model=other, max_tokens=20)
    assert r.status_code == 200 and r.json()["model"] == other
    assert "Paris" in r.json()["choices"][0]["message"]["content"]
    assert s.health()["swaps"] == swaps + 1
    unknown = chat(s, model="someone/not-on-this-machine")  # never a download
    assert unknown.status_code == 404
    assert "local" in unknown.json()["error"]["message"]


def test_aliases_route_agent_model_names_to_local(f32_server):
    s = f32_server  # started with --alias my-assistant=local
    for name in ("claude-3-5-haiku-latest", "gpt-4o", "my-assistant"):
        r = chat(s, model=name)
        assert r.status_code == 200, (name, r.text)
        assert r.json()["model"] == F32


def test_ttl_unloads_when_idle_and_reloads_on_the_next_request(hf_home, tmp_path):
    s = start_server(tmp_path, hf_home, "--model", Q4, "--ttl", "1.5")
    try:
        assert chat(s).status_code == 200
        deadline = time.monotonic() + 20
        while s.health()["model_state"] != "unloaded" and time.monotonic() < deadline:
            time.sleep(0.2)
        h = s.health()
        assert h["model_state"] == "unloaded" and h["status"] == "ok"
        assert h["memory"]["active_bytes"] < 10e6  # weights released
        r = chat(s)
        assert r.status_code == 200 and r.json()["model"] == Q4
        h = s.health()
        assert h["reloads"] == 1 and h["unloads"] >= 1
        assert "unloaded" in s.log_text() and "reloaded" in s.log_text()
    finally:
        stop(s)


def test_prompt_beyond_the_context_window_is_400_and_server_stays_up(f32_server):
    long = [{"role": "user", "content": "hello " * 9000}]
    r = chat(f32_server, messages=long, max_tokens=None)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and "8192" in err["message"]
    r = chat(f32_server, max_tokens=8190)  # short prompt, too many tokens asked
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert chat(f32_server).status_code == 200


def test_models_json_lists_both_starters_and_marks_local(f32_server, hf_home, tmp_path):
    env = clean_env(tmp_path, hf_home)
    r = run_kit(env, "models", "--json", "--url", f32_server.root)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    by_id = {m["id"]: m for m in out["models"]}
    assert out["local"] == F32 and by_id[F32]["local"] and not by_id[Q4]["local"]
    assert by_id[Q4]["quantization"] == "4-bit g32" and by_id[F32]["quantization"] == "float32"
    assert by_id[Q4]["context_window"] == 8192 and by_id[Q4]["loadable"]
    assert 100e6 < by_id[Q4]["size_bytes"] < by_id[F32]["size_bytes"]


def test_models_lists_broken_entries_with_a_reason(hf_home, tmp_path):
    import shutil

    hf = tmp_path / "hf"
    shutil.copytree(hf_home, hf, symlinks=True)
    broken = hf / "hub" / "models--someone--broken" / "snapshots" / "abc"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text('{"model_type": "llama"}')
    (hf / "hub" / "models--someone--broken" / "refs").mkdir()
    (hf / "hub" / "models--someone--broken" / "refs" / "main").write_text("abc")
    r = run_kit(clean_env(tmp_path, hf), "models", "--json", "--url",
                f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 0, r.stderr
    entry = {m["id"]: m for m in json.loads(r.stdout)["models"]}["someone/broken"]
    assert entry["loadable"] is False and "safetensors" in entry["reason"]


def test_swap_and_fit_commands(swapping_server, hf_home):
    s = swapping_server
    env = clean_env(s.home, hf_home)
    other = other_starter(s)
    r = run_kit(env, "swap", other, "--url", s.root)
    assert r.returncode == 0, r.stderr
    assert f"local -> {other}" in r.stdout
    bad = run_kit(env, "swap", "nobody/nothing", "--url", s.root)
    assert bad.returncode == 1 and "not found" in bad.stderr and "Traceback" not in bad.stderr
    fit = run_kit(env, "fit", F32, "--ctx", "2048")
    assert fit.returncode == 0 and "513.13 MiB" in fit.stdout and "fits" in fit.stdout
    huge = run_kit(env, "fit", F32, "--ctx", "100000000")
    assert huge.returncode == 5 and "does NOT fit" in huge.stdout  # 5: does not fit


def test_pull_offline_is_one_clear_line(tmp_path):
    env = clean_env(tmp_path, tmp_path / "hf", HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    r = run_kit(env, "pull", "mlx-community/Qwen2.5-0.5B-Instruct-4bit")
    assert r.returncode == 1
    assert "error: cannot download mlx-community/Qwen2.5-0.5B-Instruct-4bit: the Hugging Face " \
           "hub is not reachable" in r.stderr
    assert "Traceback" not in r.stderr
    bad = run_kit(env, "pull", "not a repo")
    assert bad.returncode == 1 and "ORG/NAME" in bad.stderr


def test_pull_of_a_starter_id_builds_it_locally(hf_home, tmp_path):
    import shutil

    hf = tmp_path / "hf"
    shutil.copytree(hf_home, hf, symlinks=True)
    shutil.rmtree(hf / "hub" / "models--mlx-kit--SmolLM2-135M-Instruct-4bit")
    r = run_kit(clean_env(tmp_path, hf), "pull", Q4)
    assert r.returncode == 0, r.stderr
    assert "converting" in r.stderr and Q4 in r.stdout


def test_swap_to_a_corrupt_model_fails_and_the_old_one_keeps_serving(f32_server, hf_home,
                                                                      tmp_path):
    import shutil

    src = next((hf_home / "hub" / "models--mlx-kit--SmolLM2-135M-Instruct-4bit" /
                "snapshots").iterdir())
    corrupt = tmp_path / "corrupt-model"
    shutil.copytree(src, corrupt)  # follows the snapshot's symlinks: real files
    weights = corrupt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])  # truncated download
    r = f32_server.swap(str(corrupt))
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "model_load_failed"
    ok = chat(f32_server)
    assert ok.status_code == 200 and ok.json()["model"] == F32
    assert f32_server.health()["model"] == F32


def test_the_models_own_sampling_defaults_apply(f32_server, q4_budget_server):
    """The starters ship SmolLM2's recommended sampling (temperature 0.2, top_p 0.9); a
    server started without --temperature uses it, a flag overrides it."""
    s = q4_budget_server  # started without --temperature
    assert s.health()["sampling_defaults"]["temperature"] == pytest.approx(0.2)
    assert s.health()["sampling_defaults"]["top_p"] == pytest.approx(0.9)
    s = f32_server  # started with --temperature 0
    assert s.health()["sampling_defaults"]["temperature"] == 0
