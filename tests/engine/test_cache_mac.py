"""Prompt cache files proven ours (kit/engine/cache/cache_mac.py), model-free and mlx-free: the
MAC over a safetensors file's header and tensor bytes, the per-user key in the state dir,
and the StrictModes test of a cache folder (kit/engine/safe_files.not_private). Files are
written by hand in the layout mlx-lm's save_prompt_cache produces."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from kit.engine.cache import cache_mac
from kit.engine.cache.safe_files import not_private, users_own_group

KEY = bytes(range(32))
NOBODY = 65534


def write_file(path: Path, tensors: bytes = b"\x01\x02\x03\x04" * 64,
               mac: str = cache_mac.UNSEALED, extra: dict | None = None) -> Path:
    """A safetensors file as save_prompt_cache writes one: a U8 tensor and the metadata."""
    meta = {"0.format": "2", "0.mac": mac, "0.model": "ab" * 16, "0.tokens": "[1, 2, 3]",
            "1.0": "KVCache", **(extra or {})}
    header = json.dumps({"0.0": {"data_offsets": [0, len(tensors)], "dtype": "U8",
                                 "shape": [len(tensors)]}, "__metadata__": meta},
                        separators=(",", ":")).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + tensors)
    return path


def sealed(path: Path, key: bytes = KEY, **kw) -> Path:
    write_file(path, **kw)
    with open(path, "r+b") as f:
        cache_mac.seal(f, key)
    return path


def check(path: Path, key: bytes = KEY) -> None:
    with open(path, "rb") as f:
        cache_mac.check(f, key)


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_sealed_file_verifies_and_keeps_its_size_and_layout(tmp_path):
    path = sealed(tmp_path / "a.safetensors")
    check(path)
    n = struct.unpack("<Q", path.read_bytes()[:8])[0]
    meta = json.loads(path.read_bytes()[8:8 + n])["__metadata__"]
    assert len(meta["0.mac"]) == 64 and meta["0.mac"] != cache_mac.UNSEALED
    assert path.stat().st_size == write_file(tmp_path / "b").stat().st_size  # in place


@pytest.mark.parametrize("where", ["a tensor byte", "the last tensor byte", "a header byte",
                                   "a tag digit", "the length"])
def test_a_tampered_byte_anywhere_fails_the_mac(tmp_path, where):
    path = sealed(tmp_path / "a.safetensors")
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = data[8:8 + n]
    offset = {"a tensor byte": 8 + n + 10, "the last tensor byte": len(data) - 1,
              "a header byte": 8 + header.index(b"[1, 2, 3]") + 1,  # the tokens: 1 -> 0
              "a tag digit": 8 + header.index(b'"0.mac":"') + 9,
              "the length": 0}[where]
    flip(path, offset)
    with pytest.raises(ValueError):  # MacError, or no longer a safetensors header
        check(path)


def test_a_header_rewritten_to_other_tokens_fails_even_when_its_json_is_valid(tmp_path):
    # the planted-file attack on one of our own files: the same KV under a victim's tokens
    path = sealed(tmp_path / "a.safetensors")
    data = path.read_bytes()
    path.write_bytes(data.replace(b"[1, 2, 3]", b"[7, 8, 9]"))
    with pytest.raises(cache_mac.MacError, match="does not verify"):
        check(path)


def test_a_file_sealed_under_another_key_or_not_sealed_fails(tmp_path):
    with pytest.raises(cache_mac.MacError, match="does not verify"):
        check(sealed(tmp_path / "a.safetensors", key=b"k" * 32))
    with pytest.raises(cache_mac.MacError, match="does not verify"):
        check(write_file(tmp_path / "b.safetensors"))  # zeros: minted without the key
    no_tag = tmp_path / "c.safetensors"
    write_file(no_tag)
    no_tag.write_bytes(no_tag.read_bytes().replace(b'"0.mac"', b'"0.xyz"'))
    with pytest.raises(cache_mac.MacError, match="no MAC"):
        check(no_tag)


def test_a_second_tag_in_the_header_is_refused(tmp_path):
    twice = write_file(tmp_path / "a.safetensors", extra={"1.1": '"0.mac":"' + "1" * 64 + '"'})
    # a metadata value quoting a tag is escaped by JSON, so it cannot pass for one...
    with open(twice, "r+b") as f:
        cache_mac.seal(f, KEY)
    check(twice)
    # ...and raw bytes that hold two tags are refused, whichever one would verify
    quoted = b'\\"0.mac\\":\\"' + b"1" * 64 + b'\\"'
    raw = b'"0.mac":"' + b"1" * 64 + b'"'
    data = twice.read_bytes()
    assert quoted in data
    twice.write_bytes(data.replace(quoted, raw.ljust(len(quoted)), 1))
    with pytest.raises(cache_mac.MacError, match="two MACs"):
        check(twice)


def test_sealing_a_sealed_file_is_refused(tmp_path):
    path = sealed(tmp_path / "a.safetensors")
    with open(path, "r+b") as f, pytest.raises(ValueError, match="sealed already"):
        cache_mac.seal(f, KEY)


# -- the per-user key -----------------------------------------------------------------------

def test_the_key_is_made_once_0600_and_read_back_the_same(tmp_path):
    state = tmp_path / "state"
    old = os.umask(0o022)
    try:
        key = cache_mac.user_key(state)
    finally:
        os.umask(old)
    path = state / cache_mac.KEY_FILE
    assert len(key) == 32 and path.stat().st_mode & 0o777 == 0o600
    assert state.stat().st_mode & 0o777 == 0o700  # created private
    assert cache_mac.user_key(state) == key
    # no tmp left (the lock that creating the key took may stay: an empty file)
    assert {p.name for p in state.iterdir()} - {cache_mac.KEY_FILE + ".lock"} == {
        cache_mac.KEY_FILE}


@pytest.mark.parametrize("bad", ["mode 0644", "malformed", "a symlink"])
def test_a_key_file_others_could_have_read_or_chosen_is_replaced(tmp_path, bad, caplog):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path = state / cache_mac.KEY_FILE
    outside = tmp_path / "their-key"
    outside.write_text("ab" * 32 + "\n")
    if bad == "mode 0644":
        path.write_text("cd" * 32 + "\n")
        path.chmod(0o644)
    elif bad == "malformed":
        path.write_text("not a key")
        path.chmod(0o600)
    else:
        path.symlink_to(outside)
    key = cache_mac.user_key(state)
    assert key not in (bytes.fromhex("ab" * 32), bytes.fromhex("cd" * 32))
    assert not path.is_symlink() and path.stat().st_mode & 0o777 == 0o600
    assert outside.read_text() == "ab" * 32 + "\n"  # a link's target is never written
    assert "replacing the prompt cache key" in caplog.text
    assert cache_mac.user_key(state) == key


def test_two_servers_that_find_a_bad_key_at_once_settle_on_one(tmp_path, monkeypatch):
    """Review finding: both replaced the key, each with its own, so the files the first
    one sealed failed the second one's MAC and were deleted as not ours. Replacing is
    done under a lock: the second finds the first one's key good. The write is slowed so
    both have read the bad key before either writes (without the lock, they differ)."""
    import threading
    import time

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path = state / cache_mac.KEY_FILE
    path.write_text("cd" * 32 + "\n")
    path.chmod(0o644)  # bad: others could have read it
    write = cache_mac._write_key

    def slow_write(*args, **kw):
        time.sleep(0.3)
        return write(*args, **kw)

    monkeypatch.setattr(cache_mac, "_write_key", slow_write)
    keys: list[bytes] = []
    start = threading.Barrier(2)

    def server() -> None:
        start.wait()
        keys.append(cache_mac.user_key(state))

    threads = [threading.Thread(target=server) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(keys) == 2 and keys[0] == keys[1] == cache_mac.user_key(state)
    assert keys[0] != bytes.fromhex("cd" * 32)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's needs root")
def test_a_key_file_of_another_user_is_replaced(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    path = state / cache_mac.KEY_FILE
    path.write_text("ab" * 32 + "\n")
    path.chmod(0o600)
    os.chown(path, NOBODY, NOBODY)
    assert cache_mac.user_key(state) != bytes.fromhex("ab" * 32)
    assert path.stat().st_uid == os.geteuid()


def test_a_key_folder_others_can_write_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    with pytest.raises(OSError, match="not private.*writable by (group and )?others"):
        cache_mac.user_key(state)
    assert not (state / cache_mac.KEY_FILE).exists()


# -- StrictModes for a cache folder ---------------------------------------------------------

def test_a_private_folder_or_one_still_to_make_passes(tmp_path):
    mine = tmp_path / "cache"
    mine.mkdir(mode=0o700)
    assert not_private(mine) is None
    assert not_private(mine / "not-yet" / "made") is None
    mine.chmod(0o755)  # readable is fine: others cannot plant a file
    assert not_private(mine) is None


def shared_group(path: Path) -> None:
    """Give ``path`` a group other users are in (nogroup, as root), or skip."""
    if os.geteuid() == 0:
        os.chown(path, -1, NOBODY)
    elif users_own_group(path.stat().st_gid):
        pytest.skip("only root can give a folder a group shared with others")


@pytest.mark.parametrize("mode,who", [(0o770, "its group"), (0o707, "others"),
                                      (0o777, "group and others"), (0o1777, "group and others")])
def test_a_folder_others_can_write_is_refused_even_sticky(tmp_path, mode, who):
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(mode)
    if mode & 0o020:
        shared_group(folder)
    assert not_private(folder) == f"{folder} is writable by {who} (mode {mode:04o})"


def test_group_write_is_harmless_when_the_group_is_the_users_own(tmp_path):
    # umask 002 with user-private groups (Debian, Ubuntu): as Debian's ssh allows it
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(0o770)
    if not users_own_group(folder.stat().st_gid):
        pytest.skip("this user's group is shared with others")
    assert not_private(folder) is None
    folder.chmod(0o775)
    assert not_private(folder) is None


def test_a_folder_under_a_writable_parent_is_refused_unless_the_parent_is_sticky(tmp_path):
    parent = tmp_path / "shared"
    parent.mkdir()
    (parent / "cache").mkdir(mode=0o700)
    parent.chmod(0o777)  # anyone may rename our folder away and put theirs in its place
    assert re.search("shared is writable by (group and )?others", not_private(parent / "cache"))
    parent.chmod(0o1777)  # as /tmp: nobody else may rename or delete what is ours
    assert not_private(parent / "cache") is None


def test_a_symlink_to_a_shared_folder_is_judged_by_its_target(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (tmp_path / "link").symlink_to(shared)
    assert "shared is writable" in not_private(tmp_path / "link")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="another user's folder needs root (and setpriv)")
def test_a_folder_another_user_made_is_refused(sticky_box):
    # made by the other user themselves, as `nobody`, where they may write (as in /tmp)
    subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY),
                    "--clear-groups", "mkdir", "-m", "0700", str(sticky_box / "cache")],
                   check=True)
    theirs = sticky_box / "cache"
    assert theirs.stat().st_uid == NOBODY
    assert not_private(theirs) == f"{theirs} belongs to another user (uid {NOBODY})"
    assert not_private(theirs / "sub") == f"{theirs} belongs to another user (uid {NOBODY})"
