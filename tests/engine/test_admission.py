"""Memory admission's rule, the prompt caches' byte bound and the memory ceiling, without a
model: :class:`kit.engine.cache.admission.Admission` is arithmetic over a :class:`Room`;
``PromptCachePolicy`` is fed real mlx-lm ``KVCache``s with made-up keys/values (it only
counts, evicts and copies them); the Metal ceiling is tested with mlx's device query
mocked to a 16 GB Mac's values, since no Mac exists here. The same rules against a real
server: tests/server/test_memory_admission.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kit.engine.cache.admission import Admission, Deferred, Room
from kit.engine.cache.policy import PromptCachePolicy
from kit.errors import InvalidRequest
from kit.models import memory
from kit.models.memory import Ceiling, memory_ceiling

KV = 46_080  # the starter's KV bytes per token (f32: 2 x 30 layers x 3 heads x 64 x 4)
WEIGHTS = 538_060_032
#: A 16 GB Mac's mx.device_info() (an M2 with macOS's default GPU working set).
MAC_16GB = {"memory_size": 17_179_869_184, "max_recommended_working_set_size": 12_713_115_648,
            "architecture": "applegpu_g14g", "device_name": "Apple M2"}


class Caches:
    """Prompt caches holding ``held`` bytes; ``evict(n)`` drops them down to ``n``."""

    def __init__(self, held: int = 0) -> None:
        self.held = held
        self.evicted_to: list[int] = []

    def evict(self, n: int) -> None:
        self.evicted_to.append(n)
        self.held = min(self.held, n)


def room(tokens: int, caches: Caches | None = None) -> Room:
    """A room of ``tokens`` tokens of KV beside the starter's weights (budget ceiling)."""
    caches = caches or Caches()
    return Room(WEIGHTS + tokens * KV, "budget", WEIGHTS, KV, lambda: caches.held,
                caches.evict)


def test_a_request_that_fits_runs_as_asked_and_reserves_prompt_plus_max_tokens():
    a = Admission()
    assert a.admit("job", "r1", 100, 400, room(1000)) == (400, None)
    assert a.reserved == {id("job"): 500 * KV}
    assert a.snapshot() == {"clamped": 0, "rejected": 0, "deferred": 0,
                            "reserved_bytes": 500 * KV}


def test_max_tokens_past_the_room_is_clamped_to_it():
    a = Admission()
    assert a.admit("job", "r1", 100, 5000, room(1000)) == (900, 5000)
    assert a.clamped == 1 and a.reserved[id("job")] == 1000 * KV


def test_prompt_caches_are_evicted_before_a_request_is_clamped():
    caches = Caches(held=600 * KV)
    a = Admission()
    assert a.admit("job", "r1", 100, 500, room(1000, caches)) == (500, None)
    assert caches.evicted_to == [400 * KV] and caches.held == 400 * KV


def test_concurrent_requests_share_the_room_and_a_later_one_waits_for_memory():
    a = Admission()
    r = room(1000)
    first, second, third = object(), object(), object()
    assert a.admit(first, "r1", 100, 5000, r) == (900, 5000)  # takes all of it
    with pytest.raises(Deferred):  # first is decoding: running
        a.admit(second, "r2", 100, 5000, r, running=True)
    with pytest.raises(Deferred):  # tried again before memory came back: counted once
        a.admit(second, "r2", 100, 5000, r, running=True)
    assert a.deferred == 1 and a.released == 0
    a.release(first)
    assert a.released == 1 and a.reserved == {}
    assert a.admit(second, "r2", 100, 300, r) == (300, None)
    assert a.admit(third, "r3", 100, 5000, r, running=True) == (500, 5000)
    assert a.snapshot()["clamped"] == 2 and a.snapshot()["deferred"] == 1


