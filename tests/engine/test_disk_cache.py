"""The prompt cache's disk tier (kit/engine/cache/disk_cache.py) against real mlx-lm caches:
what is stored is found and loads back equal; bad files are misses that go away; files
that are not ours stay; the bound evicts the least recently used. No model: the caches
are mlx-lm's own ``KVCache`` objects filled with known values."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

mx = pytest.importorskip("mlx.core")
from mlx_lm.models.cache import KVCache, RotatingKVCache  # noqa: E402

from kit.engine.cache import cache_mac  # noqa: E402
from kit.engine.cache.cache_identity import FORMAT  # noqa: E402
from kit.engine.cache.disk_cache import MIN_TOKENS, DiskCache, model_identity  # noqa: E402

IDENT = "0123456789abcdef" * 2
LAYERS = ("KVCache",) * 2


@pytest.fixture(autouse=True)
def user_state(tmp_path_factory, monkeypatch) -> Path:
    """This user's state dir (the prompt cache key's folder), outside the cache folder."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


def kv_cache(n: int, value: float = 1.0, layers: int = 2) -> list:
    """mlx-lm KV caches of ``layers`` layers holding ``n`` tokens (1 head, dim 8)."""
    caches = [KVCache() for _ in range(layers)]
    for i, c in enumerate(caches):
        x = mx.full((1, 1, n, 8), value + i)
        c.update_and_fetch(x, x)
    return caches


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def mint(path: Path, cache: list, toks: list[int], key: bytes | None,
         identity: str = IDENT) -> None:
    """Write ``cache`` at ``path`` as the disk tier does, sealed under ``key`` (None: not
    sealed, as a stranger without the key would write it)."""
    from mlx_lm.models.cache import save_prompt_cache

    save_prompt_cache(str(path), cache, {"tokens": json.dumps(toks), "model": identity,
                                         "format": FORMAT, "mac": cache_mac.UNSEALED})
    if key is not None:
        with open(path, "r+b") as f:
            cache_mac.seal(f, key)


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_stored_cache_is_found_by_a_longer_prompt_and_loads_back_equal(tmp_path):
    disk = DiskCache(tmp_path, 1 << 30)
    assert disk.save(IDENT, tokens(300), kv_cache(300, 2.0), trimmable=True)
    assert (disk.writes, disk.entries) == (1, 1)
    found = DiskCache(tmp_path, 1 << 30).find(IDENT, tokens(310), LAYERS, trimmable=True)
    assert found is not None and found.common == 300
    loaded = DiskCache(tmp_path, 1 << 30).load(IDENT, found.entry, LAYERS)
    assert [c.offset for c in loaded] == [300, 300]
    keys, _ = loaded[1].state[:2]
    assert keys[..., :300, :].sum().item() == pytest.approx(3.0 * 300 * 8)


def test_a_longer_entry_serves_a_shared_prefix_only_when_the_cache_is_trimmable(tmp_path):
    disk = DiskCache(tmp_path, 1 << 30)
    disk.save(IDENT, tokens(400), kv_cache(400), trimmable=True)
    prompt = tokens(350) + [9999] * 20
    assert disk.find(IDENT, prompt, LAYERS, trimmable=True).common == 350
    assert disk.find(IDENT, prompt, LAYERS, trimmable=False) is None


def test_short_prefixes_other_models_and_other_layers_are_no_hit(tmp_path):
    disk = DiskCache(tmp_path, 1 << 30)
    disk.save(IDENT, tokens(300), kv_cache(300), trimmable=True)
    assert disk.find(IDENT, tokens(MIN_TOKENS - 1) + [-1] * 100, LAYERS, True) is None
    assert disk.find("f" * 32, tokens(300), LAYERS, True) is None
    assert disk.find(IDENT, tokens(300), ("KVCache",) * 3, True) is None
    assert disk.find(IDENT, tokens(300), ("RotatingKVCache",) * 2, True) is None


def test_a_newer_entry_extending_an_older_one_replaces_it(tmp_path):
    disk = DiskCache(tmp_path, 1 << 30)
    disk.save(IDENT, tokens(300), kv_cache(300), trimmable=True)
    disk.save(IDENT, tokens(360), kv_cache(360), trimmable=True)
    assert disk.entries == 1
    assert disk.find(IDENT, tokens(300), LAYERS, True).common == 300  # trimmed from 360


