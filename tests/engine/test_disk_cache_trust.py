"""The prompt cache's disk tier uses only files proven this user's (kit/engine/cache/disk_cache.py
with kit/engine/cache/cache_mac.py): a file minted without the key, sealed under another key or
altered by one byte is a miss; another user's file is never read, evicted or deleted; a
folder others can write is not used at all. Real mlx-lm caches, no model."""

from __future__ import annotations

import hashlib
import json
import os
import struct

import numpy as np
import pytest

pytest.importorskip("mlx.core")

from kit.engine.cache import cache_mac  # noqa: E402
from kit.engine.cache.disk_cache import DiskCache  # noqa: E402
from tests.engine.test_disk_cache import (  # noqa: E402,F401 (user_state: autouse)
    IDENT, LAYERS, kv_cache, mint, tokens, user_state)

NOBODY = 65534


def name_of(toks: list[int]) -> str:
    return hashlib.sha256(np.asarray(toks, dtype=np.int32).tobytes()).hexdigest() + \
        ".safetensors"


def stored(tmp_path):
    """A cache folder holding one file the disk tier wrote (300 tokens): its path."""
    DiskCache(tmp_path, 1 << 30).save(IDENT, tokens(300), kv_cache(300), trimmable=True)
    (path,) = (tmp_path / IDENT).glob("*.safetensors")
    return path


def loads(tmp_path, prompt: list[int]):
    """What a fresh DiskCache on the folder loads for ``prompt`` (None: a miss)."""
    disk = DiskCache(tmp_path, 1 << 30)
    found = disk.find(IDENT, prompt, LAYERS, True)
    return found and disk.load(IDENT, found.entry, LAYERS)


@pytest.mark.parametrize("key", [None, b"another user's key".ljust(32)],
                         ids=["minted without the key", "sealed under another key"])
def test_a_file_not_sealed_under_the_users_key_is_a_logged_miss(tmp_path, caplog, key):
    (tmp_path / IDENT).mkdir(mode=0o700)
    path = tmp_path / IDENT / name_of(tokens(300))
    mint(path, kv_cache(300, 5.0), tokens(300), key)
    assert loads(tmp_path, tokens(310)) is None
    assert "not proven ours: its MAC does not verify" in caplog.text
    assert not path.exists()  # this user's file (its owner), so it goes like any bad file


@pytest.mark.parametrize("where", ["header", "tensors"])
def test_a_tampered_byte_is_a_miss(tmp_path, caplog, where):
    path = stored(tmp_path)
    data = bytearray(path.read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    if where == "header":  # a dtype or shape digit, say: still a header that parses
        at = data.index(b'"shape":[1,1,', 8) + len('"shape":[1,1,')
        data[at] = ord("3") if data[at] != ord("3") else ord("4")
    else:
        data[8 + n + 1000] ^= 0x40
    path.write_bytes(bytes(data))
    assert loads(tmp_path, tokens(300)) is None
    assert "not proven ours: its MAC does not verify" in caplog.text and not path.exists()


def test_a_sealed_file_relabelled_with_a_victims_tokens_is_a_miss(tmp_path, caplog):
    # the planted-file attack, with one of our own files: its KV under other tokens
    path = stored(tmp_path)
    victim = tokens(300, 7000)
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = data[8:8 + n].replace(json.dumps(tokens(300)).encode(),
                                   json.dumps(victim).encode())
    assert header != data[8:8 + n]
    (path.parent / name_of(victim)).write_bytes(struct.pack("<Q", len(header)) + header
                                                + data[8 + n:])
    path.unlink()
    assert loads(tmp_path, victim + [1, 2]) is None
    assert "its MAC does not verify" in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's needs root")
def test_another_users_file_is_never_loaded_evicted_or_deleted(tmp_path, caplog):
    path = stored(tmp_path)
    os.chown(path, NOBODY, NOBODY)
    size = path.stat().st_size
    dead = path.parent / f"{'a' * 64}.999999999.tmp"  # a dead writer's name, theirs
    dead.write_bytes(b"theirs")
    os.chown(dead, NOBODY, NOBODY)
    disk = DiskCache(tmp_path, 1)  # a bound nothing fits: eviction would run on it
    assert dead.exists()
    assert disk.find(IDENT, tokens(300), LAYERS, True) is None
    assert disk.find(IDENT, tokens(300), LAYERS, True) is None
    disk.evict()
    assert (disk.bytes, disk.entries) == (0, 0)  # not counted as ours either
    assert path.exists() and path.stat().st_size == size
    assert caplog.text.count("refusing prompt cache file") == 1  # once, not every request
    assert f"another user's (uid {NOBODY}" in caplog.text


def test_a_file_others_can_write_is_not_loaded(tmp_path, caplog):
    path = stored(tmp_path)
    path.chmod(0o666)  # what is checked might not be what loads
    assert loads(tmp_path, tokens(300)) is None
    assert "writable by others" in caplog.text and path.exists()


def test_a_cache_folder_others_can_write_is_not_used(tmp_path, caplog):
    stored(tmp_path)
    tmp_path.chmod(0o777)
    disk = DiskCache(tmp_path, 1 << 30)
    assert disk.key is None and "disk tier is off" in caplog.text
    assert disk.find(IDENT, tokens(300), LAYERS, True) is None
    assert not disk.save(IDENT, tokens(400), kv_cache(400), trimmable=True)
    assert len(list((tmp_path / IDENT).iterdir())) == 1


def test_a_key_the_state_dir_cannot_hold_turns_the_tier_off(tmp_path, caplog, user_state):
    user_state.chmod(0o777)
    disk = DiskCache(tmp_path, 1 << 30)
    assert disk.key is None and "key's folder is not private" in caplog.text
    assert not disk.save(IDENT, tokens(300), kv_cache(300), trimmable=True)


def test_the_users_key_is_what_a_second_server_proves_files_with(tmp_path, user_state):
    path = stored(tmp_path)
    key = (user_state / "mlx-kit" / cache_mac.KEY_FILE).read_text().strip()
    with open(path, "rb") as f:
        cache_mac.check(f, bytes.fromhex(key))
    assert loads(tmp_path, tokens(300)) is not None