def test_a_prompt_that_cannot_fit_alone_is_refused_with_the_numbers():
    a = Admission()
    with pytest.raises(InvalidRequest) as e:
        a.admit("job", "r1", 1200, 10, room(1000))
    err = e.value
    assert err.code == "insufficient_memory" and err.field == "messages"
    assert "1200 prompt tokens" in err.message and "1000 tokens" in err.message
    assert "budget" in err.message and "--memory-budget" in err.message
    assert "--kv-bits" in err.message and "smaller model" in err.message
    assert a.rejected == 1 and a.reserved == {}


def test_a_leaked_reservation_with_nothing_running_does_not_defer_forever(caplog):
    # a job reserved memory, then failed before it ran (the batch's insert raised) and
    # its reservation was never given back: with nothing running, a request must not
    # wait for it (it would wait forever); the stale one is dropped, the request runs
    a = Admission()
    r = room(1000)
    a.admit("leaked", "r1", 100, 5000, r)  # holds the whole room
    assert a.admit("next", "r2", 100, 400, r, running=False) == (400, None)
    assert a.deferred == 0 and a.reserved == {id("next"): 500 * KV}
    assert "stale reservations" in caplog.text


def test_with_nothing_running_a_prompt_too_big_is_refused_never_deferred():
    a = Admission()
    r = room(1000)
    a.admit("leaked", "r1", 100, 5000, r)
    with pytest.raises(InvalidRequest) as e:
        a.admit("big", "r2", 1200, 10, r, running=False)
    assert e.value.code == "insufficient_memory"
    assert a.deferred == 0 and a.rejected == 1


def test_a_deferred_or_refused_request_evicts_no_prompt_cache():
    caches = Caches(held=600 * KV)
    a = Admission()
    r = room(1000, caches)
    a.admit("first", "r1", 100, 200, r)  # 300 tokens: fits beside the caches, no eviction
    assert caches.evicted_to == []
    with pytest.raises(Deferred):  # 800 tokens of prompt: only once first completes
        a.admit("second", "r2", 800, 10, r, running=True)
    with pytest.raises(InvalidRequest):  # cannot fit even alone
        a.admit("third", "r3", 1200, 10, r, running=False)
    assert caches.evicted_to == [] and caches.held == 600 * KV


def test_an_admitted_request_evicts_only_what_it_needs():
    caches = Caches(held=600 * KV)
    a = Admission()
    # 1000 tokens of room, 600 held by caches: 500 needed -> the caches keep 500
    assert a.admit("job", "r1", 100, 400, room(1000, caches)) == (400, None)
    assert caches.evicted_to == [500 * KV] and caches.held == 500 * KV


def test_a_request_that_sent_no_max_tokens_gets_what_fits_and_is_not_counted_clamped():
    a = Admission()
    # no max_tokens sent: the engine asks for the rest of the window (8000 here)
    assert a.admit("job", "r1", 100, 8000, room(1000), sent=False) == (900, None)
    assert a.clamped == 0 and a.reserved[id("job")] == 1000 * KV


def test_a_request_cancelled_while_deferred_is_forgotten():
    a = Admission()
    r = room(1000)
    a.admit("first", "r1", 100, 5000, r)
    with pytest.raises(Deferred):
        a.admit("second", "r2", 100, 10, r, running=True)
    a.release("second")  # what Pipeline.admit does for a cancelled job
    assert a._waiting == set() and a.deferred == 1


def test_release_is_idempotent_and_no_estimate_admits_everything():
    a = Admission()
    a.release("never admitted")
    assert a.released == 0
    assert a.admit("job", "r1", 10**6, 10**6, None) == (10**6, None)
    assert a.reserved == {}


# -- the prompt caches' byte bound -----------------------------------------------------------