def test_a_truncated_file_is_a_miss_and_is_removed(tmp_path, caplog):
    disk = DiskCache(tmp_path, 1 << 30)
    disk.save(IDENT, tokens(300), kv_cache(300), trimmable=True)
    (path,) = (tmp_path / IDENT).glob("*.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])  # a crash or a full disk mid-copy
    fresh = DiskCache(tmp_path, 1 << 30)
    assert fresh.find(IDENT, tokens(300), LAYERS, True) is None
    assert not path.exists()
    assert "deleting prompt cache file" in caplog.text


def test_a_file_whose_tensors_do_not_match_its_tokens_is_a_miss_and_is_removed(tmp_path):
    # a valid safetensors file whose header claims 300 tokens over a cache of 299
    disk = DiskCache(tmp_path, 1 << 30)
    disk.save(IDENT, tokens(299), kv_cache(299), trimmable=True)
    (src,) = (tmp_path / IDENT).glob("*.safetensors")
    from mlx_lm.models.cache import load_prompt_cache

    import hashlib

    import numpy as np

    cache = load_prompt_cache(str(src))
    src.unlink()
    lie = tokens(300)
    name = hashlib.sha256(np.asarray(lie, dtype=np.int32).tobytes()).hexdigest()
    bad = tmp_path / IDENT / f"{name}.safetensors"
    mint(bad, cache, lie, cache_mac.user_key())  # sealed: a bug of ours, not a stranger
    disk = DiskCache(tmp_path, 1 << 30)
    found = disk.find(IDENT, lie, LAYERS, True)
    assert found is not None
    assert disk.load(IDENT, found.entry, LAYERS) is None
    assert not bad.exists()


def test_a_stale_tmp_of_a_dead_writer_is_removed_at_start(tmp_path):
    folder = tmp_path / IDENT
    folder.mkdir()
    dead = folder / f"{'a' * 64}.999999999.tmp"  # no such pid
    dead.write_bytes(b"half a file")
    mine_running = folder / f"{'b' * 64}.{os.getppid()}.tmp"  # a live writer's
    mine_running.write_bytes(b"being written")
    DiskCache(tmp_path, 1 << 30)
    assert not dead.exists()
    assert mine_running.exists()


def test_files_of_someone_else_in_the_folder_are_left_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / IDENT).mkdir()
    theirs = [tmp_path / IDENT / "README", tmp_path / IDENT / "x.safetensors",
              tmp_path / IDENT / f"{'c' * 64}.tmp", tmp_path / "other" / f"{'d' * 64}.safetensors"]
    for p in theirs:
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"not a cache")
    disk = DiskCache(tmp_path, 1)  # a bound nothing fits: eviction runs on everything ours
    disk.save(IDENT, tokens(300), kv_cache(300), trimmable=True)
    disk.evict()
    assert disk.find(IDENT, tokens(300), LAYERS, True) is None
    assert all(p.exists() for p in theirs)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_disk_bound_evicts_the_least_recently_used(tmp_path):
    one = sum(c.nbytes for c in kv_cache(300))
    disk = DiskCache(tmp_path, 1 << 30)
    disk.save(IDENT, tokens(300, 0), kv_cache(300), trimmable=True)
    disk.save(IDENT, tokens(300, 1000), kv_cache(300), trimmable=True)
    size = disk.bytes // 2
    # the first is used again (a hit touches it): the second is now the least recent
    old = time.time() - 100
    for p in (tmp_path / IDENT).glob("*.safetensors"):
        os.utime(p, (old, old))
    hit = disk.find(IDENT, tokens(300, 0), LAYERS, True)
    assert disk.load(IDENT, hit.entry, LAYERS) is not None
    bounded = DiskCache(tmp_path, int(size * 2.5))
    bounded.save(IDENT, tokens(300, 2000), kv_cache(300), trimmable=True)
    assert bounded.entries == 2 and bounded.bytes <= size * 2.5 and one <= size
    assert bounded.find(IDENT, tokens(300, 0), LAYERS, True) is not None
    assert bounded.find(IDENT, tokens(300, 1000), LAYERS, True) is None
    assert bounded.find(IDENT, tokens(300, 2000), LAYERS, True) is not None


def test_a_cache_over_the_whole_bound_is_not_written(tmp_path):
    disk = DiskCache(tmp_path, 1000)
    assert not disk.save(IDENT, tokens(300), kv_cache(300), trimmable=True)
    assert files(tmp_path) == []


