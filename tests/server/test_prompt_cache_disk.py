"""The prompt cache's disk tier end to end: real servers on loopback with the starter,
the official OpenAI SDK, a throwaway HOME and a cache folder per test. A long prompt's KV
cache, written after its answer, serves the same prompt after a restart, a swap away and
back and a TTL reload (cached_tokens > 0, the same greedy text); bad files are misses
that go away; the bound and ``--prompt-cache-disk 0`` hold."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from huggingface_hub import snapshot_download

from kit.models.starter import STARTER_4BIT_ID, STARTER_ID
from tests import helpers
from tests.greedy import assert_agrees

pytestmark = pytest.mark.model

#: a system prompt of ~500 tokens through the starter's template (the disk tier keeps
#: prompts of 256 tokens or more, agent prefixes are 2k-20k)
LONG = " ".join(f"Rule {i}: answer in one short sentence about the {i}th topic."
                for i in range(40))


def long_prompt(tag: str) -> list[dict]:
    return [{"role": "system", "content": f"{tag}. {LONG}"},
            {"role": "user", "content": "Name a colour."}]


def ask(server, messages: list[dict], max_tokens: int = 8) -> tuple[str, int, int]:
    """(text, prompt tokens, cached tokens) of one greedy chat completion."""
    r = helpers.openai_for(server).chat.completions.create(
        model="local", messages=messages, max_tokens=max_tokens, temperature=0)
    details = r.usage.prompt_tokens_details
    return r.choices[0].message.content, r.usage.prompt_tokens, details.cached_tokens or 0


def counters(server) -> dict:
    return server.health()["prompt_cache"]


def wait_writes(server, n: int) -> dict:
    """/health's prompt_cache once ``disk_writes`` reached ``n`` (written when idle)."""
    return helpers.wait_until(lambda: (c := counters(server))["disk_writes"] >= n and c,
                              timeout=60, what=f"{n} disk writes")


def ours(folder: Path) -> list[Path]:
    """The cache files mlx-kit named: ``<identity>/<sha256>.safetensors``."""
    return sorted(p for p in folder.glob("*/*.safetensors") if len(p.stem) == 64)


def serve(tmp_path: Path, hf_home: Path, cache: Path, *args: str,
          state: Path | None = None, **env: str) -> helpers.Server:
    """A server on ``cache`` in a HOME of its own; ``state``: its state dir (the prompt
    cache key's folder), shared by servers that stand for one user restarting."""
    home = tmp_path / f"home-{len(list(tmp_path.glob('home-*')))}"
    home.mkdir()
    if state is not None:
        env["XDG_STATE_HOME"] = str(state)
    env.setdefault("MLX_KIT_IDLE_WRITE_S", "1")  # written after 1 s idle, not 5
    return helpers.start_server(home, hf_home, "--temperature", "0",
                                "--prompt-cache-dir", str(cache), *args, **env)


@pytest.fixture(scope="module")
def user_state(tmp_path_factory) -> Path:
    """One user's state dir: its prompt cache key proves the files `warm` wrote."""
    return tmp_path_factory.mktemp("state")


#: the long prompts `warm` stores, one file each: one is served after a restart, one is
#: truncated and one has a byte changed before the restarted server sees them
TAGS = ("intact", "truncated", "flipped")


@dataclass
class Warm:
    """What `warm` left and saw. ``prompts``: per tag of :data:`TAGS`, its (messages, cold
    text, prompt tokens); ``files``: per tag, the file its cache went to; ``turns``: an
    agent's two quick turns, (the second's cached tokens, disk writes between the turns,
    disk entries once idle)."""

    folder: Path
    prompts: dict[str, tuple[list[dict], str, int]]
    files: dict[str, Path]
    turns: tuple[int, int, int]


@pytest.fixture(scope="module")
def warm(hf_home, tmp_path_factory, user_state) -> Warm:
    """A cache folder that one server filled, then stopped: nothing for a short prompt,
    one file per long prompt of :data:`TAGS` (each written once the worker was idle),
    then an agent's two turns sent back to back. One server for all: each start is ~5 s."""
    tmp = tmp_path_factory.mktemp("warm")
    cache = tmp / "cache"
    s = serve(tmp, hf_home, cache, state=user_state)
    prompts, files = {}, {}
    try:
        ask(s, [{"role": "user", "content": "Hi."}])  # short: no file
        for i, tag in enumerate(TAGS, 1):
            before = set(ours(cache))
            messages = long_prompt(tag)
            text, n, cached = ask(s, messages)
            assert n > 400 and cached < 20
            c = wait_writes(s, i)
            assert c["misses"] >= 1 and c["disk_entries"] == i and c["disk_hits"] == 0
            (files[tag],) = set(ours(cache)) - before
            prompts[tag] = (messages, text, n)
        # Regression: the worker wrote the cache as soon as its queue was empty, i.e. right
        # after each answer, so an agent's next request (ms later) waited for the whole
        # write. A write waits for IDLE_WRITE_S without a request (5 s; 1 s here).
        writes = counters(s)["disk_writes"]
        messages = long_prompt("turns")
        text, _, _ = ask(s, messages)
        nxt = messages + [{"role": "assistant", "content": text},
                          {"role": "user", "content": "Another one."}]
        _, _, cached = ask(s, nxt)  # at once, as an agent's next turn comes
        between = counters(s)["disk_writes"] - writes
        c = wait_writes(s, writes + 1)  # once the worker has been idle
        turns = (cached, between, c["disk_entries"] - len(TAGS))
    finally:
        helpers.stop(s)
    return Warm(cache, prompts, files, turns)


