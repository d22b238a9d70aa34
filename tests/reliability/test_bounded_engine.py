"""Bounded work in the engine, on a real server: prompts far over the context window cost
the engine milliseconds, not a minute, and the memory they took is given back.

Regression (issue 11, item 4): a 20 MB body was tokenized in full (10M tokens, 29-85 s of
engine time) while a 4-token request waited 26 s, and the engine's RSS went 0.95 -> 3.3 ->
3.5 -> 6.0 GB over three such requests and never came back.
"""

from __future__ import annotations

import concurrent.futures
import time

import anthropic
import openai
import psutil
import pytest

from tests.helpers import start_server, stop

BIG = "hello world " * 700_000  # 8.4 MB of text, ~1.4M tokens: 170x the starter's window
SMALL = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def fresh(hf_home, tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("home-bounded"), hf_home,
                          "--temperature", "0")
    yield server
    stop(server)


def _rss(process: psutil.Process) -> int:
    return process.memory_info().rss


def _settled_rss(process: psutil.Process, limit: int, timeout: float = 20) -> int:
    """The engine's RSS once at or below ``limit`` (it gives memory back when idle), or
    its last value after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    rss = _rss(process)
    while rss > limit and time.monotonic() < deadline:
        time.sleep(0.2)
        rss = _rss(process)
    return rss


def test_over_window_prompts_are_refused_fast_and_the_engine_gives_memory_back(fresh):
    oai = openai.OpenAI(base_url=fresh.v1, api_key="unused", max_retries=0, timeout=120)
    ant = anthropic.Anthropic(base_url=fresh.root, api_key="unused", max_retries=0,
                              timeout=120)
    engine = psutil.Process(fresh.health()["engine_pid"])
    for _ in range(2):  # warm: caches and allocator in their steady state
        oai.chat.completions.create(model="local", messages=SMALL, max_tokens=4)
    before = _rss(engine)

    def chat():
        oai.chat.completions.create(model="local", max_tokens=16,
                                    messages=[{"role": "user", "content": BIG}])

    def legacy():
        oai.completions.create(model="local", prompt=BIG, max_tokens=16)

    def messages():
        ant.messages.create(model="local", max_tokens=16,
                            messages=[{"role": "user", "content": BIG}])

    def count():
        ant.messages.count_tokens(model="local", messages=[{"role": "user", "content": BIG}])

    def small() -> float:
        t0 = time.monotonic()
        r = oai.chat.completions.create(model="local", messages=SMALL, max_tokens=4)
        assert r.choices[0].message.content
        return time.monotonic() - t0

    alone = small()  # on a loaded machine a 4-token answer alone can take seconds
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        bigs = [pool.submit(f) for f in (chat, legacy, messages, count)]
        waited = pool.submit(small).result()
        errors = []
        for future in bigs:
            with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)) as e:
                future.result()
            errors.append(e.value)
    for error in errors:
        assert error.status_code == 400
        text = str(error)
        assert "context_length_exceeded" in text or "maximum context length" in text
        assert "8192" in text and "hello world" not in text and len(text) < 1000
    # before: 26 s behind one 20 MB request; now the big ones cost the engine ~0.3 s each
    assert waited < max(10.0, 3 * alone), \
        f"a 4-token request took {waited:.1f} s beside the big ones ({alone:.1f} s alone)"
    after = _settled_rss(engine, int(before * 1.1))
    print(f"small request {waited:.2f} s ({alone:.2f} s alone); engine RSS {before / 2**20:.0f} -> "
          f"{after / 2**20:.0f} MB")
    assert after <= before * 1.1, (
        f"engine RSS {before / 2**20:.0f} MB before, {after / 2**20:.0f} MB after")
    # and the engine still serves
    assert oai.chat.completions.create(model="local", messages=SMALL, max_tokens=4).choices