def test_a_rotating_cache_keeps_its_class_and_is_found_only_for_its_class(tmp_path):
    c = [RotatingKVCache(max_size=512) for _ in range(2)]
    for layer in c:
        x = mx.ones((1, 1, 300, 8))
        layer.update_and_fetch(x, x)
    disk = DiskCache(tmp_path, 1 << 30)
    disk.save(IDENT, tokens(300), c, trimmable=False)
    rot = ("RotatingKVCache",) * 2
    found = disk.find(IDENT, tokens(320), rot, trimmable=False)
    assert found is not None and found.common == 300
    assert [type(x).__name__ for x in disk.load(IDENT, found.entry, rot)] == list(rot)
    assert disk.find(IDENT, tokens(300), LAYERS, True) is None


def test_model_identity_changes_with_config_weights_and_kv_settings(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    (tmp_path / "model.safetensors").write_bytes(b"w" * 10)
    base = model_identity(tmp_path, None, 64)
    assert model_identity(tmp_path, None, 64) == base
    assert model_identity(tmp_path, 8, 64) != base
    assert model_identity(tmp_path, 8, 32) != model_identity(tmp_path, 8, 64)
    (tmp_path / "config.json").write_text('{"hidden_size": 9}')
    changed = model_identity(tmp_path, None, 64)
    assert changed != base
    (tmp_path / "model.safetensors").write_bytes(b"w" * 11)
    assert model_identity(tmp_path, None, 64) != changed


# -- the disk tier behind PromptCachePolicy (no model: KVCache stand-ins) -------------------

def policy_on(folder: Path, ident: str = IDENT):
    from kit.engine.cache.policy import PromptCachePolicy

    from kit.engine.cache.disk_tier import DiskTier

    policy = PromptCachePolicy(size=4)
    policy.attach_disk(DiskTier(DiskCache(folder, 1 << 30), lambda: ident))
    return policy


def test_a_new_policy_on_the_same_folder_starts_a_long_prompt_from_disk(tmp_path):
    # a restart: the first process keeps the cache in memory and writes it when idle
    first = policy_on(tmp_path)
    first.insert("m", tokens(300), kv_cache(300))
    assert first.pending()
    first.write_pending()
    assert not first.pending() and first.stats()["disk_writes"] == 1
    second = policy_on(tmp_path)
    cache, rest = second.fetch("m", tokens(300) + [7, 8], lambda: kv_cache(0))
    assert rest == [7, 8] and cache[0].offset == 300
    stats = second.stats()
    assert (stats["disk_hits"], stats["memory_hits"], stats["misses"]) == (1, 0, 0)
    assert stats["memory_entries"] == 1  # the loaded cache is kept in memory too
    _, rest = second.fetch("m", tokens(300) + [9], lambda: kv_cache(0))
    assert rest == [9] and second.stats()["memory_hits"] == 1


def test_clear_drops_memory_only_so_a_swap_back_hits_the_disk(tmp_path):
    policy = policy_on(tmp_path)
    policy.insert("m", tokens(300), kv_cache(300))
    policy.clear()  # the swap away happened before the worker was idle
    policy.write_pending()  # the queued write survives it
    cache, rest = policy.fetch("m", tokens(300), lambda: kv_cache(0))
    assert rest == [299] and cache[0].offset == 299  # exact: the last token is fed again
    assert policy.stats()["disk_hits"] == 1


def test_short_prompts_are_never_queued_for_the_disk(tmp_path):
    policy = policy_on(tmp_path)
    policy.insert("m", tokens(MIN_TOKENS - 1), kv_cache(MIN_TOKENS - 1))
    assert not policy.pending()
    policy.flush(1.0)
    assert files(tmp_path) == []


def test_a_queued_write_extended_by_a_newer_one_is_dropped_and_the_queue_is_bounded(
        tmp_path):
    # PENDING_MAX (2): each queued cache holds its KV memory until it is written
    policy = policy_on(tmp_path)
    policy.insert("m", tokens(300), kv_cache(300))
    policy.insert("m", tokens(320), kv_cache(320))  # the next turn of the same prompt
    policy.insert("m", tokens(300, 5000), kv_cache(300))
    policy.insert("m", tokens(300, 9000), kv_cache(300))
    policy.flush(30.0)
    assert policy.stats()["disk_writes"] == 2  # the newest two; 300 was extended by 320
    disk = DiskCache(tmp_path, 1 << 30)
    assert disk.find(IDENT, tokens(300, 9000), LAYERS, True) is not None
    assert disk.find(IDENT, tokens(300, 5000), LAYERS, True) is not None
    assert disk.find(IDENT, tokens(320), LAYERS, True) is None


def test_a_broken_disk_tier_is_a_miss_never_an_error(tmp_path, caplog):
    from kit.engine.cache.policy import PromptCachePolicy

    class Broken(DiskCache):
        def find(self, *args, **kwargs):
            raise RuntimeError("disk on fire")

    from kit.engine.cache.disk_tier import DiskTier

    policy = PromptCachePolicy(size=4)
    policy.attach_disk(DiskTier(Broken(tmp_path, 1 << 30), lambda: IDENT))
    cache, rest = policy.fetch("m", tokens(300), lambda: kv_cache(0))
    assert rest == tokens(300) and cache[0].offset == 0
    assert "disk tier failed" in caplog.text


def test_a_reloaded_models_identity_is_computed_again_without_comparing_the_models(tmp_path):
    # Regression: the identity was remembered by (model, path) and compared with ==,
    # which for mlx modules compares their arrays: the first request after a TTL reload
    # or a swap back failed with a 500 ("Only length-1 arrays can be converted").
    from types import SimpleNamespace

    import mlx.nn as nn

    (tmp_path / "config.json").write_text("{}")
    disk = DiskCache(tmp_path / "cache", 1 << 30)
    slot = SimpleNamespace(model=nn.Linear(4, 4), info=SimpleNamespace(path=tmp_path, id="m"))
    first = disk.identity(slot)
    assert disk.identity(slot) == first
    (tmp_path / "config.json").write_text('{"changed": true}')
    assert disk.identity(slot) == first  # the loaded model is the one it was made from
    slot.model = nn.Linear(4, 4)  # reloaded: the files are read again
    assert disk.identity(slot) != first
    slot.model = None
    assert disk.identity(slot) is None


# -- review 2026-12-01: permissions, symlinks, identity, tmp cleanup -------------------------

def test_cache_folders_are_private_and_files_0600_whatever_the_umask(tmp_path):
    # Regression: the root and model folders were made 0755 and files 0644 (the umask),
    # so every user on the machine could read the prompts' token ids.
    root = tmp_path / "cache"
    old = os.umask(0o022)
    try:
        DiskCache(root, 1 << 30).save(IDENT, tokens(300), kv_cache(300), trimmable=True)
    finally:
        os.umask(old)
    assert root.stat().st_mode & 0o777 == 0o700
    assert (root / IDENT).stat().st_mode & 0o777 == 0o700
    (path,) = (root / IDENT).glob("*.safetensors")
    assert path.stat().st_mode & 0o777 == 0o600


def test_an_existing_cache_folder_keeps_the_users_mode(tmp_path):
    root = tmp_path / "shared-cache"
    root.mkdir()
    root.chmod(0o755)  # the user's own folder: never chmod one we did not create
    DiskCache(root, 1 << 30).save(IDENT, tokens(300), kv_cache(300), trimmable=True)
    assert root.stat().st_mode & 0o777 == 0o755
    assert (root / IDENT).stat().st_mode & 0o777 == 0o700


def test_a_symlinked_model_folder_in_the_cache_is_never_followed_and_its_files_stay(tmp_path):
    # Regression: a symlink named like an identity folder was followed by find's refresh,
    # and a file OUTSIDE the cache folder that did not parse was deleted.
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / f"{'e' * 64}.safetensors"
    victim.write_bytes(b"the user's file, not a cache")
    root = tmp_path / "cache"
    root.mkdir()
    (root / IDENT).symlink_to(outside, target_is_directory=True)
    disk = DiskCache(root, 1)  # a bound nothing fits: eviction would run on it
    assert disk.find(IDENT, tokens(300), LAYERS, True) is None
    assert disk.save(IDENT, tokens(300), kv_cache(300), trimmable=True) is False
    disk.evict()
    assert victim.read_bytes() == b"the user's file, not a cache"
    assert sorted(p.name for p in outside.iterdir()) == [victim.name]  # nothing written there
    assert (root / IDENT).is_symlink()  # the link itself is left alone too


def test_a_symlinked_cache_file_is_left_alone_and_its_target_is_never_read(tmp_path):
    real = DiskCache(tmp_path / "elsewhere", 1 << 30)
    real.save(IDENT, tokens(300), kv_cache(300), trimmable=True)
    (target,) = (tmp_path / "elsewhere" / IDENT).glob("*.safetensors")
    root = tmp_path / "cache"
    (root / IDENT).mkdir(parents=True)
    link = root / IDENT / target.name
    link.symlink_to(target)
    stale = root / IDENT / f"{'f' * 64}.999999999.tmp"  # a dead writer's name, as a link
    stale.symlink_to(target)
    disk = DiskCache(root, 1)
    assert disk.find(IDENT, tokens(300), LAYERS, True) is None  # not an entry of ours
    assert disk.save(IDENT, tokens(300), kv_cache(300), trimmable=True) is False
    disk.evict()
    assert link.is_symlink() and stale.is_symlink() and target.exists()


def test_a_file_swapped_for_a_symlink_after_the_scan_is_not_loaded_or_deleted(tmp_path):
    disk = DiskCache(tmp_path / "cache", 1 << 30)
    disk.save(IDENT, tokens(300), kv_cache(300), trimmable=True)
    found = disk.find(IDENT, tokens(300), LAYERS, True)
    other = tmp_path / "other.safetensors"
    other.write_bytes(found.entry.path.read_bytes())
    found.entry.path.unlink()
    found.entry.path.symlink_to(other)  # O_NOFOLLOW: the load does not read through it
    assert disk.load(IDENT, found.entry, LAYERS) is None
    assert other.exists() and found.entry.path.is_symlink()


def test_a_save_failing_with_any_exception_leaves_no_tmp(tmp_path, monkeypatch):
    # Regression: only OSError removed the tmp file. A failure other than OSError cannot
    # be produced on demand with a real cache, so mlx-lm's save is replaced (a mock).
    import mlx_lm.models.cache as mlx_cache

    def broken(f, cache, meta):
        f.write(b"half")
        raise RuntimeError("the writer broke")

    monkeypatch.setattr(mlx_cache, "save_prompt_cache", broken)
    disk = DiskCache(tmp_path, 1 << 30)
    with pytest.raises(RuntimeError):
        disk.save(IDENT, tokens(300), kv_cache(300), trimmable=True)
    assert files(tmp_path) == []


def test_model_identity_changes_with_mlxs_version(tmp_path, monkeypatch):
    import importlib.metadata as md

    (tmp_path / "config.json").write_text("{}")
    base = model_identity(tmp_path, 8, 64)
    real = md.version
    monkeypatch.setattr(md, "version", lambda p: "0.0.1" if p == "mlx" else real(p))
    assert model_identity(tmp_path, 8, 64) != base  # the quantized KV layout is mlx's


def test_a_model_folder_reconverted_after_the_load_keeps_the_identity_taken_at_load(tmp_path):
    # Regression: the identity was computed at the first disk use, so a folder
    # re-converted in place before the first long request labelled the loaded (old)
    # model's caches with the new files' identity.
    from types import SimpleNamespace

    import mlx.nn as nn

    from kit.engine.cache.disk_tier import DiskTier

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"v": 1}')
    slot = SimpleNamespace(model=nn.Linear(4, 4), info=SimpleNamespace(path=model_dir, id="m"),
                           kv_bits=None, kv_group_size=64)
    tier = DiskTier.for_slot(tmp_path / "cache", 1 << 30, slot)
    at_load = model_identity(model_dir, None, 64)
    tier.model_installed()
    (model_dir / "config.json").write_text('{"v": 2}')  # re-converted in place
    tier.queue(tokens(300), kv_cache(300))
    tier.write_one()
    assert [p.parent.name for p in (tmp_path / "cache").glob("*/*.safetensors")] == [at_load]