def _cache(n_tokens: int) -> list:
    """A 2-layer KV cache holding ``n_tokens`` positions (mlx-lm allocates 256 at a time)."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    cache = [KVCache() for _ in range(2)]
    kv = mx.zeros((1, 2, n_tokens, 4))
    for c in cache:
        c.update_and_fetch(kv, kv)
    return cache


def test_prompt_cache_bytes_bound_evicts_least_recently_used_first():
    one = sum(c.nbytes for c in _cache(10))
    policy = PromptCachePolicy(size=10, max_bytes=2 * one)
    policy.insert("m", [1, 2], _cache(10))
    policy.insert("m", [5, 6], _cache(10))
    policy.insert("m", [8, 9], _cache(10))  # over the bound: the oldest goes
    assert policy.entries() == 2 and policy.nbytes() == 2 * one
    assert policy.byte_bound() == 2 * one
    new = []
    _, rest = policy.fetch("m", [1, 2, 3], lambda: new.append(1) or _cache(0))
    assert new == [1] and rest == [1, 2, 3]  # evicted
    _, rest = policy.fetch("m", [8, 9, 3], lambda: pytest.fail("kept"))
    assert rest == [3]
    policy.evict(one)
    assert policy.entries() == 1 and policy.nbytes() == one
    policy.evict(0)
    assert policy.entries() == 0 and policy.nbytes() == 0


def test_the_default_byte_bound_is_asked_for_when_the_store_is_made():
    policy = PromptCachePolicy(size=4)
    policy.default_bytes = lambda: 12345
    policy.insert("m", [1], _cache(1))
    assert policy.byte_bound() == 12345
    assert PromptCachePolicy(size=4, max_bytes=99).max_bytes == 99


# -- the ceiling -------------------------------------------------------------------------------

def test_on_a_mac_the_ceiling_is_metals_working_set_not_available_memory(monkeypatch):
    """No Mac exists here: mlx's device query is mocked to a 16 GB Mac's values."""
    monkeypatch.setattr(memory, "_metal_device_info", lambda: dict(MAC_16GB))
    c = memory_ceiling()
    assert c == Ceiling(12_713_115_648, "metal")
    assert c.label == "Metal working set 11.84 GiB"
    assert memory_ceiling(replacing=10**9) == c  # the working set holds a swap's model too
    assert memory_ceiling(8 << 30) == Ceiling(8 << 30, "budget")  # --memory-budget wins


def test_off_a_mac_the_ceiling_is_available_memory_plus_what_a_swap_frees(monkeypatch):
    monkeypatch.setattr(memory, "_metal_device_info", lambda: None)
    monkeypatch.setattr(memory, "available_bytes", lambda: 5 * 10**9)
    assert memory_ceiling(replacing=10**9) == Ceiling(6 * 10**9, "available")
    assert memory_ceiling().label == "available memory 4.66 GiB"


def test_metal_device_info_is_not_asked_off_macos():
    assert sys.platform != "darwin"
    assert memory._metal_device_info() is None


def _stand_in_model(folder: Path, window: int = 8192) -> Path:
    """A model folder the estimate can read: the starter's config.json and a safetensors
    file of header only naming its f32 weights' size (no data: fit reads headers only)."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "head_dim": 64, "hidden_size": 576,
        "max_position_embeddings": window, "torch_dtype": "float32"}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [WEIGHTS // 4],
                               "data_offsets": [0, WEIGHTS]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    return folder


def test_fit_prints_the_metal_ceiling_it_used(tmp_path, monkeypatch):
    """The device query is mocked to a 16 GB Mac's values (no Mac here)."""
    from typer.testing import CliRunner

    from kit.cli import app

    monkeypatch.setattr(memory, "_metal_device_info", lambda: dict(MAC_16GB))
    model = _stand_in_model(tmp_path / "m")
    r = CliRunner().invoke(app, ["fit", str(model)])
    assert r.exit_code == 0, r.output
    assert "ceiling:  Metal working set 11.84 GiB -> fits" in r.output
    over = CliRunner().invoke(app, ["fit", str(model), "--memory-budget", "600MiB"])
    # 538 MB of weights + 2048 tokens x 46 KB = 632 MB > 600 MiB (629 MB)
    assert over.exit_code == 5 and "ceiling:  budget 600.00 MiB -> does NOT fit" in over.output


def test_fit_says_how_much_context_fits_when_the_whole_window_does_not(tmp_path):
    from typer.testing import CliRunner

    from kit.cli import app

    model = _stand_in_model(tmp_path / "m")
    budget = WEIGHTS + 3000 * KV
    r = CliRunner().invoke(app, ["fit", str(model), "--memory-budget", str(budget)])
    assert r.exit_code == 0 and "fits 3000 tokens of context (requests past it are capped)" \
        in r.output
    strict = CliRunner().invoke(app, ["fit", str(model), "--memory-budget", str(budget),
                                      "--ctx", "4000"])
    assert strict.exit_code == 5 and "does NOT fit" in strict.output


def test_fit_on_linux_does_not_import_mlx(tmp_path):
    model = _stand_in_model(tmp_path / "m")
    code = ("import sys\nfrom kit.cli import main\ntry:\n    main(['fit', sys.argv[1]])\n"
            "except SystemExit:\n    pass\n"
            "print('mlx imported' if any(m == 'mlx' or m.startswith(('mlx.', 'mlx_lm'))"
            " for m in sys.modules) else 'no mlx')")
    r = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True,
                       text=True, timeout=120)
    assert "ceiling:  available memory" in r.stdout, r.stdout + r.stderr
    assert r.stdout.strip().endswith("no mlx")