def test_an_agents_next_turn_does_not_wait_for_a_disk_write_and_files_are_private(warm):
    cached, between, entries = warm.turns
    assert cached > 400  # from memory
    assert between == 0  # nothing was written between the turns
    assert entries >= 1  # written once the worker was idle
    assert warm.folder.stat().st_mode & 0o777 == 0o700
    for f in ours(warm.folder):
        assert f.parent.stat().st_mode & 0o777 == 0o700
        assert f.stat().st_mode & 0o777 == 0o600


@dataclass
class Restarted:
    """The server `restarted` started on a copy of `warm`'s folder, and what was done to
    that copy first: ``truncated`` (the truncated file's path, its original bytes),
    ``stale`` (a dead writer's temporary file), ``theirs`` (files mlx-kit never wrote)."""

    server: helpers.Server
    truncated: tuple[Path, bytes]
    flipped: Path
    stale: Path
    theirs: list[Path]


@pytest.fixture(scope="module")
def restarted(warm, hf_home, tmp_path_factory, user_state):
    """The same user's server restarted on a copy of `warm`'s folder in which one file
    was cut short (a crash mid-copy, a full disk), one had one bit of one K/V value
    changed (a file that still loads), a writer that died left its temporary file, and
    others put files of their own. Three tests share it: each asks its own prompt."""
    tmp = tmp_path_factory.mktemp("restarted")
    cache = tmp / "cache"
    shutil.copytree(warm.folder, cache)
    cut = cache / warm.files["truncated"].relative_to(warm.folder)
    data = cut.read_bytes()
    cut.write_bytes(data[:len(data) // 3])
    flipped = cache / warm.files["flipped"].relative_to(warm.folder)
    flip = bytearray(flipped.read_bytes())
    flip[-1000] ^= 0x01
    flipped.write_bytes(bytes(flip))
    stale = cut.parent / f"{'e' * 64}.999999999.tmp"
    stale.write_bytes(data[:1000])
    theirs = [cache / "notes.txt", cut.parent / "README", cut.parent / "x.safetensors"]
    for p in theirs:
        p.write_text("not mlx-kit's")
    s = serve(tmp, hf_home, cache, state=user_state)
    yield Restarted(s, (cut, data), flipped, stale, theirs)
    helpers.stop(s)
    assert all(p.read_text() == "not mlx-kit's" for p in theirs)
    assert "Traceback" not in s.log_text()


@dataclass
class Asked:
    """One of `warm`'s prompts asked again of the restarted server: its ``text``, ``tokens``
    and ``cached`` tokens now, its ``cold`` text and ``cold_tokens`` when `warm` asked it,
    and how many disk hits the request added (``disk_hits``)."""

    text: str
    tokens: int
    cached: int
    cold: str
    cold_tokens: int
    disk_hits: int


def ask_restarted(warm: Warm, restarted: Restarted, tag: str) -> Asked:
    """Ask the prompt of ``tag`` (one of :data:`TAGS`) of the restarted server."""
    messages, cold, cold_tokens = warm.prompts[tag]
    hits = counters(restarted.server)["disk_hits"]
    text, tokens, cached = ask(restarted.server, messages)
    return Asked(text, tokens, cached, cold, cold_tokens,
                 counters(restarted.server)["disk_hits"] - hits)


def test_a_restarted_server_serves_a_long_prompt_from_disk_with_the_same_text(
        warm, restarted):
    a = ask_restarted(warm, restarted, "intact")
    assert (a.text, a.tokens) == (a.cold, a.cold_tokens)
    assert a.cached >= a.cold_tokens - 1 and a.disk_hits == 1
    c = counters(restarted.server)
    assert c["memory_entries"] >= 1 and c["disk_entries"] >= 1 and c["disk_bytes"] > 0


def test_a_truncated_file_and_a_stale_tmp_are_a_miss_and_go_away_and_others_files_stay(
        warm, restarted):
    s = restarted.server
    path, data = restarted.truncated
    assert not restarted.stale.exists()  # removed at start
    a = ask_restarted(warm, restarted, "truncated")
    assert a.cached < 20 and a.disk_hits == 0
    # cold here; `warm` had reused a short prompt's opening (another prefill split)
    assert_agrees(s, warm.prompts["truncated"][0], a.text, a.cold, max_tokens=8)
    assert not path.exists() or path.stat().st_size == len(data)  # gone (or rewritten)
    assert s.log_text().count(f"deleting prompt cache file {path}") == 1
    # the answer's cache replaces it
    helpers.wait_until(lambda: path.exists(), timeout=60, what="the file written again")
    assert all(p.read_text() == "not mlx-kit's" for p in restarted.theirs)


def test_a_file_with_one_tensor_byte_changed_is_a_miss_and_the_answer_is_a_cold_runs(
        warm, restarted):
    s = restarted.server
    a = ask_restarted(warm, restarted, "flipped")
    assert a.cached < 20 and a.disk_hits == 0
    assert_agrees(s, warm.prompts["flipped"][0], a.text, a.cold, max_tokens=8)
    assert re.search(rf"deleting prompt cache file {re.escape(str(restarted.flipped))}: "
                     r"not proven ours: its MAC does not verify", s.log_text())


def starter_folder(hf_home: Path, where: Path) -> Path:
    """A model folder of the f32 starter: links to its files, a copy of its config.json
    (so a test can change it without touching the hub cache)."""
    src = Path(snapshot_download(STARTER_ID, cache_dir=Path(hf_home) / "hub",
                                 local_files_only=True))
    where.mkdir()
    for f in src.iterdir():
        if f.name == "config.json":
            shutil.copyfile(f, where / f.name)
        else:
            (where / f.name).symlink_to(f.resolve())
    return where


def test_swap_away_and_back_hits_the_disk_but_not_once_the_models_config_changed(
        hf_home, tmp_path):
    model = starter_folder(hf_home, tmp_path / "model")
    cache = tmp_path / "cache"
    s = serve(tmp_path, hf_home, cache, "--model", str(model))
    try:
        messages = long_prompt("swap")
        cold_text, n, _ = ask(s, messages)
        wait_writes(s, 1)
        for target in (STARTER_4BIT_ID, str(model)):
            assert s.swap(target).status_code == 200
        text, _, cached = ask(s, messages)
        assert text == cold_text and cached >= n - 1
        assert counters(s)["disk_hits"] == 1
        # the same folder with another config.json is another model: its caches are not
        # loaded (a new identity folder)
        config = (model / "config.json").read_text()
        (model / "config.json").write_text(config.replace("{", '{"mlx_kit_test": 1, ', 1))
        for target in (STARTER_4BIT_ID, str(model)):
            assert s.swap(target).status_code == 200
        text, _, cached = ask(s, messages)
        assert text == cold_text and cached < 20
        assert counters(s)["disk_hits"] == 1
        wait_writes(s, 2)
        assert len({p.parent for p in ours(cache)}) == 2
    finally:
        helpers.stop(s)


def test_a_ttl_reload_hits_the_disk(hf_home, tmp_path):
    s = serve(tmp_path, hf_home, tmp_path / "cache", "--ttl", "1")
    try:
        messages = long_prompt("ttl")
        cold_text, n, _ = ask(s, messages)
        wait_writes(s, 1)
        helpers.wait_until(lambda: s.health()["model_state"] == "unloaded", timeout=30,
                           what="the TTL unload")
        text, _, cached = ask(s, messages)
        assert text == cold_text and cached >= n - 1
        h = s.health()
        assert h["reloads"] == 1 and h["prompt_cache"]["disk_hits"] == 1
    finally:
        helpers.stop(s)


def test_the_disk_bound_evicts_the_least_recently_used(warm, hf_home, tmp_path, user_state):
    size = warm.files["intact"].stat().st_size
    cache = tmp_path / "cache"
    s = serve(tmp_path, hf_home, cache, "--prompt-cache-disk", str(int(size * 1.5)),
              state=user_state)
    try:
        ask(s, long_prompt("first"))
        wait_writes(s, 1)
        (first,) = ours(cache)
        ask(s, long_prompt("second"))
        c = wait_writes(s, 2)
        assert c["disk_entries"] == 1 and c["disk_bytes"] <= size * 1.5
        (second,) = ours(cache)
        assert second != first and not first.exists()
    finally:
        helpers.stop(s)


def test_prompt_cache_disk_0_writes_nothing(hf_home, tmp_path):
    cache = tmp_path / "cache"
    s = serve(tmp_path, hf_home, cache, "--prompt-cache-disk", "0")
    try:
        ask(s, long_prompt("off"))
        ask(s, [{"role": "user", "content": "Hi."}])  # the worker was idle in between
        c = counters(s)
        assert (c["disk_writes"], c["disk_entries"], c["disk_hits"]) == (0, 0, 0)
        assert c["memory_entries"] >= 1
    finally:
        helpers.stop(s)
    assert not cache.exists()