def test_a_verified_file_is_not_hashed_again_until_it_changes(tmp_path, monkeypatch, caplog):
    """Review finding: every hit re-hashed the whole file (1.6 s/GB here). Now a file whose
    MAC passed is hashed again only once it changed: a byte rewritten in place with its
    mtime put back still moves its ctime, and the next hit refuses it."""
    from kit.engine.cache import cache_mac

    checks = []
    real_check = cache_mac.check
    monkeypatch.setattr(cache_mac, "check", lambda f, key: (checks.append(1),
                                                           real_check(f, key))[1])
    disk = DiskCache(tmp_path, 1 << 30)
    assert disk.save(IDENT, tokens(300), kv_cache(300, 2.0), trimmable=True)
    found = disk.find(IDENT, tokens(310), LAYERS, trimmable=True)
    assert disk.load(IDENT, found.entry, LAYERS) is not None
    assert disk.load(IDENT, found.entry, LAYERS) is not None
    assert len(checks) == 1  # the second hit trusted the unchanged file

    (path,) = (tmp_path / IDENT).glob("*.safetensors")
    st = path.stat()
    with open(path, "r+b") as f:  # a tensor byte changed, the size and mtime kept
        f.seek(st.st_size - 8)
        byte = f.read(1)
        f.seek(st.st_size - 8)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert disk.load(IDENT, found.entry, LAYERS) is None
    assert len(checks) == 2 and not path.exists()
    assert "not proven ours" in caplog.text