def test_check_fit_holds_the_model_under_the_metal_ceiling(tmp_path, monkeypatch):
    """The device query is mocked to a 16 GB Mac's values (no Mac here); the model is a
    stand-in folder whose safetensors header names 12 GB of weights."""
    from kit.engine.decode.slot import ModelSlot
    from kit.errors import ModelDoesNotFitError
    from kit.models.resolve import ModelInfo

    monkeypatch.setattr(memory, "_metal_device_info", lambda: dict(MAC_16GB))
    monkeypatch.setattr(memory, "available_bytes", lambda: 64 << 30)  # not what counts
    folder = _stand_in_model(tmp_path / "m")
    slot = ModelSlot(ModelInfo("m", folder, 8192))
    assert slot.check_fit(slot.info, replacing=0) == WEIGHTS
    assert slot._checked == (Ceiling(12_713_115_648, "metal"), KV)
    big = tmp_path / "big"
    _stand_in_model(big)
    header = json.dumps({"w": {"dtype": "F32", "shape": [3 << 30],
                               "data_offsets": [0, 12 << 30]}}).encode()
    (big / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(ModelDoesNotFitError) as e:
        slot.check_fit(ModelInfo("big", big, 8192), replacing=0)
    assert "the ceiling is Metal working set 11.84 GiB" in e.value.message


def test_prompt_cache_bytes_is_refused_across_ranks_before_any_starts():
    from kit.config import EngineConfig
    from kit.engine.distributed.world_process import DistributedEngine
    from kit.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        DistributedEngine(None, None,  # type: ignore[arg-type]
                          EngineConfig(prompt_cache_bytes=1 << 30))
    assert "--prompt-cache-bytes" in e.value.message and "--prompt-cache-size" in e.value.hint


def test_launch_forwards_the_memory_flags_and_checks_them_before_starting_a_server():
    from kit.config import EngineConfig
    from kit.errors import ConfigError

    c = EngineConfig.from_flags({"memory_budget": "8GB", "prompt_cache_bytes": "512MiB"})
    assert c.to_argv("launch") == ["--memory-budget", str(8 * 10**9),
                                   "--prompt-cache-bytes", str(512 * 2**20)]
    with pytest.raises(ConfigError, match="--prompt-cache-bytes"):
        EngineConfig.from_flags({"prompt_cache_bytes": "lots"})
